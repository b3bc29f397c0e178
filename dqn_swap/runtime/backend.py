"""The device as the runtime sees it: streams, events, pinned host buffers and copies.

Everything asynchronous the runtime does goes through one small interface,
:class:`Backend`, so that the same code runs on three devices:

* :class:`CudaBackend` -- CUDA streams and events, page-locked host memory,
  ``copy_(..., non_blocking=True)``;
* :class:`HostBackend` -- the CPU as the device: copies are synchronous and
  every event has already completed (exactness runs on every machine);
* :class:`dqn_swap.runtime.standin.StandInBackend` -- the CPU as a device
  whose copies run late on worker threads, with a checker in the manner of
  PyTorch's CUDA sanitizer: the asynchronous code path, tested without CUDA.

The model of a device the runtime relies on is CUDA's:

* work queued on one stream runs in order; work on different streams is
  unordered unless a stream waits for an event recorded on another;
* the *compute stream* is the stream the model's kernels run on
  (:meth:`Backend.compute_stream`); what the host has queued there before
  :meth:`Backend.record_event` is done when the event is;
* a copy reads and writes its tensors when it runs, not when it is queued:
  they must stay allocated, and nobody may write them, until its event has
  completed;
* memory freed by the host becomes reusable by later work on the stream it was
  allocated on (the caching allocator's rule), so a block read or written by a
  copy on a side stream may be freed only once the compute stream is ordered
  after the copy.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch


def host_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """Host memory for a copy out: pinned on cuda; on the cpu NumPy's memory, which PyTorch's
    allocator (and so the allocator timeline that stands in for device memory) does not see.
    Host buffers pooled across steps in PyTorch's cpu allocator would be counted as device
    bytes alive at every step's start, which no trace holds."""
    if device.type == "cuda":
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return torch.from_numpy(np.empty(nbytes, dtype=np.uint8))


class Event(Protocol):
    """A point in a stream's queue."""

    def query(self) -> bool:
        """Whether everything queued before the event has run (never blocks)."""
        ...

    def synchronize(self) -> None:
        """Block the host until the event has completed."""
        ...


class Backend(Protocol):
    """What the runtime needs of a device; see the module docstring for the model."""

    #: whether copies may still be running when :meth:`copy` returns
    asynchronous: bool
    device: torch.device

    def compute_stream(self) -> Any:
        """The stream the model's kernels are queued on now."""
        ...

    def new_stream(self) -> Any:
        """A side stream for copies."""
        ...

    def record_event(self, stream: Any) -> Event:
        """An event after everything queued on ``stream`` so far."""
        ...

    def wait_event(self, stream: Any, event: Event) -> None:
        """Make later work on ``stream`` wait for ``event`` (the host does not block)."""
        ...

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of host memory for copies (page-locked where that makes copies asynchronous)."""
        ...

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of device memory, allocated for the compute stream."""
        ...

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> Event:
        """Queue ``dst.copy_(src)`` on ``stream``; returns the event of its completion."""
        ...

    def memory_allocated(self) -> int | None:
        """Device bytes allocated now, where the device can tell (else None)."""
        ...


class _Done:
    """An event that has completed."""

    __slots__ = ()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


DONE = _Done()


class HostBackend:
    """The CPU as the device: every copy completes before :meth:`copy` returns."""

    asynchronous = False

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def compute_stream(self) -> None:
        return None

    def new_stream(self) -> None:
        return None

    def record_event(self, stream: Any) -> Event:
        return DONE

    def wait_event(self, stream: Any, event: Event) -> None:
        return None

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return host_buffer(nbytes, self.device)

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> Event:
        dst.copy_(src)
        return DONE

    def memory_allocated(self) -> int | None:
        return None


class CudaBackend:
    """A CUDA device: side streams, events, pinned host memory, non-blocking copies."""

    asynchronous = True

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device

    def compute_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(device=self.device)

    def record_event(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: torch.cuda.Stream, event: Event) -> None:
        if isinstance(event, torch.cuda.Event):
            stream.wait_event(event)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream) -> torch.cuda.Event:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        return done

    def memory_allocated(self) -> int | None:
        return int(torch.cuda.memory_allocated(self.device))


def backend_for(device: torch.device) -> Backend:
    """The backend of a real device: CUDA, or the synchronous host backend for anything else."""
    if device.type == "cuda":
        return CudaBackend(device)
    return HostBackend(device)


__all__ = ["DONE", "Backend", "CudaBackend", "Event", "HostBackend", "backend_for"]
