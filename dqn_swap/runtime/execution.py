"""Follow a plan inside real PyTorch training: swap saved activations to host memory and
recompute the ones the plan removes, in every iteration, exactly as the plan's schedule says.

Usage (one iteration per ``with`` block; the object is reused across iterations)::

    runtime = PlannedExecution(model, plan, trace)
    for batch, target in loader:
        with runtime:
            loss = loss_fn(model(batch), target)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

The runtime applies; it does not plan.  The simulator decided when each
prefetch starts and which re-runs happen before which op, and wrote it into
the plan (:class:`~dqn_swap.plan.Schedule`); :mod:`.index` says where in a
live iteration each decision applies.

How the live iteration is matched to the trace
----------------------------------------------
Autograd hands every tensor it saves for backward to the pack hook of
:func:`torch.autograd.graph.saved_tensors_hooks`.  The recorder numbered those
calls; the ``k``-th call of a live iteration therefore packs
``trace.saved[k]``.  Every pack is checked against what the recorder saw at
that pack (shape, dtype and storage size: exact for a trace recorded on the CPU
or ``meta``, in the allocator's 512-byte blocks for one recorded on CUDA;
storage sizes only for trace files written before shapes were recorded; the
same tensor id keeps the same storage), before the runtime acts on the tensor; so are the
number of packs (a pack beyond the trace's count, e.g. a second forward pass
in one block, at once; fewer at the block's end) and, with ``check="ops"`` (the
default), the name of every forward op the dispatch mode numbers from the module
calls, and the op count at every module call.  An op the trace does not have is
seen even where it saves nothing (``torch.tanh(x) + 1`` where the trace has
``tanh`` alone), and so is a mask or a layer that the data switches on: a plan
keeps its limit only on the iteration it was made for, whatever it does.  A
model that no longer matches its trace (another head, another batch size,
another model) raises :class:`TraceMismatchError` at the first difference, in
one line (or goes on in safe mode, ``on_mismatch="safe"``).  The hooks
therefore stay on for the whole block.  The op check costs the step a Python
dispatch per forward op (measured on the CPU, one thread: ``python
benchmarks/bench_runtime.py overhead``).  With ``check="packs"`` ops are numbered
only where a re-run needs them, and a plan without actions checks the first pack
only (the batch, usually) and then takes its hooks off.  Only tensors on the
runtime's device count, as in the recorder.  A pack the plan does nothing with
costs the check and a list lookup: the tensor itself is handed back to autograd.

A plan the simulator found infeasible (``plan.figures["feasible"]`` false) is
refused (:class:`InfeasiblePlanError`) unless ``allow_infeasible=True``.

Swap (:mod:`.swap`)
-------------------
The pack hook copies the whole storage into a pooled host buffer on a side
stream and returns a handle, so autograd no longer holds the device memory;
the runtime keeps the device bytes until the copy has completed, and bounds
the bytes in such copies at the most the simulator had.  The host waits for a
copy out where the simulation counts its bytes free
(:func:`dqn_swap.simulator.swap_out_releases`, the last pack or unpack before
that op): a host that ran ahead of the device would otherwise allocate for
later ops while the copies still hold their sources, and the caching
allocator's peak would be far above the plan's (on an H100, ResNet-50 at batch
64 planned for 2.59 GiB peaked at 4.60 GiB, unplanned 5.18; waiting, 2.48 GiB on
an H200).  A swapped input (the
batch, the labels) is the caller's storage: it is emptied only while nothing
outside autograd and the runtime holds it, so whatever the training loop reads
between forward and backward is whole; one the loop holds frees nothing (one
:class:`HeldInputWarning`; later iterations skip its copy).  Prefetches start, in
the schedule's order, at the first pack or unpack at or after their op
(progress through backward comes from the unpack hooks: every autograd node
unpacks its saved tensors right before it runs); the head of the queue waits
for its copy out to complete, as in the simulator.

Recompute (:mod:`.recompute`)
-----------------------------
A removed tensor is not saved.  The forward ops the schedule re-runs are
recorded by a dispatch mode that is on only around them; at the unpack of a
removed tensor the runtime re-runs the schedule's sequence for it, keeping
what it keeps and freeing what it frees.  Re-runs never change model state
(written arguments are copies, persistent tensors are read as the forward
pass read them) and draw the forward pass's random numbers.

Devices (:mod:`.backend`)
-------------------------
CUDA, the CPU (synchronous copies; exactness is tested on every machine) and
a stand-in device with late copies and a checker (:mod:`.standin`).
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..errors import DqnSwapInputError, DqnSwapRuntimeError
from ..threads import module_call_hooks
from ..limits import LimitSpec, resolve_limit
from ..meter import gradient_bytes
from ..ops import node_name
from ..plan import Plan
from ..support import COMPILED_STEP, fsdp_param_groups, under_torch_compile, unsupported_reason
from ..trace import Trace, format_bytes
from .backend import Backend, backend_for
from .offload import HostOffload, Offloaded, persistent_storages
from .index import NO_OP, PROGRESS, RECOMPUTE, SIZE_QUANTUM, SWAP, TRACK, PlanIndex, build_index, with_releases
from .recompute import OpRecorder, RecomputeError, RecordMode, TraceMismatchError, view_of
from .swap import SwapGroup, Swapper

P = ParamSpec("P")
R = TypeVar("R")


#: What a live iteration that is not the plan's trace does: stop (``TraceMismatchError``) or go on in
#: safe mode from there (:mod:`.offload`).
ON_MISMATCH = ("raise", "safe")
SHAPES = ("exact", "bounded")
CHECKS = ("ops", "packs")


class PlannedOutOfMemoryError(DqnSwapRuntimeError, torch.OutOfMemoryError):
    """An allocation failed under a plan; the message names the op, the plan and the memory in use."""


class UnsupportedTrainingError(DqnSwapRuntimeError):
    """The training setup is one the runtime cannot follow a plan in (the message says which and why)."""


class InfeasiblePlanError(DqnSwapInputError):
    """The plan's own figures say the simulator found it infeasible (``plan.figures["feasible"]`` false):
    following it would not stay under its limit.  ``PlannedExecution(..., allow_infeasible=True)`` runs it."""


class HeldInputWarning(UserWarning):
    """A swapped input stayed held by the training loop through the forward pass: the runtime
    left it on the device (nothing freed) and skips its copy in later iterations."""


def _describe(dtype: Any, shape: tuple[int, ...] | None, nbytes: int | None) -> str:
    """``float32[2, 4]``, with the storage's bytes where they are what differs."""
    name = str(dtype).removeprefix("torch.") if dtype is not None else "a tensor"
    dims = f"[{', '.join(map(str, shape))}]" if shape is not None else ""
    return f"{name}{dims}" + (f" in a storage of {nbytes} B" if nbytes is not None else "")


def enable_expandable_segments() -> bool:
    """Turn on the CUDA caching allocator's expandable segments (the counterpart of the window
    paper's virtual addressing: freed blocks coalesce, so swapping does not fragment memory).

    Affects segments allocated afterwards; returns whether it was applied.
    """
    if not torch.cuda.is_available():
        return False
    settings = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # torch >= 2.10; the old one warns
    (settings or torch.cuda.memory._set_allocator_settings)("expandable_segments:True")
    return True


def refuse_unsupported(model: torch.nn.Module | None) -> None:
    """Raise :class:`UnsupportedTrainingError` for models the runtime cannot follow a plan in
    (:mod:`dqn_swap.support`: torch.compile, FSDP1, FSDP2 compositions other than ``fully_shard``
    on a one-dimensional mesh)."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise UnsupportedTrainingError(reason)


class _StepOwner:
    """The one thread that may run planned (or recorded) steps at a time, re-entrant within it.

    The hooks a planned step relies on are the process's: module forward hooks
    (``register_module_forward_pre_hook``, by which the runtime numbers ops and the recorder marks
    module calls) fire for every module in every thread, and recording in the user's loop marks
    ``torch.autograd.backward`` for the process.  A second thread's model would be numbered into
    the first's iteration.  So a step begun while another thread is inside one is refused with one
    line, instead of training wrongly or crashing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: int | None = None
        self.depth = 0

    def enter(self) -> None:
        me = threading.get_ident()
        with self.lock:
            if self.owner is not None and self.owner != me:
                raise UnsupportedTrainingError(
                    "another thread is inside a planned step: dqn-swap follows one planned step at a time per "
                    "process (its hooks are process-wide); run planned models one after the other, or in "
                    "separate processes")
            self.owner = me
            self.depth += 1

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth <= 0:
                self.owner, self.depth = None, 0


#: The process's :class:`_StepOwner` (``PlannedExecution`` and ``dqn_swap.autoplan`` steps).
STEP_OWNER = _StepOwner()


# --------------------------------------------------------------------------- handles
KEEP, SWAPPED, REMOVED = 0, 1, 2
_WRAPPERS = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


class _Packed:
    """What autograd keeps instead of a saved tensor the runtime acts on or watches."""

    __slots__ = ("it", "kind", "ref", "tid", "index", "dtype", "size", "stride", "offset", "__weakref__")

    def __init__(self, it: "_Iteration", kind: int, ref: Any, tid: int, index: int, t: torch.Tensor) -> None:
        self.it, self.kind, self.ref, self.tid, self.index = it, kind, ref, tid, index
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()


class _Kept:
    """A saved tensor the plan keeps on the device, held for autograd where the step may leave its
    plan midway (``on_mismatch="safe"``): then it goes to the host (:meth:`_Iteration.evict_kept`),
    and comes back at its unpack."""

    __slots__ = ("t", "tid", "version", "__weakref__")

    def __init__(self, t: torch.Tensor, tid: int) -> None:
        self.t: Any = t
        self.tid, self.version = tid, t._version


class _RecomputeGroup:
    """One removed storage; the re-created storage is shared by the handles that have not unpacked."""

    __slots__ = ("tid", "remaining", "packs", "storage")

    def __init__(self, tid: int) -> None:
        self.tid, self.remaining, self.packs = tid, 0, 0
        self.storage: torch.UntypedStorage | None = None


class _FsdpFirstGather:
    """FSDP2's first all-gather into a parameter makes its unsharded storage with ``torch.empty``
    (``FSDPParam.init_all_gather_outputs``); later ones resize that storage, which is no op.  The
    trace is a steady-state iteration, so in an iteration where FSDP still has to make some, the
    op numbering pauses while it does (per parameter, an instance attribute shadowing the method,
    removed when the iteration ends): a model sharded and planned before its first step numbers
    its ops as the trace does."""

    def __init__(self, it: "_Iteration", model: torch.nn.Module | None) -> None:
        self.patched: list[Any] = []
        for group in fsdp_param_groups(model):
            for p in group.fsdp_params:
                if not p.all_gather_outputs:
                    p.init_all_gather_outputs = self._paused(it, p.init_all_gather_outputs)
                    self.patched.append(p)

    @staticmethod
    def _paused(it: "_Iteration", init: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any, **kwargs: Any) -> None:
            before, it.paused = it.paused, True
            try:
                init(*args, **kwargs)
            finally:
                it.paused = before

        return run

    def close(self) -> None:
        for p in self.patched:
            vars(p).pop("init_all_gather_outputs", None)
        self.patched.clear()


# --------------------------------------------------------------------------- statistics
@dataclass
class IterationStats:
    """Bookkeeping of one planned iteration (all byte counts are device bytes)."""

    packed: int = 0
    expected_packs: int = 0
    swapped: int = 0  # distinct storages copied out
    swapped_bytes: int = 0
    borrowed_inputs: int = 0  # swapped inputs copied out: the caller's storages, emptied if nothing else holds them
    emptied_inputs: int = 0  # swapped inputs emptied until their copy back (nothing outside held them)
    released_after_copy: int = 0  # storages whose device reference the runtime dropped after the copy
    recompute_removed: int = 0  # distinct storages not saved
    recompute_removed_bytes: int = 0
    recomputed: int = 0  # removed storages re-created in backward
    sequences_run: int = 0  # schedule sequences re-run
    replayed_ops: int = 0
    replay_seconds: float = 0.0  # wall time of the re-runs (their kernels and the runtime's work around them)
    prefetches: int = 0
    on_demand_fetches: int = 0  # fetched at reuse: no prefetch had been issued
    read_before_copied_out: int = 0  # needed while its copy out still ran: read from the device bytes held
    deferred_prefetches: int = 0  # a prefetch waited for its copy out, or for device memory
    bound_waits: int = 0  # copies out that waited for older ones (the in-flight bound)
    release_waits: int = 0  # copies out the host waited for, to free their bytes where the plan does
    release_wait_seconds: float = 0.0  # host time spent in those waits
    hooks_off_after: int = -1  # an empty plan: the pack after which the hooks came off (else on throughout)
    held_inputs: int = 0  # swapped inputs the training loop held through the forward pass: not emptied
    held_inputs_skipped: int = 0  # swapped inputs not copied: held in an earlier iteration (HeldInputWarning)
    held_bytes: int = 0  # device bytes the runtime references at the end of the iteration
    peak_held_bytes: int = 0
    diverged_at: int = -1  # safe mode: the pack at which the live iteration left the trace (-1: it did not)
    safe_packs: int = 0  # packs made in safe mode (every one to the host until backward needs it)
    safe_bytes: int = 0  # bytes safe mode copied to the host
    evicted: int = 0  # saved tensors the plan kept on the device, sent to the host as the step left its plan
    evicted_bytes: int = 0  # their storages' bytes copied then
    divergence: str = ""  # what differed, in one line (empty: nothing)
    prefetch_log: list[tuple[int, int]] = field(default_factory=list)  # (tensor id, op reached) in issue order
    source_refs: list[StorageWeakRef] = field(default_factory=list)  # with track_storages: removed originals

    def as_dict(self) -> dict[str, int | float]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, (int, float))}

    @property
    def diverged(self) -> bool:
        """Whether the iteration left the plan's trace (and ran on in safe mode from there)."""
        return bool(self.divergence)


# --------------------------------------------------------------------------- one iteration
class _Iteration:
    """State of one planned iteration; handles keep it alive until autograd frees the graph."""

    def __init__(self, rt: "PlannedExecution") -> None:
        self.rt = rt
        self.index: PlanIndex = rt.index
        self.swapper = rt.swapper
        self.flags = rt.index.pack_flags
        self.n_saved = rt.index.n_saved
        self.dev_type = rt.device.type
        self.cuda = rt.device.type == "cuda"
        self.expected = rt.expected  # per pack: (dtype, shape, storage size bounds) the recorder saw
        self.hooks_pushed = False
        self.stats = IterationStats(expected_packs=self.n_saved)
        self.n_packed = 0
        self.paused = False
        self.forward_done = False
        self.tid_key: dict[int, int] = {}
        self.swap_groups: dict[tuple[int, int], SwapGroup] = {}
        self.groups_by_tid: dict[int, list[SwapGroup]] = {}
        self.rec_groups: dict[int, _RecomputeGroup] = {}
        self.kept: dict[int, list[tuple[Any, int]]] = {}  # watched tensor id -> [(weak ref, version)] per pack
        # with on_mismatch="safe": every saved tensor kept on the device (its holder, weakly), to send to the
        # host if the step leaves its plan; and those sent, by (tensor id, version), for re-runs that read them
        self.evictable: list[Any] | None = [] if rt.safe_on_mismatch else None
        self.evicted: dict[tuple[int, int], Offloaded] = {}
        self.recreated: dict[int, StorageWeakRef] = {}  # re-created storages, while alive
        self.sequences_done: set[int] = set()
        self.position = -1  # op reached (trace op index)
        self.prefetch_ptr = 0
        self.outside_bytes = 0  # device bytes allocated outside the trace as the iteration began
        self.release_ptr = 0  # into index.release_ops: the copies out waited for so far
        self.release_next = rt.index.release_ops[0] if rt.index.release_ops else NO_OP
        self.late_releases: set[int] = set()  # due before their copy out even started: waited for then
        self.where: tuple[str, int] = ("forward", -1)
        self.recorder = OpRecorder(self) if rt.index.record_ops else None
        self.record_ops = rt.index.record_ops
        self.expected_names = rt.op_names
        self.mode = RecordMode(self) if rt.index.windows else None
        self.windows = {w.call: w for w in rt.index.windows}
        self.calls = 0  # module calls of the forward pass so far
        self.pack_op = rt.index.trace.saved_op.tolist()  # pack k happens while op pack_op[k] runs
        self.unpack_position = rt.index.unpack_position  # unpack k happens before op unpack_position[k]
        self.pending_borrowed: list[tuple[SwapGroup, int]] = []  # swapped inputs not emptied yet
        self.emptied_before = rt.swapper.emptied_borrowed
        self.module_done_hook: Any = None  # while some are pending: a module returned, so their ops ran
        # removed tensors whose bytes the simulation frees when their holder outside autograd lets go
        # (PlanIndex.held_removed): (that op, their storage, their swap group, None if recomputed)
        self.held_removed: list[tuple[int, StorageWeakRef, SwapGroup | None]] = []
        self.fsdp_first_gather: _FsdpFirstGather | None = None  # FSDP2 makes its gather storages (a first step)
        self.safe: HostOffload | None = None  # safe mode, from the point where the iteration left the trace

    def module_call(self, module: torch.nn.Module, args: Any) -> None:
        """A module's forward begins (no op is under way): start or stop numbering ops here."""
        if self.forward_done or self.safe is not None or isinstance(module, _WRAPPERS):
            return
        mode = self.mode
        assert mode is not None
        j = self.calls
        self.calls = j + 1
        w = self.windows.get(j)
        if w is None and j == 0:
            w = self.windows.get(-1)  # a trace without anchors: ops count from the first module call
        if w is not None:
            mode.start(w.start, w.end)
        elif mode.pushed and mode.finished:
            mode.stop()  # the window's last op has been recorded: ops run at full speed again

    # ------------------------------------------------------------------ pack
    def pack(self, t: torch.Tensor) -> Any:
        if t.is_cuda is not self.cuda:
            return t  # another device: the recorder neither counted nor tracked it
        if torch._C._current_graph_task_id() != -1:
            return t  # a graph made inside backward (reentrant checkpointing): no pack of the trace's
        k = self.n_packed
        self.n_packed = k + 1
        if self.safe is None:
            if k >= self.n_saved:
                self.too_many_packs()
            else:
                self.check(k, t)  # the live check, before anything acts on this tensor
        if self.safe is not None:
            return self.safe_pack(t)
        if self.pending_borrowed:
            self.release_borrowed(self.pack_op[k])
        mode = self.mode
        if mode is not None and mode.pushed and mode.finished:
            mode.stop()  # the window's last op has been recorded: ops run at full speed again
        f = self.flags[k]
        # Releases are due at the pack's horizon (the last point of control before the op that counts
        # on their bytes), unless the dispatch mode is numbering every op: then each is done right
        # before its own op (release_before), as the simulator has it, up to the last pack.
        per_op = mode is not None and mode.pushed and not mode.finished and k < self.n_saved - 1
        due = not per_op and self.release_next != NO_OP and self.release_next <= self.index.pack_horizon[k]
        if f == 0:
            if k == self.n_saved - 1:
                self.end_of_forward()
            if not due:
                t = t.detach() if t.requires_grad else t  # see check_pack
                return t if self.evictable is None else self.keep(t, k)
        self.where = ("pack", k)
        self.paused = True
        try:
            with torch.no_grad():
                packed = self._pack(t, k, f) if f else (t.detach() if t.requires_grad else t)
                if due:
                    self.enforce_releases(self.index.pack_horizon[k])
        finally:
            self.paused = False
        if self.evictable is None:
            return packed
        if isinstance(packed, torch.Tensor):
            return self.keep(packed, k)
        if type(packed) is _Packed and packed.kind == KEEP:
            self.evictable.append(weakref.ref(packed))
        return packed

    def keep(self, t: torch.Tensor, k: int) -> Any:
        """What autograd holds for pack ``k``, kept on the device, where the step may leave its plan: a
        holder the runtime can empty then (``t`` itself where it never would)."""
        if t.device.type != self.dev_type or isinstance(t, torch.nn.Parameter):
            return t
        holder = _Kept(t, int(self.index.saved_tids[k]))
        self.evictable.append(weakref.ref(holder))
        return holder

    def evict_kept(self) -> None:
        """The step left its plan: what the plan kept on the device until now goes to the host, as safe
        mode would have sent it at its pack (``offload.py``), so that the rest of the step runs with
        the device holding what a step in safe mode from its start holds.  A tensor something else
        still holds (an output in use, the loop's own reference) frees nothing by it: those holders
        are in the minimum, as for safe mode."""
        assert self.safe is not None
        for ref in self.evictable or ():
            holder = ref()
            if holder is None:
                continue  # its node ran: autograd let go of it
            is_kept = type(holder) is _Kept
            x = holder.t if is_kept else holder.ref
            if not isinstance(x, torch.Tensor) or not self.safe.offloadable(x):
                continue
            before = self.safe.copied_bytes
            with torch.no_grad():
                off = self.safe.pack(x)
            if is_kept:
                holder.t = off
                key = (holder.tid, holder.version)
            else:
                holder.ref = off
                key = (holder.tid, x._version)
            self.evicted[key] = off
            self.stats.evicted += 1
            self.stats.evicted_bytes += self.safe.copied_bytes - before
        self.evictable = None

    def release_before(self, op: int) -> None:
        """Op ``op`` of the forward pass is about to run (the dispatch mode numbers every op): the
        releases due by then are done now, not at the point of control before it.

        Sync: as in :meth:`enforce_releases`, but exactly where the simulator has the op wait for
        the bytes, so the ops in between have been issued (on CUDA, queued) before the host waits."""
        self.paused = True
        try:
            with torch.no_grad():
                self.enforce_releases(op)
        finally:
            self.paused = False

    def enforce_releases(self, horizon: int) -> None:
        """Free now the device bytes of every swapped tensor the simulation counts as free by op
        ``horizon`` (:func:`dqn_swap.simulator.swap_out_releases`), waiting on the host for copies
        out still running.

        Sync: the plan's memory is the simulator's, in which a swapped tensor's bytes are free once
        its copy out has ended and an op that needs them waits for that.  The caching allocator
        counts on the host's timeline, and a host that runs ahead of the device (CUDA queues kernels
        and returns) would allocate for later ops while the copies still hold their sources: the
        peak would be the unplanned one, whatever the plan.  So the host waits here, at the last
        point of control before the op that counts on the bytes (the horizon, index.with_releases).
        A tensor whose copy out has not started yet (saved later than the simulator swaps it) is
        waited for right after its copy starts (``late_releases``).
        """
        ops, tids = self.index.release_ops, self.index.release_tids
        i, n = self.release_ptr, len(ops)
        waited = False
        while i < n and ops[i] <= horizon:
            groups = self.groups_by_tid.get(tids[i])
            if groups is None:
                self.late_releases.add(tids[i])
            else:
                for g in groups:
                    waited |= self.wait_copy_out(g)
            i += 1
        self.release_ptr = i
        self.release_next = ops[i] if i < n else NO_OP
        if waited:
            self.stats.released_after_copy += self.swapper.poll()

    def wait_copy_out(self, g: SwapGroup) -> bool:
        """Block the host until ``g``'s copy out has ended (see :meth:`enforce_releases`); returns
        whether its device bytes are now ready to be released."""
        if g.source is None or g.d2h_event is None:
            return False
        if not g.d2h_event.query():
            start = time.perf_counter()
            g.d2h_event.synchronize()
            self.stats.release_waits += 1
            self.stats.release_wait_seconds += time.perf_counter() - start
        return True

    def check(self, k: int, t: torch.Tensor) -> None:
        """The live check: what autograd saves at pack ``k`` must be what the recorder saw there
        (shape, dtype, storage size); the first difference stops the iteration (:meth:`mismatch`)."""
        dtype, shape, size, below = self.expected[k]
        if dtype is not None and t.dtype is not dtype:
            return self.mismatch(k, t)
        bounded = self.rt.bounded
        if shape is not None and t.shape != shape and not (
                bounded and len(t.shape) == len(shape) and all(a <= b for a, b in zip(t.shape, shape))):
            return self.mismatch(k, t)
        nbytes = t.untyped_storage().nbytes()
        if nbytes > size or (nbytes <= below and not bounded):
            return self.mismatch(k, t)
        nodes = self.rt.expected_nodes
        if nodes is not None:
            name = node_name(t)
            if name != nodes[k] and nodes[k] is not None:
                self.diverge(
                    f"{self.index.pack_label(k)} was made by {nodes[k] or 'no autograd node'} when the trace was "
                    f"recorded and by {name or 'no autograd node'} now: this iteration runs other ops than the "
                    "trace")

    def check_pack(self, t: torch.Tensor) -> torch.Tensor:
        """The pack hook of a plan without actions.  With ops checked (``check="ops"``) every pack
        is checked and the hooks stay on, so that an iteration that leaves the trace goes on in
        safe mode from there.  Otherwise the first pack alone (the batch, usually), then the hooks
        come off: checking every pack would cost an empty plan 3-5 % of a step (measured on the
        CPU).  Ours are on top: this runs in our pack hook."""
        if t.is_cuda is not self.cuda or torch._C._current_graph_task_id() != -1:
            return t
        k = self.n_packed
        self.n_packed = k + 1
        if self.safe is None:
            if k >= self.n_saved:
                self.too_many_packs()
            else:
                self.check(k, t)
        if self.safe is not None:  # not the trace's iteration: the hooks stay on, in safe mode
            return self.safe_pack(t)
        if self.mode is not None:  # ops checked: the hooks stay on (docstring)
            if k == self.n_saved - 1:
                self.end_of_forward()
            return t.detach() if t.requires_grad else t
        torch._C._autograd._pop_saved_tensors_default_hooks()
        self.hooks_pushed = False
        self.stats.hooks_off_after = k
        # Not ``t`` itself: an output its own node saves would then hold that node through its
        # ``grad_fn``, a reference cycle through C++ that no collector sees, and a graph dropped
        # without backward (an exception, a forward pass only) would never be freed.  The alias
        # shares storage and version counter and holds no graph.
        return t.detach() if t.requires_grad else t

    def too_many_packs(self) -> None:
        self.diverge(f"autograd saved more than the {self.n_saved} tensors the trace recorded for one iteration "
                     "(a second forward pass in one `with` block, or other ops than the trace's)",
                     "run one forward and backward per block, or record the trace again")

    # -------------------------------------------------------------- safe mode
    def diverge(self, what: str, advice: str = "record the trace again and re-plan") -> None:
        """The live iteration is not the plan's trace (``what`` says where and how).  Without
        ``on_mismatch="safe"`` that stops it (:class:`TraceMismatchError`); with it, the iteration
        goes on in safe mode (:meth:`enter_safe`)."""
        if self.safe is not None:
            return
        if not self.rt.safe_on_mismatch:
            raise TraceMismatchError(f"{what} ({self.rt.plan_label()}); {advice}")
        self.enter_safe(what)

    def enter_safe(self, what: str) -> None:
        """From here on, every saved tensor goes to the host until backward needs it
        (:mod:`.offload`); whatever the plan did before is carried out as planned: swapped tensors
        come back on demand at their unpack, removed ones are re-run from the ops recorded before
        this point.

        Nothing is prefetched any more (a prefetch would bring bytes back before they are needed),
        and the copies out still running are waited for, so that their device bytes are free when
        the unknown part of the iteration runs.  A removed tensor whose re-run needs an op not
        recorded by now cannot be re-created: that stops the iteration (its bytes are gone).
        """
        it_stats = self.stats
        it_stats.divergence = what
        it_stats.diverged_at = self.n_packed - 1
        recorder = self.recorder
        for tid, rg in self.rec_groups.items():
            if rg.remaining <= 0:
                continue
            seq = self.index.sequence_of.get(tid)
            steps = self.index.sequences[seq][1] if seq is not None else ()
            missing = [s.op for s in steps if recorder is None or s.op not in recorder.ops]
            if seq is None or missing:
                raise TraceMismatchError(
                    f"{what}; the plan had already removed {self.index.tensor_label(tid)}, whose re-run needs "
                    f"{self.index.trace.op_label(missing[0]) if missing else 'a schedule entry'} from past that "
                    f"point, so the iteration cannot go on ({self.rt.plan_label()}); record the trace again")
        if self.mode is not None:
            self.mode.stop()
        # Sync: the plan's copies out still running hold their sources' device bytes; the rest of the
        # iteration is not the trace, so the simulator's point of release no longer applies: they are
        # released now, before the unknown ops allocate.
        self.swapper.synchronize()
        self.stats.released_after_copy += self.swapper.poll()
        self.release_ptr = len(self.index.release_ops)
        self.release_next = NO_OP
        self.prefetch_ptr = len(self.index.prefetch)
        self.safe = HostOffload(self.rt.device, persistent_storages(self.rt.model))
        self.evict_kept()

    def safe_pack(self, t: torch.Tensor) -> Any:
        assert self.safe is not None
        if self.mode is not None and self.mode.pushed:
            self.mode.stop()  # diverged inside the mode's own dispatch: it comes off here
        before = self.safe.copied_bytes
        with torch.no_grad():
            packed = self.safe.pack(t)
        self.stats.safe_packs += 1
        self.stats.safe_bytes += self.safe.copied_bytes - before
        return packed

    def mismatch(self, k: int, t: torch.Tensor) -> None:
        """Pack ``k`` is not what the recorder saw there: stop before the runtime acts on it."""
        dtype, shape, size, _ = self.expected[k]
        nbytes = t.untyped_storage().nbytes()
        same_kind = (shape is None or t.shape == shape) and (dtype is None or t.dtype is dtype)
        was = _describe(dtype, shape, size if same_kind else None)
        now = _describe(t.dtype, tuple(t.shape) if shape is not None else None, nbytes if same_kind else None)
        self.diverge(f"{self.index.pack_label(k)} was {was} when the trace was recorded and is {now} now: the "
                     "batch or the model differs from the recorded iteration")

    def release_borrowed(self, op: int, final: bool = False) -> None:
        """Ops before ``op`` have run: swapped inputs they saved may be emptied (:mod:`.swap`).

        Autograd packs an op's inputs before the op runs, so the runtime learns that the op is
        over from the first of: a module's forward beginning or returning (no op is under way
        then), the next pack in a later op, backward's first unpack, the block's end.  The trace
        lets a plan swap only inputs for which one of the first two comes before the next op's
        kernel (:attr:`dqn_swap.trace.Trace.movable`).

        An input is emptied only while nothing outside autograd and the runtime holds its storage
        (:meth:`.Swapper.empty_borrowed`); one still held is tried again at every later point of the
        forward pass (the model's own frames let go of its arguments when it returns).  At
        ``final`` (backward's first unpack, the block's end) the runtime gives up on those: they
        stay the caller's, whole, and are reported once (:meth:`report_held`).
        """
        still = []
        for g, saved_at in self.pending_borrowed:
            if saved_at < op:
                g.op_done = True
                if self.swapper.empty_borrowed(g) or g.borrowed is None or g.remaining <= 0 or g.dev is not None:
                    continue  # empty now, or backward has it already
                if final:
                    if g.held:
                        self.report_held(g)
                    continue  # a copy out still in flight: poll() empties it when it completes
            still.append((g, saved_at))
        self.pending_borrowed = still
        if not still and self.module_done_hook is not None:
            self.module_done_hook.remove()
            self.module_done_hook = None

    def report_held(self, g: SwapGroup) -> None:
        """A swapped input stayed held by the training loop through the forward pass: it was not
        emptied (the plan's saving on it did not happen) and later iterations skip its copy."""
        rt = self.rt
        self.stats.held_inputs += 1
        if g.tid in rt.held_inputs:
            return
        rt.held_inputs.add(g.tid)
        counted = format_bytes(int(self.index.trace.tensor_nbytes[g.tid]))
        warnings.warn(
            f"the plan swaps the input {self.index.tensor_label(g.tid)} and counted on freeing its {counted} "
            "during the iteration, but the training loop holds it between forward and backward: the runtime "
            "leaves it on the device, untouched, and skips its copy from now on; let the iteration hold the "
            f"only reference (e.g. model(batch.pop())) to free it ({rt.plan_label()})",
            HeldInputWarning, stacklevel=2)

    def module_done(self, module: torch.nn.Module, *args: Any) -> None:
        """A module's forward begins or returns: no op is under way, every op packed so far has run."""
        if self.pending_borrowed:
            self.release_borrowed(NO_OP)

    def _pack(self, t: torch.Tensor, k: int, f: int) -> Any:
        index, rt = self.index, self.rt
        tid = int(index.saved_tids[k])
        packed: Any = t
        if f & SWAP and rt.held_inputs and tid in rt.held_inputs:
            f &= ~SWAP  # an input the loop held in an earlier iteration: its copy would free nothing
            self.stats.held_inputs_skipped += 1
        if f & (SWAP | RECOMPUTE):
            storage = t.untyped_storage()
            nbytes = storage.nbytes()  # checked against the trace in pack()
            key = storage._cdata
            if self.tid_key.setdefault(tid, key) != key:
                self.diverge(f"saved tensor #{k} is a different storage than earlier saves of "
                             f"{index.tensor_label(tid)}: this iteration runs other ops than the trace")
                return self.safe_pack(t)
            if f & SWAP:
                version = t._version
                group = self.swap_groups.get((tid, version))
                if group is None:
                    group = SwapGroup(self.swapper, tid, version, nbytes)
                    self.swap_groups[(tid, version)] = group
                    self.groups_by_tid.setdefault(tid, []).append(group)
                    borrowed = index.is_persistent(tid)  # an input: the caller's storage (swap.py)
                    if borrowed and not storage.resizable():
                        raise UnsupportedTrainingError(
                            f"the plan swaps the input {index.tensor_label(tid)}, whose storage cannot be "
                            "freed (not resizable: made from a NumPy array or shared memory?); pass a copy "
                            "that owns its memory, e.g. batch.clone()")
                    self.swapper.swap_out(group, storage, borrowed=borrowed)
                    self.watch_holder(tid, storage, group)
                    self.stats.swapped += 1
                    if tid in self.late_releases and self.wait_copy_out(group):
                        self.stats.released_after_copy += self.swapper.poll()
                    if borrowed:
                        group.watch = weakref.ref(t)  # if it stays the caller's: backward checks its version
                        self.stats.borrowed_inputs += 1
                        self.pending_borrowed.append((group, self.pack_op[k]))
                        if self.module_done_hook is None:
                            self.module_done_hook = module_call_hooks(self.module_done, post=True)
                    self.stats.swapped_bytes += nbytes
                    if rt.track_storages:
                        self.stats.source_refs.append(StorageWeakRef(storage))
                group.remaining += 1
                packed = _Packed(self, SWAPPED, group, tid, k, t)
            else:
                rgroup = self.rec_groups.get(tid)
                if rgroup is None:
                    rgroup = self.rec_groups[tid] = _RecomputeGroup(tid)
                    self.watch_holder(tid, storage, None)
                    self.stats.recompute_removed += 1
                    self.stats.recompute_removed_bytes += nbytes
                    if rt.track_storages:
                        self.stats.source_refs.append(StorageWeakRef(storage))
                rgroup.remaining += 1
                rgroup.packs += 1
                packed = _Packed(self, REMOVED, rgroup, tid, k, t)
        else:
            orig = t
            if t.requires_grad:
                packed = t = t.detach()  # what autograd keeps holds no graph (see check_pack)
            if f & TRACK:
                # an input of a re-run, held by autograd (the alias of each pack, until its node ran)
                # or by whatever else holds the tensor itself
                kept = self.kept.setdefault(tid, [])
                kept.append((weakref.ref(t), t._version))
                if orig is not t:
                    kept.append((weakref.ref(orig), t._version))
            if f & PROGRESS:
                packed = _Packed(self, KEEP, t, tid, k, t)  # its unpack gives the runtime control
        if f & PROGRESS:
            pos = index.pack_position[k]
            if pos > self.position:
                self.position = pos
            self.issue_prefetches()
        if k == self.n_saved - 1:
            self.end_of_forward()
        return packed

    def watch_holder(self, tid: int, storage: torch.UntypedStorage, group: SwapGroup | None) -> None:
        held = self.index.held_removed.get(tid)
        if held is not None and not self.forward_done:
            self.held_removed.append((held, StorageWeakRef(storage), group))

    def held_by_caller(self) -> bool:
        """Whether a removed tensor whose bytes the simulation counts free by now (its holder outside
        autograd let go at the end of an op before :attr:`position`) is still alive.

        The trace knows the op at whose end the holder lets go (``Trace.held_op``), not where among
        that op's packs: an autograd node saves the outputs of the op it wraps before the model's
        code goes on, so a pack counted at the next op (the prefetches it starts beside that op's
        memory) can come before the release.  A ViT's embedding output, which its model holds until
        the final layer norm has run, is let go after that norm's node saved its outputs.  A prefetch
        then waits for the next point of control, as it would wait for room on a device."""
        pending = False
        keep = []
        for held, ref, group in self.held_removed:
            if ref.expired() or (group is not None and (group.emptied or group.borrowed is not None)):
                continue  # gone, or its bytes are the swapper's to free (an input, emptied when due)
            keep.append((held, ref, group))
            if held < self.position and (group is None or group.source is None):
                pending = True  # (a copy out still in flight: the simulator waits for it too)
        self.held_removed = keep
        return pending

    def end_of_forward(self) -> None:
        """Every saved tensor is packed: nothing more to record; prefetches due now start."""
        if self.forward_done:
            return
        self.forward_done = True
        if self.mode is not None:
            self.mode.stop()
        last = self.index.pack_position[-1] if self.n_saved else -1
        self.position = max(self.position, last)
        self.issue_prefetches()

    # ---------------------------------------------------------------- prefetch
    def issue_prefetches(self) -> None:
        rt = self.rt
        if not rt.prefetch or self.safe is not None:
            return
        queue = self.index.prefetch
        swapper = self.swapper
        while self.prefetch_ptr < len(queue):
            tid, op = queue[self.prefetch_ptr]
            if op > self.position:
                break
            if self.held_removed and not self.forward_done and self.held_by_caller():
                self.stats.deferred_prefetches += 1
                break
            groups = [g for g in self.groups_by_tid.get(tid, ()) if g.remaining > 0 and g.dev is None]
            if any(g.source is not None for g in groups):
                swapper.poll()
                if any(g.source is not None for g in groups):
                    # Its copy out is still running: the head of the queue waits for it (as in the
                    # simulator); retried at the next hook, or the tensor is read from the device bytes
                    # still held if it is needed first.
                    self.stats.deferred_prefetches += 1
                    break
            need = sum(g.nbytes for g in groups)
            allocated = swapper.backend.memory_allocated() if need else None
            if allocated is not None and allocated - self.outside_bytes + need > rt.memory_limit:
                self.stats.deferred_prefetches += 1  # the device is fuller than planned: wait for room
                break
            for g in groups:
                swapper.fetch(g)
                self.stats.prefetches += 1
                self.stats.prefetch_log.append((tid, self.position))
            self.prefetch_ptr += 1

    # ------------------------------------------------------------------ unpack
    def unpack(self, packed: Any) -> torch.Tensor:
        if type(packed) is _Kept:
            packed = packed.t  # the tensor, or its host copy if the step left its plan
        if type(packed) is not _Packed:
            return HostOffload.unpack(packed) if type(packed) is Offloaded else packed
        self.where = ("unpack", packed.index)
        self.paused = True
        try:
            with torch.no_grad():
                if self.pending_borrowed:
                    self.release_borrowed(NO_OP, final=True)  # backward has begun: every forward op has run
                if not self.forward_done:
                    self.end_of_forward()
                self.stats.released_after_copy += self.swapper.poll()
                fb = self.unpack_position[packed.index]  # the op about to run: the node's first
                if fb != NO_OP and fb > self.position:
                    self.position = fb
                if self.release_next != NO_OP:
                    self.enforce_releases(self.index.unpack_horizon[packed.index])
                self.issue_prefetches()
                if packed.kind == KEEP:
                    return packed.ref if type(packed.ref) is not Offloaded else packed.ref.tensor()
                if packed.kind == SWAPPED:
                    g: SwapGroup = packed.ref
                    if g.borrowed is not None and not g.emptied and g.watch is not None:
                        self.check_unmodified(g)
                    self.stats.read_before_copied_out += int(g.source is not None)
                    storage, on_demand = self.swapper.ready(g)
                    self.stats.on_demand_fetches += int(on_demand)
                    g.remaining -= 1
                    if g.remaining <= 0:
                        self.swapper.drop_dev(g)  # autograd's view keeps the bytes for this node only
                else:
                    rg: _RecomputeGroup = packed.ref
                    if rg.storage is None and rg.remaining <= 0:
                        # Unpacked again after every handle had been (a second backward pass over a
                        # graph retained with retain_graph=True): its storage went with the first
                        # pass's nodes, so the sequence runs again, as it did for the first.
                        rg.remaining = rg.packs
                        self.recompute(rg.tid, again=True)
                    elif rg.storage is None:
                        self.recompute(rg.tid)
                    storage = rg.storage
                    if storage is None:
                        raise RecomputeError(f"the schedule's re-runs did not re-create "
                                             f"{self.index.tensor_label(rg.tid)} ({self.rt.plan_label()})")
                    rg.remaining -= 1
                    if rg.remaining <= 0:
                        rg.storage = None
                return view_of(storage, packed.dtype, packed.size, packed.stride, packed.offset)
        finally:
            self.paused = False

    def check_unmodified(self, g: SwapGroup) -> None:
        """A swapped input the caller kept (not emptied) is read in place by backward: as autograd
        does for what it saves, refuse one modified in place since the forward pass saved it."""
        x = g.watch()
        if x is not None and x._version != g.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: the input {self.index.tensor_label(g.tid)} is at version {x._version}, the forward "
                f"pass saved version {g.version} ({self.rt.plan_label()})")

    # --------------------------------------------------------------- recompute
    def recompute(self, tid: int, again: bool = False) -> None:
        """Re-run the schedule's sequence that re-creates ``tid`` (once per iteration, or ``again`` for
        a second backward pass over a retained graph)."""
        seq = self.index.sequence_of.get(tid)
        if seq is None or self.recorder is None:
            raise RecomputeError(f"the plan's schedule has no re-run for {self.index.tensor_label(tid)} "
                                 f"({self.rt.plan_label()})")
        if seq in self.sequences_done and not again:
            return
        self.sequences_done.add(seq)
        _, steps = self.index.sequences[seq]
        start = time.perf_counter()
        made = self.recorder.run_sequence(steps)
        self.stats.replay_seconds += time.perf_counter() - start
        self.recorder.release_held(seq)
        self.stats.sequences_run += 1
        for t, storage in made.items():
            self.recreated[t] = StorageWeakRef(storage)
            rg = self.rec_groups.get(t)
            if rg is not None and rg.remaining > 0 and rg.storage is None:
                rg.storage = storage
                self.stats.recomputed += 1

    def stored(self, tid: int, version: int) -> torch.UntypedStorage | None:
        """The storage of ``tid`` at ``version`` if the iteration has it without re-running anything."""
        g = self.swap_groups.get((tid, version))
        if g is not None:
            if g.remaining <= 0 and g.source is None and g.dev is None:  # consumed already: fetch for the re-run
                self.swapper.fetch(g)
                storage, _ = self.swapper.ready(g)
                self.swapper.drop_dev(g)
                return storage
            storage, on_demand = self.swapper.ready(g)  # stays fetched for its own unpack, as simulated
            self.stats.on_demand_fetches += int(on_demand)
            return storage
        for ref, _ in self.kept.get(tid, ()):
            x = ref()
            if x is not None and x._version == version:
                return x.untyped_storage()
        off = self.evicted.get((tid, version))
        if off is not None:  # sent to the host as the step left its plan: back for the re-run
            return off.storage.restore()
        rg = self.rec_groups.get(tid)
        if rg is not None and rg.storage is not None:
            return rg.storage
        ref = self.recreated.get(tid)
        if ref is not None and not ref.expired():
            return torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
        return None

    # ------------------------------------------------------------------ finish
    def finish(self) -> None:
        self.stats.packed = self.n_packed
        if self.fsdp_first_gather is not None:
            self.fsdp_first_gather.close()
            self.fsdp_first_gather = None
        if self.mode is not None:
            self.mode.stop()
        if self.pending_borrowed:
            self.release_borrowed(NO_OP, final=True)  # the block ends: its forward ops have run
        if self.module_done_hook is not None:
            self.module_done_hook.remove()
            self.module_done_hook = None
        self.stats.released_after_copy += self.swapper.poll()
        self.stats.emptied_inputs = self.swapper.emptied_borrowed - self.emptied_before
        self.stats.held_bytes = self.swapper.held_bytes
        self.stats.peak_held_bytes = self.swapper.peak_held_bytes
        self.stats.bound_waits = self.swapper.bound_waits

    def check_count(self) -> None:
        if self.n_packed and self.stats.hooks_off_after < 0 and self.n_packed != self.n_saved and self.safe is None:
            what = (f"autograd saved {self.n_packed} tensors in this iteration, the trace recorded {self.n_saved}: "
                    "the batch or the model differs from the recorded iteration")
            if not self.rt.safe_on_mismatch:
                raise TraceMismatchError(f"{what} ({self.rt.plan_label()}); record the trace again")
            # Fewer packs than planned: what the plan would have done to the rest never happened, and
            # a step that does less holds less.  Reported as a divergence all the same.
            self.stats.divergence = what
            self.stats.diverged_at = self.n_packed

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
        model: the trained module (or its ``DistributedDataParallel`` wrapper); its parameters
            tell the device (``device`` overrides).  A model under FSDP2 (``fully_shard`` on a
            one-dimensional mesh) follows a plan made for its rank's trace (``docs/fsdp.md``);
            compiled models and other sharded setups are refused (:class:`UnsupportedTrainingError`).
        plan: the plan, with its schedule; its fingerprint must be the trace's (``check_plan``).  A
            plan without a schedule (a version 1 file) is refused (``ValueError``):
            :func:`dqn_swap.simulator.schedule_plan` adds it.
        trace: the trace the plan was made for, recorded on this model and batch size.
        device: where the model runs; default the model's parameters' device.
        backend: the device's streams and copies (:mod:`dqn_swap.runtime.backend`); default CUDA on
            a CUDA device, synchronous copies elsewhere.  Tests pass a
            :class:`~dqn_swap.runtime.standin.StandInBackend`.
        memory_limit: what the prefetches may fill on CUDA, any form of :mod:`dqn_swap.limits`;
            default ``plan.memory_limit``.
        max_inflight_bytes: bound on the device bytes held by copies to the host still running;
            default the most the simulator had (the plan's schedule), at least one tensor.
        expandable_segments: on CUDA, turn on the allocator's expandable segments (default).
        prefetch: issue prefetches ahead of reuse (otherwise every copy back is on demand).
        track_storages: keep weak references to every removed storage in
            ``stats.source_refs`` (tests check they were freed).
        check_plan: check the plan against the trace first, and simulate it: a plan the simulator
            finds infeasible, or whose schedule is not the one the simulator makes for its actions
            (a file edited by hand), is refused whatever its own figures say.  Off, the plan is
            followed as it is (tests force hand-written schedules this way).
        allow_infeasible: follow a plan the simulator finds infeasible (with ``check_plan`` off, one
            whose ``plan.figures["feasible"]`` is false); without it such a plan is refused
            (:class:`InfeasiblePlanError`).
        shapes: ``"exact"`` (default): every saved tensor has the shape the trace recorded;
            ``"bounded"``: a saved tensor may be smaller in any dimension (and its storage in
            bytes), as in a bucket of shapes whose trace is the bucket's envelope
            (:func:`dqn_swap.trace.envelope`): the same ops on smaller tensors, under the same
            schedule, hold at most the bytes the plan was made for.
        on_mismatch: ``"raise"`` (default): an iteration that is not the trace's stops with
            :class:`TraceMismatchError`; ``"safe"``: it goes on in safe mode from the point where it
            left the trace (every later saved tensor on the host until backward needs it,
            :mod:`.offload`, and what the plan kept on the device until then sent there too:
            ``stats.evicted``), and ``stats.divergence`` says what differed.
        check: ``"ops"`` (default) or ``"packs"``: what the live check compares (below).

    Every iteration is checked against the trace as it runs: at every pack of a saved tensor
    (the ``k``-th is ``trace.saved[k]``) its shape, dtype, storage size and the autograd node
    that made it must be what the recorder saw (storage sizes only, for a trace file written
    before shapes were recorded),
    and a block must pack exactly as many tensors as the trace; the first difference raises
    :class:`TraceMismatchError` (one line: the saved tensor, the op, what it was and is), before
    the runtime acts on that tensor.  The hooks stay on for the whole block, so a second forward
    pass in one block is refused at its first pack beyond the trace's count.

    ``check``: ``"ops"`` (default): besides the packs, every forward op's name is compared with
    the trace's, and the op count at every module call (module docstring); ``"packs"``: the
    saved tensors alone, and a plan without actions checks the first pack only and then runs
    exactly as without the runtime (cheaper by a Python dispatch per forward op, blind to ops
    that save nothing).

    Swapped inputs the training loop still holds are never emptied (:mod:`.swap`): reads of the
    batch or the labels between forward and backward see their bytes; the runtime then frees
    nothing for them, warns once (:class:`HeldInputWarning`, naming the input and the bytes the
    plan counted on) and skips their copy in later iterations.

    After each iteration ``stats`` holds its :class:`IterationStats`.
    """

    def __init__(self, model: torch.nn.Module | None, plan: Plan, trace: Trace, *,
                 device: str | torch.device | None = None, backend: Backend | None = None,
                 memory_limit: LimitSpec | None = None, max_inflight_bytes: int | None = None,
                 expandable_segments: bool = True, prefetch: bool = True, track_storages: bool = False,
                 check_plan: bool = True, allow_infeasible: bool = False, on_mismatch: str = "raise",
                 shapes: str = "exact", check: str = "ops") -> None:
        from ..checks import expect

        if on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch={on_mismatch!r}: one of {', '.join(map(repr, ON_MISMATCH))}")
        if shapes not in SHAPES:
            raise ValueError(f"shapes={shapes!r}: one of {', '.join(map(repr, SHAPES))}")
        if check not in CHECKS:
            raise ValueError(f"check={check!r}: one of {', '.join(map(repr, CHECKS))}")
        self.bounded = shapes == "bounded"
        expect(model, torch.nn.Module, "model", none=True, what="a torch.nn.Module")
        expect(plan, Plan, "plan")
        expect(trace, Trace, "trace")
        refuse_unsupported(model)
        verdict = plan.figures
        if check_plan:
            plan.check_trace(trace)
            # A plan's figures and schedule are what its file says; the simulator says what they are.
            from ..simulator import verify_plan

            verdict = verify_plan(trace, plan).figures()
        if verdict.get("feasible") is False and not allow_infeasible:
            stuck = verdict.get("infeasible")
            where = ""
            if isinstance(stuck, dict) and isinstance(stuck.get("op"), int) and 0 <= stuck["op"] < trace.n_ops:
                needed, available = stuck.get("needed"), stuck.get("available")
                where = f" at {trace.op_label(stuck['op'])}"
                if isinstance(needed, (int, float)) and isinstance(available, (int, float)):
                    where += f", which needs {format_bytes(needed)} with {format_bytes(available)} available"
            raise InfeasiblePlanError(
                f"the plan of planner {plan.planner!r} is infeasible: the simulator found it cannot run under its "
                f"limit of {format_bytes(plan.memory_limit)}{where}; re-plan with a higher limit, or pass "
                "allow_infeasible=True to follow it anyway")
        if plan.schedule is None:
            raise ValueError(f"the plan of planner {plan.planner!r} has no schedule (a version 1 file, or made "
                             "without the simulator): the runtime follows a schedule and makes none; "
                             "plan = dqn_swap.simulator.schedule_plan(trace, plan) adds it")
        if device is None:
            device = backend.device if backend is not None else None
        if device is None:
            params = list(model.parameters()) if model is not None else []
            device = params[0].device if params else torch.device("cpu")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda = self.device.type == "cuda"
        self.model = model
        self._root = model
        self.fsdp = bool(fsdp_param_groups(model))  # sharded with FSDP2 (fully_shard)
        self.plan = plan
        self.trace = trace
        self.memory_limit = (resolve_limit(trace, memory_limit) if memory_limit is not None
                             else int(plan.memory_limit))
        try:
            self.index: PlanIndex = build_index(trace, plan, check_ops=check == "ops")
        except ValueError as e:
            raise TraceMismatchError(str(e)) from None
        self.prefetch = prefetch
        self.track_storages = track_storages
        self.op_names = [trace.op_names[i] for i in trace.op_name.tolist()] if self.index.windows else []
        self.expandable_segments = bool(self.cuda and expandable_segments and enable_expandable_segments())
        self.backend: Backend = backend if backend is not None else backend_for(self.device)
        largest = max((int(trace.tensor_nbytes[t]) for t in self.index.swap), default=0)
        bound = max_inflight_bytes if max_inflight_bytes is not None else max(self.index.max_inflight_d2h_bytes,
                                                                              largest)
        self.swapper = Swapper(self.backend, bound)
        if self.backend.asynchronous and self.index.swap:
            from ..simulator import swap_out_releases

            # Where the simulation frees each swapped tensor's bytes (_Iteration.enforce_releases)
            with_releases(self.index, swap_out_releases(trace, plan))
        # Per pack: dtype and shape (None: unknown) and the storage's bytes, ``below < nbytes <= size``.
        # A trace recorded on CUDA stores sizes in the allocator's 512-byte blocks, one recorded on the
        # CPU or meta the storage's own bytes, compared exactly.
        exact = trace.meta.get("device") in ("cpu", "meta")
        sizes = (trace.tensor_nbytes[trace.saved] if exact else self.index.saved_sizes).tolist()
        dtypes = {d: getattr(torch, d) for d, _ in trace.saved_signatures
                  if d is not None and isinstance(getattr(torch, d, None), torch.dtype)}
        self.expected: list[tuple[torch.dtype | None, tuple[int, ...] | None, int, int]] = [
            (dtypes.get(d) if d is not None else None, shape, int(size), int(size) - (1 if exact else SIZE_QUANTUM))
            for (d, shape), size in zip(trace.saved_signatures, sizes)]
        # Per pack, the autograd node that made the saved tensor (None: the trace does not say).
        nodes = trace.saved_nodes
        self.expected_nodes: list[str | None] | None = nodes if any(n is not None for n in nodes) else None
        self.safe_on_mismatch = on_mismatch == "safe"
        self.held_inputs: set[int] = set()  # swapped inputs the training loop held (HeldInputWarning)
        self._it: _Iteration | None = None
        self._hook: Any = None
        self.stats: IterationStats | None = None
        self.iterations = 0

    @property
    def pool(self) -> Any:
        """The pooled host buffers (:class:`~dqn_swap.runtime.swap.HostBufferPool`)."""
        return self.swapper.pool

    def plan_label(self) -> str:
        p = self.plan
        return (f"plan of planner {p.planner!r}: {p.n_swap} swaps, {p.n_recompute} recomputes, limit "
                f"{format_bytes(p.memory_limit)}, trace {p.trace_fingerprint}")

    # ------------------------------------------------------------ context
    def __enter__(self) -> "PlannedExecution":
        if self._it is not None:
            raise RuntimeError("PlannedExecution is already active: one `with` block per iteration, not nested")
        if under_torch_compile():
            raise UnsupportedTrainingError(COMPILED_STEP)
        STEP_OWNER.enter()
        self.swapper.poll()
        it = _Iteration(self)
        self._it = it
        allocated = self.backend.memory_allocated() if self.plan.actions else None
        if allocated is not None:
            # What the device holds beside the trace's own state as the iteration begins (cuBLAS's
            # workspaces, another model): the prefetch check compares the trace's bytes with the limit.
            # Gradients still alive are not counted as outside (the trace may not hold them): a
            # smaller estimate only makes the check stricter.
            grads = gradient_bytes(self.model, self.device.type) if self.model is not None else 0
            it.outside_bytes = max(0, allocated - self.trace.initial_bytes - grads)
        if not self.plan.actions:
            # nothing to do but check packs (check_pack): the saved tensors go to autograd
            if it.n_saved:
                torch._C._autograd._push_saved_tensors_default_hooks(it.check_pack, HostOffload.unpack)
                it.hooks_pushed = True
        else:
            torch._C._autograd._push_saved_tensors_default_hooks(it.pack, it.unpack)
            it.hooks_pushed = True
        if it.mode is not None:
            it.fsdp_first_gather = _FsdpFirstGather(it, self.model) if self.fsdp else None
            first = it.windows.get(-1)
            if first is not None and self._root is None:
                it.mode.start(first.start, first.end)  # no model to watch: the iteration starts here
            else:
                # Ops are numbered from the module calls of the forward pass (the trace's anchors);
                # a data-parallel wrapper's own work comes before the wrapped module's call.
                self._hook = module_call_hooks(it.module_call)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        it = self._it
        assert it is not None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        try:
            it.finish()
        finally:
            if it.hooks_pushed:
                torch._C._autograd._pop_saved_tensors_default_hooks()
                it.hooks_pushed = False
            self._it = None
            STEP_OWNER.exit()
        self.iterations += 1
        self.stats = it.stats
        if exc is not None and isinstance(exc, torch.OutOfMemoryError) and not isinstance(exc, PlannedOutOfMemoryError):
            raise PlannedOutOfMemoryError(self.describe_oom(it, exc)) from exc
        if exc is None:
            it.check_count()

    def wrap(self, step: Callable[P, R]) -> Callable[P, R]:
        """``step`` (forward and backward of one iteration) run under this plan."""

        @functools.wraps(step)
        def planned(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return step(*args, **kwargs)

        return planned

    def synchronize(self) -> None:
        """Wait for every copy the runtime started (host buffers and device memory are then settled)."""
        self.swapper.synchronize()

    def describe_oom(self, it: _Iteration, exc: BaseException) -> str:
        if self.cuda:
            mem = (f"allocated {format_bytes(torch.cuda.memory_allocated(self.device))}, reserved "
                   f"{format_bytes(torch.cuda.memory_reserved(self.device))}")
        else:
            mem = "host memory"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (f"out of memory in the {it.describe_position()}, following the {self.plan_label()}; {mem}, "
                f"of which the runtime holds {format_bytes(self.swapper.held_bytes)} (copies in flight, "
                f"prefetched); planned peak {format_bytes(self.plan.figures.get('peak_bytes', self.plan.memory_limit))}. "
                f"Cause: {first}")

    def summary(self) -> dict[str, Any]:
        """The plan as carried out and the last iteration's figures."""
        idx = self.index
        return {
            "plan": self.plan_label(),
            "device": str(self.device),
            "backend": type(self.backend).__name__,
            "swap_tensors": len(idx.swap),
            "recompute_tensors": len(idx.recompute),
            "recorded_ops": len(idx.record_ops),
            "max_inflight_bytes": self.swapper.max_inflight_bytes,
            "expandable_segments": self.expandable_segments,
            "pinned_pool_bytes": self.pool.allocated_bytes,
            "iterations": self.iterations,
            "last": self.stats.as_dict() if self.stats else None,
        }


def prefetch_positions(trace: Trace, plan: Plan) -> dict[int, int]:
    """The op at which each swapped tensor's prefetch starts, by the plan's schedule (for inspection);
    ``ValueError`` for a plan without one (:func:`dqn_swap.simulator.schedule_plan` adds it)."""
    if plan.schedule is None:
        raise ValueError("the plan has no schedule; plan = dqn_swap.simulator.schedule_plan(trace, plan) adds it")
    return dict(plan.schedule.prefetch)


__all__ = ["HeldInputWarning", "InfeasiblePlanError", "IterationStats", "PlannedExecution",
           "PlannedOutOfMemoryError", "RecomputeError", "TraceMismatchError", "UnsupportedTrainingError",
           "enable_expandable_segments", "prefetch_positions", "refuse_unsupported"]
