"""A stand-in device on a virtual clock: the runtime's step time as a GPU following the profile
would give it, measured on any machine.

:class:`VirtualClockBackend` implements :class:`~dqn_swap.runtime.backend.Backend` on the CPU.
Every tensor operation really runs (training stays exact); time is kept apart, on clocks:

* the **host and the compute stream** share one clock, :attr:`VirtualClockBackend.now`.  Each
  aten op the model runs (forward, backward, the optimizer's step, and the runtime's re-runs)
  advances it by the profile's time for that op: ``DeviceProfile.compute_time`` of its FLOPs
  and the bytes its inputs and outputs move, the roofline the recorder gives a trace's ops
  (:mod:`dqn_swap.recorder`), so that an unplanned step takes exactly the trace's summed op
  times.  Views, ``detach`` and ops on no tensor of the device cost nothing there, as in the
  recorder, and the runtime's own bookkeeping (its buffers, its views of storages: a
  zero-element ``empty`` set to a storage) costs nothing: it is not in the trace.
* every **side stream** has its own clock.  A copy queued on it starts when the stream is free,
  the host has queued it and every event the stream waits for has completed, and takes the
  profile's ``transfer_time`` for its bytes and direction (to the host when the destination is
  one of the backend's host buffers).  Streams run concurrently (a duplex link).
* an **event** is a time.  ``query()`` says whether the host's clock has passed it;
  ``synchronize()`` (the host waits) and ``wait_event`` on the compute stream move the host's
  clock to it: that is where the runtime waits other than as the schedule planned.

So a plan followed through the real runtime on this backend has a step time (``now`` at the
end less at the start) that can be compared with the simulator's makespan for the same plan and
profile, exactly: every difference is a place where the runtime waits, copies or re-runs other
than as planned (``benchmarks/bench_runtime.py clock``).

Example::

    backend = VirtualClockBackend(get_profile("v100-pcie3"))
    runtime = PlannedExecution(model, plan, trace, backend=backend)
    with backend.ops():
        start = backend.now
        with runtime:
            loss_fn(model(x)).backward()
        optimizer.step()
        step_seconds = backend.now - start
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from ..cost import DeviceProfile
from .backend import host_buffer

COMPUTE = "compute"  # the compute stream: the host's own clock

# Ops the recorder does not count as ops of the trace (they move no data of their own).
_FREE = (torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default, torch.ops.aten.set_.source_Storage,
         torch.ops.aten.set_.source_Storage_storage_offset)


class VirtualEvent:
    """A point in virtual time: when everything queued before it on its stream has run."""

    __slots__ = ("backend", "time")

    def __init__(self, backend: "VirtualClockBackend", time: float) -> None:
        self.backend, self.time = backend, time

    def query(self) -> bool:
        return self.time <= self.backend.now

    def synchronize(self) -> None:
        self.backend.wait_host(self.time)


class VirtualStream:
    """A side stream: when the last copy queued on it ends, and the events it waits for."""

    __slots__ = ("name", "free_at")

    def __init__(self, name: str) -> None:
        self.name, self.free_at = name, 0.0


class _Counter(TorchDispatchMode):
    """Advances the host's clock by each op's roofline time (module docstring)."""

    def __init__(self, backend: "VirtualClockBackend") -> None:
        super().__init__()
        self.backend = backend
        # An empty tensor just made: how the runtime views a storage (``empty(0).set_(storage)``,
        # bookkeeping) if the next op sets it, else an op of the program (batch norm's empty save
        # tensors), which the trace times: charged then.
        self.empty: tuple[Any, Any, dict] | None = None

    def __exit__(self, *exc: Any) -> Any:
        self._flush(False)
        return super().__exit__(*exc)

    def _flush(self, is_set: bool) -> None:
        """The pending empty tensor is charged as an op unless the next op sets it (``set_``: on an
        alias autograd made of it, so it is the next op that says, not the tensor)."""
        pending, self.empty = self.empty, None
        if pending is not None and not is_set:
            self._charge(torch.ops.aten.empty.memory_format, pending[0], pending[2], pending[1])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        b = self.backend
        if b.paused:
            return out
        is_set = func._overloadpacket is torch.ops.aten.set_
        if self.empty is not None and not func.is_view and (is_set or func not in _FREE):
            self._flush(is_set)
        if func.is_view or func in _FREE:
            return out
        if func is torch.ops.aten.empty.memory_format and isinstance(out, torch.Tensor) and out.numel() == 0:
            self.empty = (args, out, kwargs)
            return out
        self._charge(func, args, kwargs, out)
        return out

    def _charge(self, func: Any, args: Any, kwargs: dict, out: Any) -> None:
        b = self.backend
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not inputs and not outputs:
            return
        flops = 0.0
        packet = func._overloadpacket
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
        moved = sum(t.numel() * t.element_size() for t in (*inputs, *outputs))
        seconds = float(b.profile.compute_time(np.array([flops]), np.array([float(moved)]),
                                               np.array([flops > 0]))[0])
        if b.op_starts is not None:
            b.op_starts.append((str(packet), b.now))
        b.now += seconds
        b.compute_seconds += seconds
        b.ops_counted += 1


class VirtualClockBackend:
    """The CPU as a device whose time is the profile's (module docstring).

    Args:
        profile: the device profile whose op times and transfer bandwidths the clock follows.

    Attributes:
        now: the host's (and compute stream's) clock, in seconds.
        compute_seconds: time the ops took; ``waited_seconds``: time the host waited for copies
            (events it synchronised on, the compute stream waiting for a copy back).
        copies: (direction, bytes, start, end) of every copy on a side stream.
        op_starts: set to a list to collect (op name, start) of every op counted.
    """

    asynchronous = True

    def __init__(self, profile: DeviceProfile) -> None:
        self.profile = profile
        self.device = torch.device("cpu")
        self.now = 0.0
        self.compute_seconds = 0.0
        self.waited_seconds = 0.0
        self.ops_counted = 0
        self.paused = 0
        self.op_starts: list[tuple[str, float]] | None = None  # (op, start) of every op, when a list
        self.copies: list[tuple[str, int, float, float]] = []
        self._host: set[int] = set()  # data pointers of the host buffers handed out

    # ------------------------------------------------------------ the clock
    @contextlib.contextmanager
    def ops(self) -> Iterator["VirtualClockBackend"]:
        """Count the time of every op run inside (a step: forward, backward, optimizer)."""
        with _Counter(self):
            yield self

    @contextlib.contextmanager
    def _own(self) -> Iterator[None]:
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def wait_host(self, time: float) -> None:
        if time > self.now:
            self.waited_seconds += time - self.now
            self.now = time

    # ------------------------------------------------------------ Backend
    def compute_stream(self) -> str:
        return COMPUTE

    def new_stream(self) -> VirtualStream:
        return VirtualStream(f"side-{id(self)}")

    def record_event(self, stream: Any) -> VirtualEvent:
        if stream == COMPUTE or stream is None:
            return VirtualEvent(self, self.now)
        return VirtualEvent(self, stream.free_at)

    def wait_event(self, stream: Any, event: Any) -> None:
        time = getattr(event, "time", 0.0)
        if stream == COMPUTE or stream is None:
            self.wait_host(time)
        else:
            stream.free_at = max(stream.free_at, time)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        with self._own():
            buf = host_buffer(nbytes, self.device)
        self._host.add(buf.untyped_storage().data_ptr())
        return buf

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        with self._own():
            return torch.empty(nbytes, dtype=torch.uint8)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> VirtualEvent:
        with self._own():
            dst.copy_(src)  # the bytes move now; their time is the clock's
        nbytes = dst.numel() * dst.element_size()
        direction = "d2h" if dst.untyped_storage().data_ptr() in self._host else "h2d"
        seconds = float(self.profile.transfer_time(nbytes, direction))
        if stream == COMPUTE or stream is None:  # a synchronous copy: the host waits for it
            start = self.now
            self.wait_host(self.now + seconds)
            self.copies.append((direction, nbytes, start, self.now))
            return VirtualEvent(self, self.now)
        start = max(stream.free_at, self.now)
        stream.free_at = start + seconds
        self.copies.append((direction, nbytes, start, stream.free_at))
        return VirtualEvent(self, stream.free_at)

    def memory_allocated(self) -> int | None:
        return None


__all__ = ["VirtualClockBackend", "VirtualEvent", "VirtualStream"]
