"""Process-wide hooks that act for one thread.

``torch.nn.modules.module.register_module_forward_pre_hook`` (and ``ModuleTracker``, built on
it) fires for every module call in every thread.  The runtime numbers a step's ops from its
module calls and the recorder marks them; a module called on another thread meanwhile (the
planner's own network, planning on a worker thread: ``autoplan(..., planning="background")``)
would be counted into the step.  :func:`this_thread_only` wraps such a hook so that it acts for
the thread that registered it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

__all__ = ["this_thread_only"]


def this_thread_only(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook``, called only from the thread that made this wrapper (elsewhere: nothing, None)."""
    owner = threading.get_ident()

    @functools.wraps(hook)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return None
        return hook(*args, **kwargs)

    return guarded
