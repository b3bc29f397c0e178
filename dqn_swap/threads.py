"""Process-wide hooks that act for one thread.

``torch.nn.modules.module.register_module_forward_pre_hook`` (and ``ModuleTracker``, built on
it) fires for every module call in every thread.  The runtime numbers a step's ops from its
module calls and the recorder marks them; a module called on another thread meanwhile (the
planner's own network, planning on a worker thread: ``autoplan(..., planning="background")``)
would be counted into the step.  :class:`ThreadHook` wraps such a hook so that it acts for the
thread that registered it, and :func:`module_call_hooks` registers one.

Removing a hook does not end a module call under way on another thread: torch takes the list of
global hooks when a call begins, so the worker's call keeps the removed hook alive until it
returns.  A hook that holds a step's state (the runtime's iteration, with the step's inputs) would
then be freed on the worker: later than on the training thread, and out of sight of the CPU's
allocator timeline, which sees the training thread's frees only (:mod:`dqn_swap.meter`).  So a
removed hook lets go of what it wraps at once, on the thread that removes it
(:meth:`ThreadHook.release`): the worker's copy is an empty shell.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

__all__ = ["ThreadHook", "module_call_hooks"]


class ThreadHook:
    """``hook``, called only from the thread that made this wrapper (elsewhere: nothing, None),
    until :meth:`release`."""

    __slots__ = ("_hook", "_owner", "__wrapped__")

    def __init__(self, hook: Callable[..., Any]) -> None:
        self._hook: Callable[..., Any] | None = hook
        self._owner = threading.get_ident()
        self.__wrapped__ = None  # (no strong reference besides _hook: release drops it)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hook = self._hook
        if hook is None or threading.get_ident() != self._owner:
            return None
        return hook(*args, **kwargs)

    def release(self) -> None:
        """Let go of the wrapped hook, and of all it holds, now."""
        self._hook = None


class _Registered:
    """The handles of one :class:`ThreadHook` registered as global module hooks."""

    def __init__(self, hook: ThreadHook, handles: list[Any]) -> None:
        self.hook, self.handles = hook, handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.hook.release()  # a call under way on another thread keeps the shell only (module docstring)

    close = remove  # (for contextlib.closing)


def module_call_hooks(hook: Callable[..., Any], *, pre: bool = True, post: bool = False) -> _Registered:
    """Register ``hook`` (for this thread only) as a global module forward pre-hook, and with
    ``post`` as a forward hook too; ``remove()`` (or ``close()``) on the result takes it out and
    drops ``hook``."""
    mod = torch.nn.modules.module
    guarded = ThreadHook(hook)
    handles = []
    if pre:
        handles.append(mod.register_module_forward_pre_hook(guarded))
    if post:
        handles.append(mod.register_module_forward_hook(guarded))
    return _Registered(guarded, handles)
