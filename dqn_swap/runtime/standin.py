"""A stand-in device: the CPU with copies that finish late, and a checker of their use.

:class:`StandInBackend` implements :class:`~dqn_swap.runtime.backend.Backend`
on the CPU the way CUDA behaves, so that the runtime's asynchronous code path
(side streams, events, copies in flight, pooled host buffers) runs and is
checked on any machine:

* the *compute stream* is the host thread: an op runs when it is called, and
  making the compute stream wait for an event blocks the host until it has
  completed (on a GPU the kernels would wait instead; the ordering is the same);
* every side stream is a worker thread that runs its queue in order; a copy
  sleeps an injected delay (fixed, or drawn from a seeded generator), or waits
  at a :class:`Gate` until the test opens it, and then copies; an event
  completes when the worker reaches it;
* a queued copy holds only *weak* references to its tensors, as a CUDA kernel
  holds none: if the runtime lets one be freed before the copy ran, the copy
  finds it gone.

The checker, in the manner of PyTorch's CUDA sanitizer
(``TORCH_CUDA_SANITIZER``), records a violation when

1. an op on the compute stream reads or writes a storage that a pending copy
   writes, or writes a storage that a pending copy reads (a missing wait);
2. a copy runs while an unfinished copy on another stream, queued before it,
   writes what it touches or reads what it writes (a buffer reused before the
   event of the copy that uses it);
3. a copy runs after one of its tensors was freed (device memory released
   before the copy that reads or writes it completed).

Storages are identified by their address, so a block freed and handed to
another tensor while a copy of the old one is pending is caught as well.
``violations`` lists what was found; tests assert it stays empty under random
delays, and that a deliberately broken use is caught.
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .backend import DONE, Event, host_buffer


class StandInEvent:
    """Completes when the worker of its stream reaches it."""

    __slots__ = ("_flag",)

    def __init__(self) -> None:
        self._flag = threading.Event()

    def query(self) -> bool:
        return self._flag.is_set()

    def synchronize(self) -> None:
        self._flag.wait()

    def set(self) -> None:
        self._flag.set()


class StandInStream:
    """A side stream: a daemon worker thread running its queue in order."""

    _names = itertools.count()

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.name = f"side-stream-{next(self._names)}"
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._queue.put(job)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job()

    def close(self) -> None:
        self._queue.put(None)


COMPUTE = "compute"  # the compute stream: the host thread itself


@dataclass
class _Copy:
    id: int
    stream: StandInStream
    dst_ptr: int
    src_ptr: int
    nbytes: int


class Gate:
    """Holds the copies of chosen side streams until the test opens it.

    A delay in seconds makes a copy late only if the host is quicker than the
    delay, which a loaded machine is not; a gate makes "this copy has not run
    yet" hold for as long as the test needs, whatever the load.  ``timeout``
    bounds the wait, so that a runtime that waits for a held copy is slow
    (and the test's assertions fail) instead of hanging.

    Args:
        streams: indices of the side streams held (``stream.index``: 0 for the
            first side stream made, ...).
        timeout: seconds a held copy waits at most.
    """

    def __init__(self, streams: tuple[int, ...] = (1,), timeout: float = 30.0) -> None:
        self.streams = frozenset(streams)
        self.timeout = timeout
        self._open = threading.Event()

    def open(self) -> None:
        """Let every held copy, and every later one, run."""
        self._open.set()

    def is_open(self) -> bool:
        return self._open.is_set()

    def wait(self, stream: StandInStream) -> None:
        if stream.index in self.streams:
            self._open.wait(self.timeout)


class StandInBackend:
    """The CPU as an asynchronous device (module docstring); ``violations`` holds what the checker found.

    Args:
        delay: seconds every copy sleeps before it runs; ``(low, high)`` for a
            uniform draw per copy from a generator seeded with ``seed``; or a
            function of the stream (``stream.index``: 0 for the first side
            stream made, ...) returning seconds.
        seed: seed of the delays.
        gate: a :class:`Gate` that copies of the streams it names wait at (on
            their worker, after the delay) before they run.
    """

    asynchronous = True

    def __init__(self, delay: float | tuple[float, float] | Callable[[StandInStream], float] = 0.002,
                 seed: int = 0, gate: Gate | None = None) -> None:
        self.device = torch.device("cpu")
        self._delay = delay
        self.gate = gate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, _Copy] = {}  # copies queued and not yet completed, by id
        self._streams: list[StandInStream] = []
        self.violations: list[str] = []
        self.copies = 0
        self.max_in_flight = 0  # most copies queued and not yet completed at once
        self.max_in_flight_bytes = 0

    # ------------------------------------------------------------------ Backend
    def compute_stream(self) -> str:
        return COMPUTE

    def new_stream(self) -> StandInStream:
        stream = StandInStream(len(self._streams))
        self._streams.append(stream)
        return stream

    def record_event(self, stream: Any) -> Event:
        if stream == COMPUTE:
            return DONE  # the host has run everything it queued on the compute stream
        event = StandInEvent()
        stream.submit(event.set)
        return event

    def wait_event(self, stream: Any, event: Event) -> None:
        if stream == COMPUTE:
            event.synchronize()  # later ops on the host come after the event, as kernels would
        else:
            stream.submit(event.synchronize)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return host_buffer(nbytes, torch.device("cpu"))

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> Event:
        if stream == COMPUTE:
            self._check_compute("a copy on the compute stream", (dst, src), written=(dst,))
            dst.copy_(src)
            return DONE
        dst_st, src_st = dst.untyped_storage(), src.untyped_storage()
        geometry = (dst.dtype, dst.size(), dst.stride(), dst.storage_offset(),
                    src.dtype, src.size(), src.stride(), src.storage_offset())
        refs = (dst_st._weak_ref(), src_st._weak_ref())
        delay = self._draw_delay(stream)
        event = StandInEvent()
        with self._lock:
            c = _Copy(next(self._ids), stream, dst_st.data_ptr(), src_st.data_ptr(), dst_st.nbytes())
            self._pending[c.id] = c
            self.copies += 1
            self.max_in_flight = max(self.max_in_flight, len(self._pending))
            inflight = sum(p.nbytes for p in self._pending.values())
            self.max_in_flight_bytes = max(self.max_in_flight_bytes, inflight)

        def job() -> None:
            if delay > 0:
                time.sleep(delay)
            if self.gate is not None:
                self.gate.wait(stream)
            try:
                dst_now = torch.UntypedStorage._new_with_weak_ptr(refs[0])
                src_now = torch.UntypedStorage._new_with_weak_ptr(refs[1])
                if dst_now is None or src_now is None:
                    which = "destination" if dst_now is None else "source"
                    self._violation(f"copy #{c.id} on {stream.name}: its {which} was freed before the copy ran")
                else:
                    self._check_copy(c)
                    d = torch.empty(0, dtype=geometry[0]).set_(dst_now, geometry[3], geometry[1], geometry[2])
                    s = torch.empty(0, dtype=geometry[4]).set_(src_now, geometry[7], geometry[5], geometry[6])
                    d.copy_(s)
                    del d, s, dst_now, src_now
            finally:
                for ref in refs:
                    torch.UntypedStorage._free_weak_ref(ref)
                with self._lock:
                    self._pending.pop(c.id, None)
                event.set()

        stream.submit(job)
        return event

    def memory_allocated(self) -> int | None:
        return None

    # ------------------------------------------------------------------ checker
    def _draw_delay(self, stream: StandInStream) -> float:
        if isinstance(self._delay, tuple):
            with self._lock:
                return self._rng.uniform(*self._delay)
        if callable(self._delay):
            return float(self._delay(stream))
        return float(self._delay)

    def _violation(self, message: str) -> None:
        with self._lock:
            self.violations.append(message)

    def _check_copy(self, c: _Copy) -> None:
        """Rule 2: no earlier unfinished copy on another stream conflicts with ``c``."""
        with self._lock:
            others = [o for o in self._pending.values() if o.id < c.id and o.stream is not c.stream]
        for o in others:
            if o.dst_ptr in (c.dst_ptr, c.src_ptr) or o.src_ptr == c.dst_ptr:
                self._violation(f"copy #{c.id} on {c.stream.name} ran while copy #{o.id} on {o.stream.name}, "
                                "queued before it, had not finished with the same buffer")

    def _check_compute(self, what: str, touched: tuple[torch.Tensor, ...],
                       written: tuple[torch.Tensor, ...] = ()) -> None:
        """Rule 1: an op on the compute stream against the copies pending now."""
        with self._lock:
            if not self._pending:
                return
            writing = {c.dst_ptr: c for c in self._pending.values()}
            reading = {c.src_ptr: c for c in self._pending.values()}
        for t in touched:
            c = writing.get(t.untyped_storage().data_ptr())
            if c is not None:
                self._violation(f"{what} used a storage while copy #{c.id} on {c.stream.name} was still writing it")
        for t in written:
            c = reading.get(t.untyped_storage().data_ptr())
            if c is not None:
                self._violation(f"{what} wrote a storage while copy #{c.id} on {c.stream.name} was still reading it")

    def checking(self) -> "_Checker":
        """A context in which every op on the host (the compute stream) is checked (rule 1)."""
        return _Checker(self)

    def synchronize(self) -> None:
        """Block until every queued copy has completed."""
        for stream in self._streams:
            done = StandInEvent()
            stream.submit(done.set)
            done.synchronize()

    def close(self) -> None:
        self.synchronize()
        for stream in self._streams:
            stream.close()
        self._streams.clear()


_NO_DATA = {torch.ops.aten.set_.source_Storage_storage_offset, torch.ops.aten.set_.source_Storage,
            torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}


class _Checker(TorchDispatchMode):
    """Checks every aten op on the host thread against the stand-in's pending copies."""

    def __init__(self, backend: StandInBackend) -> None:
        super().__init__()
        self.backend = backend

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func.is_view or func in _NO_DATA:
            return func(*args, **kwargs)
        tensors = tuple(x for x in tree_flatten((args, kwargs))[0]
                        if isinstance(x, torch.Tensor) and x.device.type == "cpu")
        if tensors:
            written = tuple(x for i, a in enumerate(func._schema.arguments)
                            if a.alias_info is not None and a.alias_info.is_write
                            for x in [args[i] if i < len(args) else kwargs.get(a.name)]
                            if isinstance(x, torch.Tensor))
            self.backend._check_compute(str(func), tensors, written)
        return func(*args, **kwargs)


__all__ = ["COMPUTE", "Gate", "StandInBackend", "StandInEvent", "StandInStream"]
