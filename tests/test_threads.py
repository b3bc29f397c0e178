"""Process-wide module hooks that act for one thread (``dqn_swap.threads``), and what the CPU's
allocator timeline cannot see on other threads (``dqn_swap.meter``)."""

from __future__ import annotations

import gc
import threading
import weakref

import torch

from dqn_swap.meter import AllocatorTimeline
from dqn_swap.threads import module_call_hooks


class _Blocking(torch.nn.Module):
    """A module whose forward waits until it is let go: a module call under way on a worker."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        assert self.go.wait(30)
        return x + 1


class _State:
    """What a hook may hold: a step's state, with its tensors."""

    def __init__(self) -> None:
        self.tensor = torch.empty(25_000)
        self.calls: list[str] = []

    def call(self, module: torch.nn.Module, args: tuple, *output: object) -> None:
        self.calls.append(threading.current_thread().name)


def test_a_removed_hook_lets_go_of_its_state_on_the_thread_that_removes_it() -> None:
    """A module call under way on another thread took the global hooks when it began.  Removing
    the hook drops what it held at once, here, and the worker's call never runs it: the step's
    tensors are freed on the training thread (where the allocator timeline sees the free), not
    when the worker's call returns."""
    state = _State()
    hooks = module_call_hooks(state.call, post=True)
    torch.nn.Linear(2, 2)(torch.zeros(1, 2))  # on this thread: the hook runs
    assert state.calls == ["MainThread", "MainThread"]
    freed_on: list[str] = []
    weakref.finalize(state, lambda: freed_on.append(threading.current_thread().name))
    module = _Blocking()
    worker = threading.Thread(target=module, args=(torch.zeros(1),), name="worker")
    worker.start()
    try:
        assert module.entered.wait(30)  # the worker's call has taken the hooks (one ran, for nothing)
        calls = state.calls
        hooks.remove()
        del state
        assert freed_on == ["MainThread"]  # not kept until the worker's call returns
    finally:
        module.go.set()
        worker.join(30)
    assert calls == ["MainThread", "MainThread"]  # the worker's calls ran no hook


def test_a_collection_on_another_thread_is_counted_as_unseen_frees() -> None:
    """The profiler reports the opening thread's frees only: a tensor in a reference cycle that a
    collection on another thread frees stays counted, and the timeline says so."""

    class Cycle:
        pass

    gc.collect()
    with AllocatorTimeline(own_blocks=True) as timeline:
        c = Cycle()
        c.self, c.tensor = c, torch.empty(250_000)  # 1 MB in a cycle
        del c
        worker = threading.Thread(target=gc.collect)
        worker.start()
        worker.join(30)
    assert timeline.foreign_collections >= 1
    assert timeline.curve()[1].tolist()[-1] == 1_000_000  # the free was not seen

    gc.collect()
    with AllocatorTimeline(own_blocks=True) as here:
        c = Cycle()
        c.self, c.tensor = c, torch.empty(250_000)
        del c
        gc.collect()
    assert here.foreign_collections == 0
    assert here.curve()[1].tolist()[-1] == 0
