"""Swapping: copies of saved activations to host memory and back, on side streams.

:class:`Swapper` owns what outlives one iteration: the side streams, the
pooled host buffers, the copies to the host still in flight, and device
buffers waiting for a copy to finish before they may be freed.  A
:class:`SwapGroup` is one swapped storage of one iteration.

Borrowed storages.  An input the plan swaps (the batch a first convolution
saves, :attr:`dqn_swap.trace.Trace.movable`) is held by the training loop, so
dropping autograd's reference frees nothing.  The runtime borrows its storage
instead: once the copy out has completed it empties it (``resize_(0)``, as
FSDP frees parameters), and the copy back refills the same storage, so the
caller's tensor holds its bytes again when backward has read it.  Autograd packs
an op's inputs before the op runs, so the storage is emptied only once both the
copy out and the op that saved it are done (the iteration says when the op is:
``op_done``).  If autograd frees the graph without a backward pass, the bytes
are copied back then.

Only a storage nobody else can reach is emptied.  Reads of a plain tensor cannot
be intercepted, so a storage emptied while the training loop still holds a tensor
on it would hand the loop's next read (an accuracy on the labels, a log line on
the batch, between forward and backward) zero bytes: garbage, or a crash.  So
:meth:`Swapper.empty_borrowed` empties it only when the runtime's own reference
is the storage's only one (``torch._C._storage_Use_Count``: every tensor and
every storage object on it counts; autograd holds the runtime's handle instead
of the tensor).  The iteration retries at every later hook of the forward pass
(the model's own frames let go of the batch when its ``forward`` returns) and
gives up at backward's first read: an input held to the end frees nothing, it
stays the caller's, whole and unchanged, and backward reads it in place.

Every stream synchronisation says why (the model of a device is in
:mod:`dqn_swap.runtime.backend`).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import torch

from .backend import Backend, Event


class HostBufferPool:
    """Host buffers reused across tensors and iterations, keyed by exact byte size.

    On CUDA they are pinned (page-locked) once, when first needed; an
    iteration repeats the previous one's sizes, so after the first iteration
    nothing is allocated or pinned.  Each free buffer carries the event after
    which its last reader (a host-to-device copy) is done.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._free: dict[int, list[tuple[torch.Tensor, Event | None]]] = {}
        self._lock = threading.Lock()  # buffers also come back from finalizers on autograd threads
        self.allocated_bytes = 0
        self.allocations = 0
        self.reuses = 0

    def acquire(self, nbytes: int) -> tuple[torch.Tensor, Event | None]:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self.reuses += 1
                return free.pop()
        buf = self.backend.host_buffer(nbytes)
        with self._lock:
            self.allocated_bytes += nbytes
            self.allocations += 1
        return buf, None

    def release(self, buf: torch.Tensor, event: Event | None) -> None:
        with self._lock:
            self._free.setdefault(buf.numel(), []).append((buf, event))

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


class SwapGroup:
    """One swapped storage (at one version) of one iteration: its host copy, the device bytes
    held while the copy out runs, and the prefetched device copy."""

    __slots__ = ("swapper", "tid", "version", "nbytes", "host", "source", "d2h_event", "dev", "h2d_event",
                 "h2d_waited", "remaining", "borrowed", "op_done", "emptied", "held", "watch", "__weakref__")

    def __init__(self, swapper: "Swapper", tid: int, version: int, nbytes: int) -> None:
        self.swapper, self.tid, self.version, self.nbytes = swapper, tid, version, nbytes
        self.host: torch.Tensor | None = None
        self.source: torch.Tensor | None = None  # device bytes, held until the copy out completed
        self.d2h_event: Event | None = None
        self.dev: torch.Tensor | None = None  # prefetched device bytes
        self.h2d_event: Event | None = None
        self.h2d_waited = True
        self.remaining = 0  # handles not yet unpacked
        self.borrowed: torch.UntypedStorage | None = None  # the caller's storage, for a swapped input
        self.op_done = False  # the op that saved the borrowed storage has run
        self.emptied = False  # the borrowed storage is empty (its bytes are on the host only)
        self.held = False  # the borrowed storage was found held outside the runtime (not emptied then)
        self.watch: Any = None  # the iteration: a weak reference to the packed input (version check)

    def __del__(self) -> None:
        try:
            self.swapper.retire(self)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """The whole storage as a flat uint8 tensor (a round trip of it is bit-exact for any view)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class Swapper:
    """Streams, host buffers and copies in flight of one runtime (module docstring).

    ``max_inflight_bytes`` bounds the device bytes held by copies to the host
    still running: a new copy out first waits (on the host) for the oldest
    ones until it fits (always at least one copy may run).
    """

    def __init__(self, backend: Backend, max_inflight_bytes: int) -> None:
        self.backend = backend
        self.pool = HostBufferPool(backend)
        self.max_inflight_bytes = max(0, int(max_inflight_bytes))
        self._d2h: Any = None
        self._h2d: Any = None
        self._lock = threading.Lock()
        self.inflight: deque[SwapGroup] = deque()  # copies out not yet known to be complete, in order
        self.inflight_bytes = 0
        self.graveyard: deque[tuple[torch.Tensor, Event]] = deque()  # device bytes a copy may still touch
        self.held_bytes = 0  # device bytes this runtime references (copies out in flight, prefetched)
        self.peak_held_bytes = 0
        self.bound_waits = 0  # copies out that waited for older ones (the in-flight bound)
        self.max_inflight_seen = 0  # most device bytes held by copies out at once
        self.kept_for_copies = 0  # device buffers of dropped graphs kept until their copy back ended
        self.emptied_borrowed = 0  # borrowed storages emptied (swapped inputs nothing else held)

    # ------------------------------------------------------------ streams
    @property
    def d2h_stream(self) -> Any:
        if self._d2h is None:
            self._d2h = self.backend.new_stream()
        return self._d2h

    @property
    def h2d_stream(self) -> Any:
        if self._h2d is None:
            self._h2d = self.backend.new_stream()
        return self._h2d

    def hold(self, nbytes: int) -> None:
        self.held_bytes += nbytes
        if self.held_bytes > self.peak_held_bytes:
            self.peak_held_bytes = self.held_bytes

    # ------------------------------------------------------------ copy out
    def swap_out(self, group: SwapGroup, storage: torch.UntypedStorage, *, borrowed: bool = False,
                 defer: bool = False) -> None:
        """Copy ``storage`` into a pooled host buffer; on an asynchronous device the device bytes stay
        referenced by ``group.source`` until the copy has completed (:meth:`poll`).  ``borrowed``: the
        storage belongs to the caller (a swapped input) and is emptied once copied (module docstring).
        ``defer`` (an asynchronous device, not borrowed): hold the device bytes now and start the copy
        later, with :meth:`start_copy`; until then the group reads as a copy still in flight."""
        backend = self.backend
        nbytes = group.nbytes
        if borrowed:
            group.borrowed = storage
        src = bytes_of(storage)
        if not backend.asynchronous:
            group.host, _ = self.pool.acquire(nbytes)
            backend.copy(group.host, src, None)  # synchronous: the device reference is not kept at all
            return
        group.source = src  # keep the device bytes until the copy has read them
        self.hold(nbytes)
        if not defer or borrowed:
            self.start_copy(group)

    def start_copy(self, group: SwapGroup) -> None:
        """Start the copy out of a group :meth:`swap_out` holds the device bytes of (asynchronous device)."""
        backend = self.backend
        nbytes = group.nbytes
        assert group.source is not None and group.d2h_event is None
        host, host_free = self.pool.acquire(nbytes)
        group.host = host
        self.poll()
        while self.inflight and self.inflight_bytes + nbytes > self.max_inflight_bytes:
            # The bound: the device bytes of copies in flight are what the plan assumed at most; wait
            # (on the host) for the oldest copy out before starting another.
            oldest = self.inflight[0]
            assert oldest.d2h_event is not None
            oldest.d2h_event.synchronize()
            self.bound_waits += 1
            self.poll()
        compute = backend.compute_stream()
        stream = self.d2h_stream
        # Sync: the kernels producing this tensor (and, for a deferred copy, those of the op after which
        # the plan copies it) were queued on the compute stream; the copy must start only after them
        # (the side stream waits, the host does not block).
        backend.wait_event(stream, backend.record_event(compute))
        if host_free is not None:
            # Sync: the pooled host buffer may still be read by the copy back of an earlier
            # iteration; overwrite it only after that copy finished.
            backend.wait_event(stream, host_free)
        group.d2h_event = backend.copy(host, group.source, stream)
        with self._lock:
            self.inflight.append(group)
            self.inflight_bytes += nbytes
            self.max_inflight_seen = max(self.max_inflight_seen, self.inflight_bytes)

    def poll(self) -> int:
        """Drop the device bytes of copies out that have completed (in order: one stream); returns
        how many were released."""
        released = 0
        while True:
            with self._lock:
                if not self.inflight:
                    break
                g = self.inflight[0]
                event = g.d2h_event
                if event is None or not event.query():
                    break
                self.inflight.popleft()
                self.inflight_bytes -= g.nbytes
            if g.source is not None:
                g.source = None
                self.held_bytes -= g.nbytes
                released += 1
                if g.borrowed is not None:
                    self.empty_borrowed(g)
        while self.graveyard and self.graveyard[0][1].query():
            self.graveyard.popleft()
        return released

    def empty_borrowed(self, g: SwapGroup) -> bool:
        """Free the device bytes of a borrowed storage once its copy out and the op that saved it are
        done, if backward still has to read it, it has not been fetched back already and nothing but
        ``g.borrowed`` holds the storage (module docstring; else ``g.held`` is set and it stays).
        Returns whether it is empty now."""
        if (g.borrowed is None or g.emptied or not g.op_done or g.source is not None or g.remaining <= 0
                or g.dev is not None):
            return g.emptied
        if torch._C._storage_Use_Count(g.borrowed._cdata) > 1:
            g.held = True  # a tensor (the caller's batch, a view) or another storage object holds it
            return False
        g.held = False
        g.borrowed.resize_(0)
        g.emptied = True
        self.emptied_borrowed += 1
        return True

    # ------------------------------------------------------------ copy back
    def fetch(self, g: SwapGroup) -> None:
        """Start copying ``g`` back into a new device buffer (at once on a synchronous device); a
        borrowed storage is refilled in place."""
        backend = self.backend
        assert g.host is not None
        if g.borrowed is not None and not g.emptied:
            g.dev = bytes_of(g.borrowed)  # never emptied: the caller's bytes are still there
            g.h2d_waited = True
            self.hold(g.nbytes)
            return
        if g.borrowed is not None:
            g.borrowed.resize_(g.nbytes)  # allocated on the current (compute) stream, as device_buffer is
            g.emptied = False
            dev = bytes_of(g.borrowed)
        else:
            dev = backend.device_buffer(g.nbytes)
        if backend.asynchronous:
            stream = self.h2d_stream
            # Sync: `dev` was allocated for the compute stream, whose earlier kernels may still use the
            # block (its previous owner); write it only after them.
            backend.wait_event(stream, backend.record_event(backend.compute_stream()))
            if g.d2h_event is not None:
                # Sync: the host copy must be complete before it is read back.
                backend.wait_event(stream, g.d2h_event)
            g.h2d_event = backend.copy(dev, g.host, stream)
            g.h2d_waited = False
        else:
            backend.copy(dev, g.host, None)
        g.dev = dev
        self.hold(g.nbytes)

    def ready(self, g: SwapGroup) -> tuple[torch.UntypedStorage, bool]:
        """The device storage of ``g`` for use on the compute stream, fetched now if it was not
        prefetched; returns it and whether it had to be fetched on demand."""
        if g.source is not None:  # the copy out is still in flight: the data never left
            return g.source.untyped_storage(), False
        on_demand = g.dev is None
        if on_demand:
            self.fetch(g)
        assert g.dev is not None
        if not g.h2d_waited:
            assert g.h2d_event is not None
            if not g.h2d_event.query():
                # Sync: the copy back is not done; the compute stream (not the host) waits for it.
                self.backend.wait_event(self.backend.compute_stream(), g.h2d_event)
            g.h2d_waited = True
        return g.dev.untyped_storage(), on_demand

    def drop_dev(self, g: SwapGroup) -> None:
        """The runtime no longer needs ``g``'s device copy (autograd keeps its own view while it uses it)."""
        if g.dev is None:
            return
        if not g.h2d_waited:
            # Sync: the block returns to the compute stream's pool; later kernels there must not reuse it
            # while the copy back may still write it.
            self.backend.wait_event(self.backend.compute_stream(), g.h2d_event)
            g.h2d_waited = True
        g.dev = None
        self.held_bytes -= g.nbytes

    def give_back(self, g: SwapGroup) -> None:
        """A borrowed storage still empty when its graph goes (no backward read it back): the caller's
        tensor gets its bytes again now (the copy out completed before it was emptied).  One already
        refilled by a prefetch whose copy back may still be running is the caller's again too."""
        if g.borrowed is not None and g.dev is not None and not g.h2d_waited and g.h2d_event is not None:
            # Sync: the caller's next kernels on the compute stream read this storage; they must wait
            # for the copy back that refills it (the block is the caller's, so no graveyard keeps it).
            self.backend.wait_event(self.backend.compute_stream(), g.h2d_event)
            g.h2d_waited = True
        if g.borrowed is not None and g.emptied:
            g.borrowed.resize_(g.nbytes)
            g.emptied = False
            # Sync: on the compute stream, so later kernels see the bytes; the host waits for the copy
            # because the host buffer goes back to the pool when the group retires.
            self.backend.copy(bytes_of(g.borrowed), g.host, self.backend.compute_stream()).synchronize()
        g.borrowed = None

    def retire(self, g: SwapGroup) -> None:
        """``g`` died (autograd freed its graph, with or without a backward pass)."""
        self.give_back(g)
        if g.dev is not None:
            if not g.h2d_waited and g.h2d_event is not None and not g.h2d_event.query():
                # The graph was dropped while the copy back still writes `dev`: freeing it now would let
                # the allocator hand the block out under the copy.  Keep it until the copy has completed.
                self.graveyard.append((g.dev, g.h2d_event))
                self.kept_for_copies += 1
            g.dev = None
            self.held_bytes -= g.nbytes
        if g.host is not None:
            # The pool hands the buffer out again only after the last copy that uses it.
            event = g.h2d_event if g.h2d_event is not None else g.d2h_event
            self.pool.release(g.host, event)
            g.host = None

    def synchronize(self) -> None:
        """Block until every copy this runtime started has completed, and release what they held."""
        for g in list(self.inflight):
            if g.d2h_event is not None:
                g.d2h_event.synchronize()
        for _, event in list(self.graveyard):
            event.synchronize()
        self.poll()


__all__ = ["HostBufferPool", "SwapGroup", "Swapper", "bytes_of"]
