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

Timelines nest.  The profiler runs one session at a time, so a timeline opened
inside another (autoplan measures its recording step with one, inside a
benchmark that measures the whole run) pauses the outer one: the outer's
session ends and its events so far are kept, the inner runs its own session,
and when the inner closes, its events (and marks) are handed to the outer,
which starts a new session.  The outer's timeline is the whole region's,
without a gap: the allocator keeps every block's size across sessions, so a
block allocated in one session and freed in a later one is reported there.
A profiler range (``record_function``, which ``Optimizer.step`` opens) must
not span such a switch of sessions: PyTorch then corrupts its heap (seen as
a crash of the garbage collector later).  Close a nested timeline outside
every range (:attr:`AllocatorTimeline.nested` says when it is nested).  An
outer timeline that closes first ends the ones still open inside it: their
events stop there.

The profiler sees the thread that opened the timeline only: an allocation or a
free on another thread is not in it.  A planner working on a thread of its own
allocates host memory, which is meant to be left out.  A free is another
matter: Python's garbage collector runs on whichever thread happens to
allocate, so a collection on a worker thread frees the training thread's
garbage (a tensor in a reference cycle) where the timeline cannot see it, and
those bytes stay counted.  :attr:`AllocatorTimeline.foreign_collections`
counts the collections on other threads that freed objects while the timeline
was open; a measurement with any is an upper bound, not exact.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import gc
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_MARK = "dqn_swap:"
_Allocation = torch._C._profiler._ExtraFields_Allocation
_ASIDE = itertools.count()


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

    #: The timelines open now, outermost first (module docstring: an inner one pauses the outer).
    _open: list["AllocatorTimeline"] = []
    #: Finished profiler sessions of nested timelines, kept until no session runs: freeing one's
    #: results while another session records corrupts the heap (seen as a crash in the collector).
    _retired: list[Any] = []

    def __init__(self, own_blocks: bool = False, also_own: "set[int] | frozenset[int]" = frozenset()) -> None:
        """``own_blocks``: count only blocks allocated inside the block.  The allocator reports the
        free of a block allocated in an earlier profiler session (another timeline's, or before a
        nested one): by default it counts, as bytes going below the start; with ``own_blocks`` it is
        left out, so that the curve holds exactly the bytes allocated inside and still alive (what
        a run measured from before its model is built needs, in a process that ran others).

        ``also_own`` (with ``own_blocks``): addresses of earlier blocks whose frees count too, such
        as :attr:`alive_blocks` of the timeline of the iteration before (a steady-state iteration
        frees what the one before left, and nothing some other code allocated)."""
        self.own_blocks = own_blocks
        self.also_own = frozenset(also_own)
        #: With ``own_blocks``: addresses of the owned blocks still allocated at the end.
        self.alive_blocks: frozenset[int] = frozenset()
        self._prof: torch.profiler.profile | None = None
        self._mem: list[tuple[int, int, int, int]] = []  # (time, event id, bytes, address) of every allocation and free
        self.times = np.zeros(0, dtype=np.int64)
        self.deltas = np.zeros(0, dtype=np.int64)
        self.marks: dict[str, tuple[int, int]] = {}
        self.nested = False  # opened inside another timeline (module docstring)
        self._ended = False
        #: Garbage collections run on another thread that freed objects while this timeline was
        #: open (module docstring): frees the profiler did not report to it.
        self.foreign_collections = 0
        self._owner = 0

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks`` hook: count a collection on another thread that freed something."""
        if phase == "stop" and info.get("collected", 0) and threading.get_ident() != self._owner:
            self.foreign_collections += 1

    def _start(self) -> None:
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        older = torch.empty(1)
        with _quiet_native_stderr():
            self._prof.__enter__()
            # Freeing a block allocated before profiling makes the allocator warn, once per process,
            # that the profiler cannot report it: let that happen here, silently, not in the user's code.
            del older

    def _stop(self) -> None:
        """End the profiler's session and keep its events."""
        assert self._prof is not None
        with _quiet_native_stderr():
            self._prof.__exit__(None, None, None)
        results = self._prof.profiler.kineto_results
        for e in results.events():
            name = e.name()
            if name.startswith(_MARK):
                self.marks[name[len(_MARK):]] = (e.start_ns(), e.end_ns())
        stack = list(results.experimental_event_tree())
        while stack:
            e = stack.pop()
            stack.extend(e.children)
            f = e.extra_fields
            if isinstance(f, _Allocation) and f.device.type == "cpu":
                self._mem.append((e.start_time_ns, e.id, int(f.alloc_size), int(f.ptr)))
        self._retired.append(self._prof)
        self._prof = None

    def __enter__(self) -> "AllocatorTimeline":
        self.nested = bool(self._open)
        self._ended = False
        if self._open:
            self._open[-1]._stop()  # one profiler session at a time: the outer pauses
        self._open.append(self)
        self._mem = []
        self._owner = threading.get_ident()
        gc.callbacks.append(self._on_collection)
        self._start()
        return self

    def _end(self) -> list[tuple[int, int]]:
        """Stop recording for good: timelines opened inside this one and still open end first (their
        events are this one's too; their own ``__exit__`` later only reads what they have)."""
        while self._open[-1] is not self:
            self._open[-1]._end()
        if self._prof is not None:  # (paused while one inside it ran)
            self._stop()
        self._open.pop()
        self._ended = True
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_collection)
        mem = sorted(self._mem)  # in time, and in the profiler's order at one instant
        kept = mem
        if self.own_blocks:
            aside = sorted(v[0] for k, v in self.marks.items() if k.startswith("aside<"))
            ends = sorted(v[0] for k, v in self.marks.items() if k.startswith("aside>"))
            mine: set[int] = set(self.also_own)
            kept = []
            for t, i, b, ptr in mem:
                k = bisect.bisect_right(aside, t)
                if b > 0 and k and (k > len(ends) or ends[k - 1] > t):
                    continue  # host memory beside the device (AllocatorTimeline.aside)
                if b > 0:
                    mine.add(ptr)
                elif ptr not in mine:
                    continue  # allocated before this timeline
                else:
                    mine.discard(ptr)
                kept.append((t, i, b, ptr))
            self.alive_blocks = frozenset(mine)
        self.times = np.array([x[0] for x in kept], dtype=np.int64)
        self.deltas = np.array([x[2] for x in kept], dtype=np.int64)
        if self._open:  # the outer one gets this one's events
            outer = self._open[-1]
            outer._mem.extend(mem)
            outer.marks.update(self.marks)
        return mem

    def __exit__(self, *exc: object) -> None:
        if self._ended:  # ended with the timeline it was opened in
            return
        assert self in self._open, "an allocator timeline closed twice"
        self._end()
        if self._open:
            self._open[-1]._start()  # the outer goes on
        else:
            self._retired.clear()  # no session runs now

    @property
    def ended(self) -> bool:
        """Whether it stopped recording: closed, or ended by the timeline it was opened in."""
        return self._ended

    @staticmethod
    def mark(name: str) -> contextlib.AbstractContextManager[object]:
        """A named sub-region (see :meth:`window`); costs no allocation.  It must begin and end
        in one profiler session: not around a nested timeline (use :meth:`instant` there)."""
        return torch.profiler.record_function(_MARK + name)

    @staticmethod
    @contextlib.contextmanager
    def aside() -> Iterator[None]:
        """Allocations inside are host memory beside the measured device (a planner running on the
        host while the model trains on the cpu): a timeline with ``own_blocks`` leaves them out,
        with their frees.  The windows must not overlap."""
        if not AllocatorTimeline._open:
            yield
            return
        n = next(_ASIDE)
        AllocatorTimeline.instant(f"aside<{n}")
        try:
            yield
        finally:
            AllocatorTimeline.instant(f"aside>{n}")

    @staticmethod
    def instant(name: str) -> None:
        """A named instant (``marks[name]``, start and end equal up to the call's cost): two of them
        bound a region that may hold nested timelines, whose sessions a range cannot span."""
        with torch.profiler.record_function(_MARK + name):
            pass

    def between(self, start: str, end: str) -> tuple[int, int]:
        """(bytes above the block's start at instant ``start``, most bytes above it up to ``end``)."""
        times, curve = self.curve()
        lo = int(np.searchsorted(times, self.marks[start][1], side="right"))
        hi = int(np.searchsorted(times, self.marks[end][0], side="left"))
        before = int(curve[lo - 1]) if lo > 0 else 0
        return before, max(before, int(curve[lo:hi].max()) if hi > lo else before)

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
