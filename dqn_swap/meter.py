"""Measure memory exactly on the CPU: the allocator's own timeline.

The CPU has no caching allocator to ask for a peak, but ``torch.profiler``
with ``profile_memory=True`` logs every allocation and free of PyTorch's CPU
allocator (``[memory]`` events, with their size and time).  Summed in time
order they give the bytes allocated at every instant of a region of code,
exactly: the CPU allocator hands out what was asked for, no rounding, no
cache.  :class:`AllocatorTimeline` collects them; ``peak`` is the most bytes
allocated above the region's start.

Markers (:meth:`AllocatorTimeline.mark`) name sub-regions, such as one op of
an iteration, so the recorder can attribute to every op the scratch memory
its kernel allocated and freed within it.

Blocks allocated before the region and freed inside it are not reported by
the profiler (it does not know their size); measure a steady-state iteration,
whose frees concern blocks of the same iteration, or account for them apart.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

_MARK = "dqn_swap:"


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence what the profiler's native code prints on stderr (start/stop notices)."""
    fd = 2  # the process's stderr, where native code writes (whatever sys.stderr is now)
    try:
        sys.stderr.flush()
        saved = os.dup(fd)
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@dataclass(frozen=True)
class Window:
    """The allocations inside one marked sub-region: peak above its start, and net change."""

    peak: int
    net: int


class AllocatorTimeline:
    """The CPU allocator's allocations and frees over a ``with`` block (bytes, in time order).

    Usage::

        with AllocatorTimeline() as timeline:
            train_one_iteration()
        timeline.peak        # most bytes allocated at once above the start of the block
        timeline.curve()     # (times in ns, bytes above the start) after every event
    """

    def __init__(self) -> None:
        self._prof: torch.profiler.profile | None = None
        self.times = np.zeros(0, dtype=np.int64)
        self.deltas = np.zeros(0, dtype=np.int64)
        self.marks: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> "AllocatorTimeline":
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        older = torch.empty(1)
        with _quiet_native_stderr():
            self._prof.__enter__()
            # Freeing a block allocated before profiling makes the allocator warn, once per process,
            # that the profiler cannot report it: let that happen here, silently, not in the user's code.
            del older
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._prof is not None
        with _quiet_native_stderr():
            self._prof.__exit__(None, None, None)
        events = self._prof.profiler.kineto_results.events()
        mem: list[tuple[int, int]] = []
        for e in events:
            name = e.name()
            if name == "[memory]":
                if e.device_type() == torch.autograd.DeviceType.CPU:
                    mem.append((e.start_ns(), e.nbytes()))
            elif name.startswith(_MARK):
                self.marks[name[len(_MARK):]] = (e.start_ns(), e.end_ns())
        mem.sort(key=lambda x: x[0])  # stable: events at one instant keep their order
        self.times = np.array([t for t, _ in mem], dtype=np.int64)
        self.deltas = np.array([b for _, b in mem], dtype=np.int64)
        self._prof = None

    @staticmethod
    def mark(name: str) -> contextlib.AbstractContextManager[object]:
        """A named sub-region (see :meth:`window`); costs no allocation."""
        return torch.profiler.record_function(_MARK + name)

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """Times (ns) and bytes allocated above the start of the block, after every event."""
        return self.times, np.cumsum(self.deltas)

    @property
    def peak(self) -> int:
        """Most bytes allocated at once above the start of the block (0 if it never grew)."""
        return int(max(0, np.cumsum(self.deltas).max())) if len(self.deltas) else 0

    @property
    def net(self) -> int:
        """Bytes allocated at the end of the block minus at its start (frees of older blocks excepted)."""
        return int(self.deltas.sum())

    def window(self, name: str) -> Window:
        """Peak above the start of marked region ``name`` and its net change, from its own events."""
        start, end = self.marks[name]
        lo = int(np.searchsorted(self.times, start, side="left"))
        hi = int(np.searchsorted(self.times, end, side="right"))
        inside = np.cumsum(self.deltas[lo:hi])
        if not len(inside):
            return Window(0, 0)
        return Window(int(max(0, inside.max())), int(inside[-1]))


def live_bytes(tensors: object) -> int:
    """Bytes of the distinct storages among ``tensors`` (nested lists, dicts, modules' state)."""
    seen: dict[int, int] = {}

    def visit(x: object) -> None:
        if isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            seen[st._cdata] = st.nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                visit(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v)

    visit(tensors)
    return sum(seen.values())


def gradient_bytes(model: torch.nn.Module, device_type: str) -> int:
    """Bytes of the gradients ``model``'s parameters hold on devices of ``device_type`` (each storage
    once): what the allocator holds for them between iterations."""
    storages = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
                for g in (p.grad for p in model.parameters()) if g is not None and g.device.type == device_type}
    return sum(storages.values())


@contextlib.contextmanager
def collector_still() -> Iterator[None]:
    """Collect garbage, then keep the collector still inside the block (as it was after).

    A measured iteration runs inside it: a collection of reference cycles left by earlier work
    runs once enough Python objects were made, so it would free their tensors inside one
    iteration or another depending on what ran before."""
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


__all__ = ["AllocatorTimeline", "Window", "collector_still", "gradient_bytes", "live_bytes"]
