"""One planned iteration: the saved-tensor hooks' pack and unpack, the swaps, prefetches and re-runs
the plan's schedule puts at each op, and the releases it waits for (:class:`_Iteration`)."""

from __future__ import annotations

import heapq
import time
import warnings
import weakref
from typing import Any, TYPE_CHECKING

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..threads import module_call_hooks
from ..support import DATA_PARALLEL_WRAPPERS
from ..trace import format_bytes
from .offload import HostOffload, Offloaded
from .index import NO_OP, PROGRESS, RECOMPUTE, SWAP, TRACK, PlanIndex
from .recompute import OpRecorder, RecomputeError, RecordMode, view_of
from .swap import SwapGroup

from .live_checks import LiveChecks
from .copies_out import CopiesOut
from .vocabulary import (KEEP, REMOVED, SWAPPED, HeldInputWarning, IterationStats, UnsupportedTrainingError,
                         _FsdpFirstGather, _Kept, _Packed, _RecomputeGroup)

if TYPE_CHECKING:
    from .execution import PlannedExecution

# --------------------------------------------------------------------------- one iteration
class _Iteration(CopiesOut, LiveChecks):
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
        # copies out held back until the op after which the simulation starts them has been issued
        # (PlanIndex.copy_out_after): a heap of (the op count at which they start, order, group)
        self.copy_queue: list[tuple[int, int, SwapGroup]] = []
        self.copy_next = NO_OP
        self.copy_after = rt.index.copy_out_after  # empty on a synchronous device
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
        if self.forward_done or self.safe is not None or isinstance(module, DATA_PARALLEL_WRAPPERS):
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
        k, packed = self.counted_pack(t)
        if k < 0:
            return packed
        if self.copy_next <= self.pack_op[k]:
            self.start_due_copies(self.pack_op[k])
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

    # -------------------------------------------------------------- safe mode

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

    def new_swap(self, t: torch.Tensor, k: int, tid: int, storage: torch.UntypedStorage, nbytes: int) -> SwapGroup:
        """The first pack of ``tid`` at this version: its swap group, its copy out started or held back
        until its op (:meth:`start_due_copies`), a swapped input watched until it can be emptied."""
        index, rt = self.index, self.rt
        version = t._version
        group = SwapGroup(self.swapper, tid, version, nbytes)
        self.swap_groups[(tid, version)] = group
        self.groups_by_tid.setdefault(tid, []).append(group)
        borrowed = index.is_persistent(tid)  # an input: the caller's storage (swap.py)
        if borrowed and not storage.resizable():
            raise UnsupportedTrainingError(
                f"the plan swaps the input {index.tensor_label(tid)}, whose storage cannot be "
                "freed (not resizable: made from a NumPy array or shared memory?); pass a copy "
                "that owns its memory, e.g. batch.clone()")
        due = self.copy_after.get(tid, -1)
        defer = not borrowed and due > self.pack_op[k]
        self.swapper.swap_out(group, storage, borrowed=borrowed, defer=defer)
        self.watch_holder(tid, storage, group)
        self.stats.swapped += 1
        if defer:
            heapq.heappush(self.copy_queue, (due, self.stats.swapped, group))
            self.copy_next = self.copy_queue[0][0]
            self.stats.deferred_copies += 1
        elif tid in self.late_releases and self.wait_copy_out(group):
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
        return group

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
                    group = self.new_swap(t, k, tid, storage, nbytes)
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
        if self.copy_queue:
            self.start_due_copies(NO_OP)  # every forward op has been issued
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
        if self.copy_queue:
            self.start_due_copies(NO_OP)
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
