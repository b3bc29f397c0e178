"""Follow a plan inside real PyTorch training: swap saved activations to host memory and
recompute the ones the plan removes, in every iteration.

Usage (one iteration per ``with`` block; the object is reused across iterations)::

    runtime = PlannedExecution(model, plan, trace)
    for batch, target in loader:
        with runtime:
            loss = loss_fn(model(batch), target)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

How the live iteration is matched to the trace
----------------------------------------------
Autograd hands every tensor it saves for backward to the pack hook of
:func:`torch.autograd.graph.saved_tensors_hooks`.  The recorder numbered
those calls; the ``k``-th call of a live iteration therefore packs
``trace.saved[k]``.  Each pack is checked cheaply against the trace (storage
size rounded to 512 bytes; the same tensor id keeps the same storage), and a
model that no longer matches its trace raises :class:`TraceMismatchError`.
Only tensors on the runtime's device are counted, as in the recorder.

Swap
----
The pack hook copies the whole storage of a swapped tensor into a pooled
host buffer (pinned on CUDA) and returns a handle instead of the tensor, so
autograd no longer holds the device memory.  On CUDA the copy runs on a side
stream after an event recorded on the compute stream; the runtime keeps a
reference to the device storage plus the copy's completion event and drops
the reference once the event has completed (polled at every later hook), so
the caching allocator never reuses memory that the copy still reads (no
``record_stream``, which would only free it at the next allocation on the
stream after the copy completes).  A tensor packed several times (several ops
save it) shares one host copy; views are rebuilt from the storage with their
original size, stride and offset, so a round trip is bit-exact.

Prefetch
--------
Host-to-device copies run on their own stream, earliest-reused first, at the
backward op the prefetch schedule chose (:mod:`.analysis`), as soon as memory
allows.  Progress through backward is read from the unpack hooks (every
autograd node unpacks its saved tensors right before it runs).  The device
buffer is allocated on the compute stream, and the copy stream waits for an
event recorded there: the block may still be in use by the compute stream's
earlier kernels, and allocating it on the compute stream means its later
release needs no cross-stream bookkeeping.  When the data is needed the
compute stream waits on the copy's event only if the copy has not completed.

Recompute
---------
A recomputed tensor is not saved: its pack hook returns a handle holding no
tensor.  While the forward pass runs, a :class:`TorchDispatchMode` numbers
the aten ops exactly as the recorder did and, for the ops that create or
modify a removed tensor (and, transitively, the non-persistent tensors those
ops read), records the op, its arguments as (tensor id, version, view) or, for
parameters and inputs, the tensor itself, and the RNG state before random
ops.  The unpack hook re-runs those ops under ``no_grad``: inputs come from
the live saved tensors (prefetching swapped ones), from other recomputations,
or recursively from their own recorded ops; arguments an op mutates
(batch-norm running statistics) are cloned first, and random ops (dropout)
run with the recorded RNG state, so the recomputed values are the forward
ones.  This is selective activation checkpointing at the granularity of the
trace (one aten op), which is what the planner and simulator reason about; it
needs no change to the model.

CPU
---
Everything runs on the CPU too: copies go to separate (pooled) host buffers
synchronously, prefetches are issued at the same points, so the bookkeeping
and the exactness are tested on every machine.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..plan import Plan
from ..trace import Trace, format_bytes
from .analysis import NO_OP, PlanIndex, build_index, round_size

P = ParamSpec("P")
R = TypeVar("R")

_VIEW_LIKE = (torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default)


class TraceMismatchError(RuntimeError):
    """The live iteration does not match the trace the plan was made for."""


class RecomputeError(RuntimeError):
    """A tensor the plan removed could not be recomputed."""


class PlannedOutOfMemoryError(torch.OutOfMemoryError):
    """An allocation failed under a plan; the message names the op, the plan and the memory in use."""


def enable_expandable_segments() -> bool:
    """Turn on the CUDA caching allocator's expandable segments (the counterpart of the window
    paper's virtual addressing: freed blocks coalesce, so swapping does not fragment memory).

    Affects segments allocated afterwards; returns whether it was applied.
    """
    if not torch.cuda.is_available():
        return False
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return True


# --------------------------------------------------------------------------- host buffers
class HostBufferPool:
    """Host buffers reused across tensors and iterations, keyed by exact byte size.

    On CUDA they are pinned (page-locked) once, when first needed; an
    iteration repeats the previous one's sizes, so after the first iteration
    nothing is allocated or pinned.  Each free buffer carries the event after
    which its last reader (a host-to-device copy) is done.
    """

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._free: dict[int, list[tuple[torch.Tensor, torch.cuda.Event | None]]] = {}
        self._lock = threading.Lock()  # buffers also come back from finalizers on autograd threads
        self.allocated_bytes = 0
        self.allocations = 0
        self.reuses = 0

    def acquire(self, nbytes: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self.reuses += 1
                return free.pop()
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        with self._lock:
            self.allocated_bytes += nbytes
            self.allocations += 1
        return buf, None

    def release(self, buf: torch.Tensor, event: torch.cuda.Event | None) -> None:
        with self._lock:
            self._free.setdefault(buf.numel(), []).append((buf, event))

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(n * len(v) for n, v in self._free.items())

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


# --------------------------------------------------------------------------- handles
KEEP, SWAP, RECOMPUTE = 0, 1, 2


class _Packed:
    """What autograd keeps instead of a saved tensor: the tensor itself (kept), or a group."""

    __slots__ = ("it", "kind", "ref", "tid", "index", "dtype", "size", "stride", "offset", "__weakref__")

    def __init__(self, it: "_Iteration", kind: int, ref: Any, tid: int, index: int, t: torch.Tensor) -> None:
        self.it, self.kind, self.ref, self.tid, self.index = it, kind, ref, tid, index
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()


class _SwapGroup:
    """One swapped storage (at one version): its host copy, in-flight source and prefetched copy."""

    def __init__(self, rt: "PlannedExecution", tid: int, version: int, nbytes: int) -> None:
        self.rt, self.tid, self.version, self.nbytes = rt, tid, version, nbytes
        self.host: torch.Tensor | None = None
        self.source: torch.Tensor | None = None  # device bytes, held until the D2H copy completed
        self.d2h_event: torch.cuda.Event | None = None
        self.dev: torch.Tensor | None = None  # prefetched device bytes
        self.h2d_event: torch.cuda.Event | None = None
        self.h2d_waited = True
        self.remaining = 0  # handles not yet unpacked

    def __del__(self) -> None:
        try:
            self.rt._release_group(self)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _RecomputeGroup:
    """One recomputed storage; the result is shared by the handles that have not unpacked yet."""

    __slots__ = ("tid", "version", "remaining", "storage")

    def __init__(self, tid: int, version: int) -> None:
        self.tid, self.version, self.remaining = tid, version, 0
        self.storage: torch.UntypedStorage | None = None


@dataclass(frozen=True)
class _Ref:
    """A non-persistent tensor argument of a recorded op: its storage (by id and version) and view."""

    tid: int
    version: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class _Const:
    """A tensor argument alive for the whole iteration (parameter, buffer, input, host scalar)."""

    value: torch.Tensor


@dataclass
class _Step:
    """One recorded op that creates (``out_pos`` set) or modifies a recomputable storage."""

    func: torch._ops.OpOverload
    args: Any
    kwargs: Any
    op: int
    v_before: int  # version of the target before the op (-1 when the op creates it)
    out_pos: int | None
    rng: tuple[torch.Generator, torch.Tensor] | None
    refs: tuple[_Ref, ...] = ()  # the non-persistent tensor arguments


def _view(storage: torch.UntypedStorage, dtype: torch.dtype, size: Any, stride: Any, offset: int) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _mutated_positions(func: torch._ops.OpOverload) -> tuple[tuple[int, str], ...]:
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _is_random(func: torch._ops.OpOverload) -> bool:
    return torch.Tag.nondeterministic_seeded in func.tags


def _generator_for(func: torch._ops.OpOverload, args: tuple, kwargs: dict,
                   device: torch.device) -> torch.Generator:
    gen = kwargs.get("generator")
    if isinstance(gen, torch.Generator):
        return gen
    for a in args:
        if isinstance(a, torch.Generator):
            return a
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[idx]
    return torch.default_generator


# --------------------------------------------------------------------------- statistics
@dataclass
class IterationStats:
    """Bookkeeping of one planned iteration (all byte counts are device bytes)."""

    packed: int = 0
    expected_packs: int = 0
    swapped: int = 0  # distinct storages copied out
    swapped_bytes: int = 0
    released_after_copy: int = 0  # storages whose device reference the runtime dropped after the copy
    recompute_removed: int = 0  # distinct storages not saved
    recompute_removed_bytes: int = 0
    recomputed: int = 0  # storages re-created in backward
    replayed_ops: int = 0
    prefetches: int = 0
    on_demand_fetches: int = 0  # fetched at reuse: no prefetch had been issued
    late_waits: int = 0  # compute stream waited for a copy still in flight
    deferred_prefetches: int = 0  # prefetch postponed because memory did not allow it
    held_bytes: int = 0  # device bytes the runtime references now
    peak_held_bytes: int = 0
    prefetch_log: list[tuple[int, int]] = field(default_factory=list)  # (tensor id, backward op) in issue order
    source_refs: list[StorageWeakRef] = field(default_factory=list)  # with track_storages: removed originals

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, int)}


# --------------------------------------------------------------------------- op recording
class _RecipeMode(TorchDispatchMode):
    """Numbers forward ops as the recorder did and records the ones recomputation re-runs."""

    def __init__(self, it: "_Iteration") -> None:
        super().__init__()
        self.it = it
        self.op = 0
        self.names: dict[torch._ops.OpOverload, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        it = self.it
        if it.paused or it.forward_done or func.is_view or func in _VIEW_LIKE:
            return func(*args, **kwargs)
        index, dev_type = it.rt.index, it.rt.device.type
        flat_in = [x for x in tree_flatten((args, kwargs))[0]
                   if isinstance(x, torch.Tensor) and x.device.type == dev_type]
        i = self.op
        targets = index.recipe_ops.get(i)
        rng = None
        if targets and _is_random(func):
            # The state before the op: replaying it with this state draws the same numbers.
            gen = _generator_for(func, args, kwargs, it.rt.device)
            rng = (gen, gen.get_state())
        versions = [x._version for x in flat_in]  # before the op: in-place ops bump them afterwards
        out = func(*args, **kwargs)
        flat_out = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor) and x.device.type == dev_type]
        if not flat_in and not flat_out:
            return out  # host-side bookkeeping: the recorder skipped it too
        self.op += 1
        info = index.forward_ops.get(i)
        name = self.names.get(func)
        if name is None:
            name = self.names[func] = str(func._overloadpacket)
        if info is None or info.name != name:
            expected = info.name if info is not None else "the end of the forward pass"
            raise TraceMismatchError(
                f"forward op #{i} is {name}, the trace recorded {expected}: the model changed since the "
                f"trace was recorded ({it.rt.plan_label()}); record the trace again and re-plan")
        if targets:
            it.record_step(i, info, func, args, kwargs, flat_in, versions, out, rng, targets)
        return out


# --------------------------------------------------------------------------- one iteration
class _Iteration:
    """State of one planned iteration; handles keep it alive until autograd frees the graph."""

    def __init__(self, rt: "PlannedExecution") -> None:
        self.rt = rt
        self.index = rt.index
        self.stats = IterationStats(expected_packs=rt.index.n_saved)
        self.n_packed = 0
        self.paused = False
        self.forward_done = False
        self.tid_key: dict[int, int] = {}
        self.swap_groups: dict[tuple[int, int], _SwapGroup] = {}
        self.groups_by_tid: dict[int, list[_SwapGroup]] = {}
        self.rec_groups: dict[tuple[int, int], _RecomputeGroup] = {}
        self.kept: weakref.WeakValueDictionary[tuple[int, int], _Packed] = weakref.WeakValueDictionary()
        self.recipes: dict[int, list[_Step]] = {}
        self.in_flight: deque[_SwapGroup] = deque()
        self.position = -1  # backward op reached (trace op index)
        self.prefetch_ptr = 0
        self.where: tuple[str, int] = ("forward", -1)
        self.finished = False

    # ------------------------------------------------------------ memory accounting
    def hold(self, nbytes: int) -> None:
        s = self.stats
        s.held_bytes += nbytes
        s.peak_held_bytes = max(s.peak_held_bytes, s.held_bytes)

    def unhold(self, nbytes: int) -> None:
        self.stats.held_bytes -= nbytes

    # ------------------------------------------------------------------ pack
    def pack(self, t: torch.Tensor) -> Any:
        rt = self.rt
        if t.device.type != rt.device.type:
            return t  # the recorder neither counted nor tracked it
        k = self.n_packed
        self.n_packed += 1
        self.stats.packed += 1
        index = self.index
        if t.layout != torch.strided:
            return t  # counted as the recorder did, but kept: only strided storages are copied
        if k >= index.n_saved:
            raise TraceMismatchError(
                f"autograd saved more than the {index.n_saved} tensors the trace recorded for one iteration: "
                f"the model or the batch changed since recording ({rt.plan_label()}); record the trace again "
                "(one PlannedExecution block must hold exactly one forward pass)")
        tid = int(index.saved_tids[k])
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if round_size(nbytes) != index.saved_sizes[k]:
            raise TraceMismatchError(
                f"saved tensor #{k} has {nbytes} bytes, the trace recorded {index.tensor_label(tid)}: the model "
                f"or the batch size changed since recording ({rt.plan_label()}); record the trace again")
        key = storage._cdata
        if self.tid_key.setdefault(tid, key) != key:
            raise TraceMismatchError(
                f"saved tensor #{k} is a different storage than earlier saves of {index.tensor_label(tid)}: "
                f"the model changed since recording ({rt.plan_label()}); record the trace again")
        self.where = ("pack", k)
        self.paused = True
        try:
            with torch.no_grad():
                self.poll()
                version = t._version
                if tid in index.swap:
                    group = self.swap_groups.get((tid, version))
                    if group is None:
                        group = self.swap_out(tid, version, storage)
                    group.remaining += 1
                    packed = _Packed(self, SWAP, group, tid, k, t)
                elif tid in index.recompute:
                    rgroup = self.rec_groups.get((tid, version))
                    if rgroup is None:
                        rgroup = self.rec_groups[(tid, version)] = _RecomputeGroup(tid, version)
                        self.stats.recompute_removed += 1
                        self.stats.recompute_removed_bytes += nbytes
                        if rt.track_storages:
                            self.stats.source_refs.append(StorageWeakRef(storage))
                    rgroup.remaining += 1
                    packed = _Packed(self, RECOMPUTE, rgroup, tid, k, t)
                else:
                    packed = _Packed(self, KEEP, t, tid, k, t)
                    if index.recompute:
                        self.kept[(tid, version)] = packed
                if self.n_packed == index.n_saved:
                    self.end_of_forward()
        finally:
            self.paused = False
        return packed

    def swap_out(self, tid: int, version: int, storage: torch.UntypedStorage) -> _SwapGroup:
        rt = self.rt
        nbytes = storage.nbytes()
        group = _SwapGroup(rt, tid, version, nbytes)
        self.swap_groups[(tid, version)] = group
        self.groups_by_tid.setdefault(tid, []).append(group)
        host, host_free = rt.pool.acquire(nbytes)
        group.host = host
        src = _bytes_of(storage)
        if rt.cuda:
            compute = torch.cuda.current_stream(rt.device)
            ready = torch.cuda.Event()
            ready.record(compute)
            stream = rt.d2h_stream
            with torch.cuda.stream(stream):
                # Sync: the kernels producing this tensor were queued on the compute stream; the copy
                # must start only after them (a GPU-side wait, the host does not block).
                stream.wait_event(ready)
                if host_free is not None:
                    # Sync: the pooled host buffer may still be read by the H2D copy of an earlier
                    # iteration; overwrite it only after that copy finished.
                    stream.wait_event(host_free)
                host.copy_(src, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
            # Keep the device bytes (and the event) until the copy completed; poll() drops them.
            group.source, group.d2h_event = src, done
            self.in_flight.append(group)
            self.hold(nbytes)
        else:
            host.copy_(src)  # synchronous: the device reference is not kept at all
        if rt.track_storages:
            self.stats.source_refs.append(StorageWeakRef(storage))
        self.stats.swapped += 1
        self.stats.swapped_bytes += nbytes
        return group

    def poll(self) -> None:
        """Drop device references of swap-outs whose copy completed (FIFO: one copy stream)."""
        q = self.in_flight
        while q and q[0].d2h_event is not None and q[0].d2h_event.query():
            g = q.popleft()
            if g.source is not None:
                g.source = None
                self.unhold(g.nbytes)
                self.stats.released_after_copy += 1

    def end_of_forward(self) -> None:
        """Every saved tensor is packed: stop recording ops, issue the first prefetches."""
        if self.forward_done:
            return
        self.forward_done = True
        self.position = max(self.position, self.index.first_backward_op)
        self.issue_prefetches()

    # ---------------------------------------------------------------- prefetch
    def issue_prefetches(self) -> None:
        rt, index = self.rt, self.index
        if not rt.prefetch:
            return
        order = index.prefetch_order
        while self.prefetch_ptr < len(order):
            tid = order[self.prefetch_ptr]
            if index.prefetch_op[tid] > self.position:
                break
            groups = [g for g in self.groups_by_tid.get(tid, ()) if g.remaining > 0
                      and g.dev is None and g.source is None]
            need = sum(g.nbytes for g in groups)
            if need and rt.cuda and torch.cuda.memory_allocated(rt.device) + need > rt.memory_limit:
                self.stats.deferred_prefetches += 1
                break  # memory does not allow it yet; retried at the next unpack
            for g in groups:
                self.fetch(g)
                self.stats.prefetches += 1
                self.stats.prefetch_log.append((tid, self.position))
            self.prefetch_ptr += 1

    def fetch(self, g: _SwapGroup) -> None:
        """Start copying ``g`` back to the device (synchronously on the CPU)."""
        rt = self.rt
        assert g.host is not None
        dev = torch.empty(g.nbytes, dtype=torch.uint8, device=rt.device)
        if rt.cuda:
            compute = torch.cuda.current_stream(rt.device)
            allocated = torch.cuda.Event()
            allocated.record(compute)
            stream = rt.h2d_stream
            with torch.cuda.stream(stream):
                # Sync: `dev` was allocated on the compute stream, whose earlier kernels may still use the
                # block (its previous owner); write it only after them.
                stream.wait_event(allocated)
                if g.d2h_event is not None:
                    # Sync: the host copy must be complete before it is read back (normally long done).
                    stream.wait_event(g.d2h_event)
                dev.copy_(g.host, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
            g.h2d_event, g.h2d_waited = done, False
        else:
            dev.copy_(g.host)
        g.dev = dev
        self.hold(g.nbytes)

    def ready(self, g: _SwapGroup) -> torch.UntypedStorage:
        """The device storage of ``g`` for use on the current (compute) stream."""
        if g.source is not None:  # the copy-out is still in flight: the data never left
            return g.source.untyped_storage()
        if g.dev is None:
            self.fetch(g)
            self.stats.on_demand_fetches += 1
        assert g.dev is not None
        if self.rt.cuda and not g.h2d_waited:
            if not g.h2d_event.query():
                # Sync: the prefetch is late; the compute stream (not the host) waits for it.
                torch.cuda.current_stream(self.rt.device).wait_event(g.h2d_event)
                self.stats.late_waits += 1
            g.h2d_waited = True
        return g.dev.untyped_storage()

    def drop_dev(self, g: _SwapGroup) -> None:
        if g.dev is None:
            return
        if self.rt.cuda and not g.h2d_waited:
            # Sync: the block returns to the compute stream's pool; later kernels there must not reuse it
            # while the H2D copy still writes it.
            torch.cuda.current_stream(self.rt.device).wait_event(g.h2d_event)
            g.h2d_waited = True
        g.dev = None
        self.unhold(g.nbytes)

    # ------------------------------------------------------------------ unpack
    def unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        self.where = ("unpack", packed.index)
        self.paused = True
        try:
            with torch.no_grad():
                if not self.forward_done:
                    self.end_of_forward()
                self.poll()
                fb = int(self.index.first_backward_read[packed.tid])
                if fb != NO_OP and fb > self.position:
                    self.position = fb
                self.issue_prefetches()
                if packed.kind == KEEP:
                    return packed.ref
                if packed.kind == SWAP:
                    g: _SwapGroup = packed.ref
                    storage = self.ready(g)
                    g.remaining -= 1
                    if g.remaining <= 0:
                        self.drop_dev(g)  # autograd's view keeps the bytes for this node only
                else:
                    rg: _RecomputeGroup = packed.ref
                    storage = rg.storage
                    if storage is None:
                        storage = self.resolve(rg.tid, rg.version)
                        self.stats.recomputed += 1
                    rg.remaining -= 1
                    rg.storage = storage if rg.remaining > 0 else None
                return _view(storage, packed.dtype, packed.size, packed.stride, packed.offset)
        finally:
            self.paused = False

    # --------------------------------------------------------------- recompute
    def record_step(self, i: int, info: Any, func: torch._ops.OpOverload, args: tuple, kwargs: dict,
                    flat_in: list[torch.Tensor], versions: list[int], out: Any,
                    rng: tuple[torch.Generator, torch.Tensor] | None, targets: tuple[int, ...]) -> None:
        """Remember op ``i`` (forward) so that ``targets`` can be re-created in backward."""
        index = self.index
        keys: dict[int, int] = {}  # storage key -> tid
        version_of: dict[int, int] = {}
        for x, v in zip(flat_in, versions):
            key = x.untyped_storage()._cdata
            if key not in keys:
                keys[key] = -1
                version_of[key] = v
        if len(keys) != len(info.reads):
            raise TraceMismatchError(
                f"forward op #{i} ({info.name}) reads {len(keys)} storages, the trace recorded "
                f"{len(info.reads)} ({self.rt.plan_label()}); record the trace again")
        for key, tid in zip(list(keys), info.reads):
            keys[key] = tid
        out_leaves = tree_flatten(out)[0]
        fresh: list[int] = []
        for x in out_leaves:
            if isinstance(x, torch.Tensor) and x.device.type == self.rt.device.type:
                key = x.untyped_storage()._cdata
                if key not in keys and key not in fresh:
                    fresh.append(key)
        if len(fresh) != len(info.fresh):
            raise TraceMismatchError(
                f"forward op #{i} ({info.name}) created {len(fresh)} storages, the trace recorded "
                f"{len(info.fresh)} ({self.rt.plan_label()}); record the trace again")
        for key, tid in zip(fresh, info.fresh):
            keys[key] = tid
        dev_type = self.rt.device.type

        def spec(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            if x.device.type != dev_type:
                return _Const(x)
            tid = keys[x.untyped_storage()._cdata]
            if index.is_persistent(tid):
                return _Const(x)
            return _Ref(tid, x._version, x.dtype, tuple(x.size()), tuple(x.stride()), x.storage_offset())

        sargs, skwargs = tree_map(spec, (args, kwargs))
        refs = tuple(x for x in tree_flatten((sargs, skwargs))[0] if isinstance(x, _Ref))
        tid_key = {tid: key for key, tid in keys.items()}
        for tid in targets:
            if tid in info.fresh:
                key = tid_key[tid]
                pos = next(j for j, x in enumerate(out_leaves) if isinstance(x, torch.Tensor)
                           and x.device.type == dev_type and x.untyped_storage()._cdata == key)
                step = _Step(func, sargs, skwargs, i, -1, pos, rng, refs)
            else:
                key = tid_key.get(tid)
                if key is None or key not in version_of:
                    continue  # aliases an output that is not an input: nothing to replay
                step = _Step(func, sargs, skwargs, i, version_of[key], None, rng, refs)
            self.recipes.setdefault(tid, []).append(step)

    def stored(self, tid: int, version: int) -> torch.UntypedStorage | None:
        """A storage already available without recomputation, if any."""
        key = (tid, version)
        g = self.swap_groups.get(key)
        if g is not None:
            if g.remaining <= 0 and g.source is None and g.dev is None:  # consumed already: fetch temporarily
                self.fetch(g)
                storage = self.ready(g)
                self.drop_dev(g)
                return storage
            return self.ready(g)  # still to be unpacked: the fetched copy stays for that
        p = self.kept.get(key)
        if p is not None:
            return p.ref.untyped_storage()
        rg = self.rec_groups.get(key)
        if rg is not None and rg.storage is not None:
            return rg.storage
        return None

    def steps_for(self, tid: int, version: int) -> list[_Step]:
        """The recorded ops that re-create storage ``tid`` as it was at ``version``."""
        steps = self.recipes.get(tid)
        if not steps or steps[0].out_pos is None:
            raise RecomputeError(
                f"cannot recompute {self.index.tensor_label(tid)}: the op that created it was not seen in this "
                f"iteration's forward pass ({self.rt.plan_label()})")
        out = [steps[0]]
        for step in steps[1:]:
            if step.v_before >= version:
                break
            out.append(step)
        return out

    def resolve(self, tid: int, version: int) -> torch.UntypedStorage:
        """The storage of tensor ``tid`` at ``version``: stored, or re-created from its recorded ops.

        Depth-first with an explicit stack (an LSTM's cell state is a chain as
        long as the sequence).  As in the simulator, inputs re-created on the
        way are transient: freed once the target is rebuilt, and re-created
        again when their own turn comes.  With ``keep_recomputed_inputs`` a
        re-created input that the plan removed and whose handles are still to
        be unpacked is kept for them instead (each storage is then recomputed
        once per iteration, holding more memory).
        """
        cache: dict[tuple[int, int], torch.UntypedStorage] = {}
        root = (tid, version)
        stack = [root]
        expanded: set[tuple[int, int]] = set()
        while stack:
            key = stack[-1]
            if key in cache:
                stack.pop()
                continue
            storage = self.stored(*key)
            if storage is not None:
                cache[key] = storage
                stack.pop()
                continue
            steps = self.steps_for(*key)
            missing: list[tuple[int, int]] = []
            for step in steps:
                for ref in step.refs:
                    dep = (ref.tid, ref.version)
                    if ref.tid != key[0] and dep not in cache and dep not in missing:
                        found = self.stored(*dep)
                        if found is not None:
                            cache[dep] = found
                        else:
                            missing.append(dep)
            if missing:
                if key in expanded:
                    raise RecomputeError(f"recomputing {self.index.tensor_label(key[0])} depends on itself "
                                         f"({self.rt.plan_label()})")
                expanded.add(key)
                stack.extend(missing)
                continue
            storage = None
            for step in steps:
                args, kwargs = self.materialize(step, cache, key[0], storage)
                if step.rng is not None:
                    gen, state = step.rng
                    current = gen.get_state()
                    gen.set_state(state)  # the forward's RNG state: dropout draws the same mask
                    try:
                        out = step.func(*args, **kwargs)
                    finally:
                        gen.set_state(current)
                else:
                    out = step.func(*args, **kwargs)
                self.stats.replayed_ops += 1
                if step.out_pos is not None:
                    storage = tree_flatten(out)[0][step.out_pos].untyped_storage()
            assert storage is not None
            cache[key] = storage
            stack.pop()
            rg = self.rec_groups.get(key)
            if (self.rt.keep_recomputed_inputs and rg is not None and key != root and rg.remaining > 0
                    and rg.storage is None):
                rg.storage = storage  # its own unpack comes later in backward: recompute once
                self.stats.recomputed += 1
        return cache[root]

    def materialize(self, step: _Step, cache: dict[tuple[int, int], torch.UntypedStorage],
                    target: int, target_storage: torch.UntypedStorage | None) -> tuple[tuple, dict]:
        def real(x: Any) -> Any:
            if isinstance(x, _Ref):
                if x.tid == target and target_storage is not None:
                    st = target_storage
                else:
                    st = cache[(x.tid, x.version)]
                return _view(st, x.dtype, x.size, x.stride, x.offset)
            if isinstance(x, _Const):
                return x.value
            return x

        args, kwargs = tree_map(real, (step.args, step.kwargs))
        mutated = _mutated_positions(step.func)
        if mutated:
            args = list(args)
            target_key = target_storage._cdata if target_storage is not None else None
            for pos, name in mutated:
                container, where = (args, pos) if pos < len(args) else (kwargs, name)
                if isinstance(container, dict) and where not in container:
                    continue
                arg = container[where]
                if isinstance(arg, torch.Tensor) and arg.untyped_storage()._cdata != target_key:
                    container[where] = arg.clone()  # replay must not touch saved tensors or buffers
            args = tuple(args)
        return args, kwargs

    # ------------------------------------------------------------------ finish
    def finish(self, check: bool) -> None:
        self.poll()
        self.finished = True
        if check and self.n_packed and self.n_packed != self.index.n_saved:
            raise TraceMismatchError(
                f"autograd saved {self.n_packed} tensors in this iteration, the trace recorded "
                f"{self.index.n_saved}: the model or the batch changed since recording ({self.rt.plan_label()}); "
                "record the trace again")

    def describe_position(self) -> str:
        kind, k = self.where
        index = self.index
        if k < 0:
            return "at the start of the iteration"
        tid = int(index.saved_tids[min(k, index.n_saved - 1)])
        phase = "forward pass, saving" if kind == "pack" else "backward pass, restoring"
        near = f"the {phase} saved tensor #{k}: {index.tensor_label(tid)}"
        if self.position >= 0 and kind != "pack" and self.position < index.trace.n_ops:
            near += f"; backward has reached {index.trace.op_label(self.position)}"
        return near


# --------------------------------------------------------------------------- the runtime
class PlannedExecution:
    """Follow ``plan`` (made for ``trace``) in every iteration run inside ``with``.

    Args:
        model: the trained module; its parameters tell the device (``device`` overrides).
        plan: the plan; its fingerprint must be the trace's (``check_plan``).
        trace: the trace the plan was made for, recorded on this model and batch size.
        device: where the model runs; default the model's parameters' device.
        memory_limit: bytes the prefetches may fill on CUDA; default ``plan.memory_limit``.
        expandable_segments: on CUDA, turn on the allocator's expandable segments (default).
        prefetch: issue prefetches ahead of reuse (otherwise every copy back is on demand).
        keep_recomputed_inputs: keep removed tensors re-created as inputs of a recomputation
            until their own reuse (less compute, more memory; the simulator frees them).
        track_storages: keep weak references to every removed storage in
            ``stats.source_refs`` (tests check they were freed).
        check_plan: check the plan against the trace first.

    After each iteration ``stats`` holds its :class:`IterationStats`.
    """

    def __init__(self, model: torch.nn.Module | None, plan: Plan, trace: Trace, *,
                 device: str | torch.device | None = None, memory_limit: int | None = None,
                 expandable_segments: bool = True, prefetch: bool = True, track_storages: bool = False,
                 keep_recomputed_inputs: bool = False, check_plan: bool = True) -> None:
        if check_plan:
            plan.check_trace(trace)
        if device is None:
            params = list(model.parameters()) if model is not None else []
            device = params[0].device if params else torch.device("cpu")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.model = model
        self.plan = plan
        self.trace = trace
        self.memory_limit = int(memory_limit if memory_limit is not None else plan.memory_limit)
        self.index: PlanIndex = build_index(trace, plan, self.memory_limit)
        if self.index.unsupported:
            warnings.warn(f"{len(self.index.unsupported)} of {len(plan.actions)} plan actions name tensors that "
                          "autograd does not save in the forward pass; the runtime cannot carry them out and "
                          "ignores them", RuntimeWarning, stacklevel=2)
        self.prefetch = prefetch
        self.track_storages = track_storages
        self.keep_recomputed_inputs = keep_recomputed_inputs
        self.expandable_segments = bool(self.cuda and expandable_segments and enable_expandable_segments())
        self.pool = HostBufferPool(pin=self.cuda)
        self._d2h: torch.cuda.Stream | None = None
        self._h2d: torch.cuda.Stream | None = None
        self._it: _Iteration | None = None
        self._contexts: list[Any] = []
        self.stats: IterationStats | None = None
        self.iterations = 0

    # ------------------------------------------------------------ streams
    @property
    def d2h_stream(self) -> torch.cuda.Stream:
        if self._d2h is None:
            self._d2h = torch.cuda.Stream(device=self.device)
        return self._d2h

    @property
    def h2d_stream(self) -> torch.cuda.Stream:
        if self._h2d is None:
            self._h2d = torch.cuda.Stream(device=self.device)
        return self._h2d

    def plan_label(self) -> str:
        p = self.plan
        return (f"plan of planner {p.planner!r}: {p.n_swap} swaps, {p.n_recompute} recomputes, limit "
                f"{format_bytes(p.memory_limit)}, trace {p.trace_fingerprint}")

    # ------------------------------------------------------------ context
    def __enter__(self) -> "PlannedExecution":
        if self._it is not None:
            raise RuntimeError("PlannedExecution is already active: one `with` block per iteration, not nested")
        it = _Iteration(self)
        self._it = it
        hooks = torch.autograd.graph.saved_tensors_hooks(it.pack, it.unpack)
        hooks.__enter__()
        self._contexts = [hooks]
        if self.index.recompute:
            mode = _RecipeMode(it)
            mode.__enter__()
            self._contexts.append(mode)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        it = self._it
        assert it is not None
        for ctx in reversed(self._contexts):
            ctx.__exit__(None, None, None)
        self._contexts = []
        self._it = None
        self.iterations += 1
        self.stats = it.stats
        if exc is not None and isinstance(exc, torch.OutOfMemoryError) and not isinstance(exc, PlannedOutOfMemoryError):
            it.finish(False)
            raise PlannedOutOfMemoryError(self.describe_oom(it, exc)) from exc
        it.finish(exc is None)

    def wrap(self, step: Callable[P, R]) -> Callable[P, R]:
        """``step`` (forward and backward of one iteration) run under this plan."""

        @functools.wraps(step)
        def planned(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return step(*args, **kwargs)

        return planned

    def describe_oom(self, it: _Iteration, exc: BaseException) -> str:
        if self.cuda:
            mem = (f"allocated {format_bytes(torch.cuda.memory_allocated(self.device))}, reserved "
                   f"{format_bytes(torch.cuda.memory_reserved(self.device))}")
        else:
            mem = "host memory"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (f"out of memory in the {it.describe_position()}, following the {self.plan_label()}; {mem}, "
                f"of which the runtime holds {format_bytes(it.stats.held_bytes)} (copies in flight, prefetched); "
                f"planned peak {format_bytes(self.plan.figures.get('peak_bytes', self.plan.memory_limit))}. "
                f"Cause: {first}")

    # ------------------------------------------------------------ groups
    def _release_group(self, g: _SwapGroup) -> None:
        """A swap group died (autograd freed its graph): its host buffer goes back to the pool."""
        if g.host is not None:
            event = g.h2d_event if g.h2d_event is not None else g.d2h_event
            self.pool.release(g.host, event)
            g.host = None

    def summary(self) -> dict[str, Any]:
        """The plan as carried out and the last iteration's figures."""
        idx = self.index
        return {
            "plan": self.plan_label(),
            "device": str(self.device),
            "swap_tensors": len(idx.swap),
            "recompute_tensors": len(idx.recompute),
            "unsupported_actions": len(idx.unsupported),
            "expandable_segments": self.expandable_segments,
            "pinned_pool_bytes": self.pool.allocated_bytes,
            "iterations": self.iterations,
            "last": self.stats.as_dict() if self.stats else None,
        }


def prefetch_positions(trace: Trace, plan: Plan, memory_limit: int | None = None) -> dict[int, int]:
    """The backward op at which each swapped tensor's prefetch is issued (for inspection)."""
    return dict(build_index(trace, plan, memory_limit).prefetch_op)


__all__ = ["HostBufferPool", "IterationStats", "PlannedExecution", "PlannedOutOfMemoryError", "RecomputeError",
           "TraceMismatchError", "enable_expandable_segments", "prefetch_positions"]
