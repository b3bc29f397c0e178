"""What the runtime needs to know about a plan before the first iteration runs.

:class:`PlanIndex` turns a :class:`~dqn_swap.plan.Plan` with its
:class:`~dqn_swap.plan.Schedule` and the :class:`~dqn_swap.trace.Trace` it was
made for into flat lookup tables.  It decides nothing about memory or time:
the simulator did (the prefetch starts, the re-runs and what they free), and
this index only says where in a live iteration each decision applies.

* which tensors to swap and which to recompute;
* per pack (every call of autograd's pack hook, in the recorded order), the
  tensor id, its size, dtype and shape, to recognise the live tensors and check
  they still match the trace (``Trace.saved_signatures``), and a few flags: act on it, keep a handle on it (an input
  of a re-run), or take control at its unpack (a prefetch falls due there);
* the prefetch schedule, as ``(tensor, op)`` in start order;
* the re-run sequences and, per removed tensor, the sequence that re-creates it;
* the forward ops whose calls the runtime must record to re-run them, and the
  *anchors*: the module calls at which the op numbering can be picked up from
  the trace (``Trace.module_call_op``; no op is under way when a module's
  forward begins), so that the runtime's dispatch mode is on only around
  those ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..plan import ActionKind, Plan, RecomputeStep
from ..trace import EventKind, Phase, Role, Trace

#: The CUDA caching allocator hands out blocks in multiples of 512 bytes;
#: a trace recorded on CUDA stores sizes rounded up to it, one recorded on
#: ``meta`` or the CPU does not, so sizes are compared rounded.
SIZE_QUANTUM = 512

NO_OP = np.iinfo(np.int64).max

# Flags of a pack (bit set): what the pack hook does with the tensor.
SWAP, RECOMPUTE, TRACK, PROGRESS = 1, 2, 4, 8


def round_size(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`SIZE_QUANTUM`."""
    return -(-int(nbytes) // SIZE_QUANTUM) * SIZE_QUANTUM


@dataclass(frozen=True)
class OpInfo:
    """One forward op of the trace: its name and the storages it reads and creates."""

    name: str
    reads: tuple[int, ...]
    fresh: tuple[int, ...]


@dataclass(frozen=True)
class Window:
    """Forward ops to record, numbered from an anchor: when the ``call``-th module call of the
    forward pass begins (``-1``: the first one, for a trace without anchors) ``start`` ops have
    run; the window needs ops up to ``end`` (inclusive)."""

    call: int
    start: int
    end: int


@dataclass
class PlanIndex:
    """Lookup tables derived from a scheduled plan and its trace; see the module docstring."""

    trace: Trace
    plan: Plan
    swap: frozenset[int]
    recompute: frozenset[int]
    saved_tids: np.ndarray
    saved_sizes: np.ndarray  # rounded with round_size
    pack_flags: list[int]
    pack_position: list[int]  # per pack: the op whose memory is allocated when it happens (forward), -1 unknown
                              # (Trace.pack_progress_op: the op about to run, or the op saving its output)
    first_backward_read: np.ndarray  # per tensor id; NO_OP when backward never reads it
    # per pack: the op about to run when backward unpacks it (its node's first op), NO_OP when
    # unknown; a trace without ``saved_unpack_op`` (older files): its tensor's first backward read
    unpack_position: list[int]
    first_backward_op: int
    prefetch: tuple[tuple[int, int], ...]  # (tensor, op) in start order
    sequences: tuple[tuple[int, tuple[RecomputeStep, ...]], ...] = ()
    sequence_of: dict[int, int] = field(default_factory=dict)  # removed tensor -> index in sequences
    # inputs of re-runs that only the user's code holds (autograd never saves them): the runtime holds
    # them from the forward pass until the last sequence that reads them, as the simulator assumes
    hold_inputs: dict[int, int] = field(default_factory=dict)  # tensor id -> last sequence reading it
    record_ops: frozenset[int] = frozenset()  # forward ops whose calls are recorded
    forward_ops: dict[int, OpInfo] = field(default_factory=dict)  # info of the recorded ops
    windows: tuple[Window, ...] = ()
    written_in_forward: frozenset[int] = frozenset()  # persistent tensors some forward op writes
    max_inflight_d2h_bytes: int = 0
    # The copies out a runtime on an asynchronous device waits for (:func:`with_releases`): swapped
    # tensors by the op from which the simulation counts their bytes free, in that order; per pack
    # and per unpack, the last op whose releases must be done there (the next point of control)
    release_ops: list[int] = field(default_factory=list)
    release_tids: list[int] = field(default_factory=list)
    pack_horizon: list[int] = field(default_factory=list)
    unpack_horizon: list[int] = field(default_factory=list)
    # Removed tensors (swapped or recomputed) that something outside autograd holds at least until the
    # op of their action (Trace.held_op): tensor id -> the op at whose end the simulation counts their
    # bytes free because that holder lets go then (a model's forward keeping its embedding output to
    # the end, say).  The runtime sees the holder let go, not the op: see _Iteration.held_by_caller.
    held_removed: dict[int, int] = field(default_factory=dict)
    # Swapped tensors by the op at whose end the simulation starts their copy out (the plan's action's
    # op, or where a holder outside autograd lets go; often ops after the first save): on an
    # asynchronous device (with_releases) the runtime starts each copy at the first point of control
    # once that op is next (CopiesOut.start_due_copies), so copies go onto the link in the simulator's order.
    copy_out_after: dict[int, int] = field(default_factory=dict)

    @property
    def n_saved(self) -> int:
        return len(self.saved_tids)

    def is_persistent(self, tid: int) -> bool:
        """Existed before the iteration (parameters, buffers, optimizer state, inputs)."""
        return bool(self.trace.tensor_alloc_op[tid] < 0)

    def tensor_label(self, tid: int) -> str:
        t = self.trace
        op = int(t.tensor_alloc_op[tid])
        where = t.op_label(op) if op >= 0 else "existed before the iteration"
        return f"tensor {tid} ({int(t.tensor_nbytes[tid])} B, {Role(t.tensor_role[tid]).name.lower()}, {where})"

    def pack_label(self, k: int) -> str:
        """Saved tensor ``k`` (the ``k``-th pack) for messages: the tensor and where it was packed,
        e.g. ``saved tensor #6 (tensor 4 (256 B, parameter, existed before the iteration), saved by
        #4 aten.addmm (4, forward))``."""
        t = self.trace
        tid = int(self.saved_tids[k])
        op = int(t.saved_op[k]) if k < len(t.saved_op) else -1
        # Pack k happens once ``op`` ops have run: before op #op's kernel (its inputs) or right
        # after op #op-1's (its outputs); a tensor op #op-1 did not make is an input of op #op.
        where = ""
        if 0 <= op < t.n_ops and (op == 0 or int(t.tensor_alloc_op[tid]) != op - 1):
            where = f", saved by {t.op_label(op)}"
        elif 0 < op <= t.n_ops:
            where = f", saved right after {t.op_label(op - 1)}"
        return f"saved tensor #{k} ({self.tensor_label(tid)}{where})"


def _op_event_slices(trace: Trace) -> np.ndarray:
    """``starts[i]:starts[i+1]`` are the events of op ``i`` (events are in op order)."""
    return np.searchsorted(trace.event_op, np.arange(trace.n_ops + 1), side="left")


def _op_info(trace: Trace, starts: np.ndarray, i: int) -> OpInfo:
    lo, hi = starts[i], starts[i + 1]
    kinds, tids = trace.event_kind[lo:hi], trace.event_tensor[lo:hi]
    # A hidden storage (a Python number autograd saved, Role.HIDDEN) is no output the runtime sees.
    fresh = tuple(int(t) for t in tids[(kinds == EventKind.MALLOC) & (trace.tensor_role[tids] != Role.HIDDEN)])
    reads = tuple(int(t) for t in tids[kinds == EventKind.READ])
    return OpInfo(trace.op_names[trace.op_name[i]], reads, fresh)


def _windows(trace: Trace, ops: list[int]) -> tuple[Window, ...]:
    """Group the ops to record by the last module call before each (where counting can start)."""
    anchors = trace.module_call_op
    windows: dict[int, Window] = {}
    for op in sorted(ops):
        k = int(np.searchsorted(anchors, op, side="right")) - 1  # last call with anchors[k] <= op
        if k >= 0:  # several calls may begin at one count: the first of them starts the window
            k = int(np.searchsorted(anchors, anchors[k], side="left"))
        start = int(anchors[k]) if k >= 0 else 0
        w = windows.get(k)
        windows[k] = Window(k, start, max(op, w.end if w else op))
    return tuple(windows[k] for k in sorted(windows))


def _acted_on(trace: Trace, plan: Plan) -> tuple[set[int], set[int]]:
    """The tensors ``plan`` swaps and those it recomputes; an action on a tensor autograd does not save
    is refused."""
    swap: set[int] = set()
    recompute: set[int] = set()
    for a in plan.actions:
        if trace.tensor_saved_index[a.tensor] < 0:
            raise ValueError(f"plan action {a} names tensor {a.tensor}, which autograd does not save in the "
                             "forward pass: the runtime cannot carry it out; re-plan with `dqn-swap plan`")
        (swap if a.kind == ActionKind.SWAP else recompute).add(int(a.tensor))
    return swap, recompute


@dataclass
class _Reruns:
    """What the schedule's re-run sequences ask of the runtime: see :class:`PlanIndex`'s fields of the
    same names (``external``: non-persistent inputs of re-runs not made by the sequence itself)."""

    record: set[int] = field(default_factory=set)
    external: set[int] = field(default_factory=set)
    forward_ops: dict[int, OpInfo] = field(default_factory=dict)
    hold: dict[int, int] = field(default_factory=dict)
    sequence_of: dict[int, int] = field(default_factory=dict)


def _reruns(trace: Trace, sequences: list, recompute: set[int]) -> _Reruns:
    """The ops to record, the inputs to track or hold, and per removed tensor the sequence that
    re-creates it before its next use (a schedule that re-creates none is refused)."""
    out = _Reruns()
    starts = _op_event_slices(trace)
    at_op = {n: i for i, (n, _) in enumerate(sequences)}
    for i, (_, steps) in enumerate(sequences):
        made: set[int] = set()
        for step in steps:
            out.record.add(step.op)
            info = out.forward_ops.setdefault(step.op, _op_info(trace, starts, step.op))
            for t in info.reads:
                if t not in made and trace.tensor_alloc_op[t] >= 0:
                    out.external.add(t)
                    if trace.tensor_saved_index[t] < 0:
                        out.hold[t] = i
            made.update(step.keep)
    returns = trace.action_window[1]
    for t in recompute:  # a removed tensor is re-created by the sequence before its next use
        i = at_op.get(int(returns[t]))
        if i is not None and any(t in step.keep for step in sequences[i][1]):
            out.sequence_of[t] = i
    missing = [t for t in recompute if t not in out.sequence_of and returns[t] >= 0]
    if missing:
        raise ValueError(f"the plan's schedule does not re-create tensor {missing[0]}; re-plan with `dqn-swap plan`")
    return out


def _progress_packs(trace: Trace, prefetch: list[tuple[int, int]], n_saved: int, reads_at: np.ndarray,
                    b0: int) -> set[int]:
    """Packs whose pack (forward) or unpack (backward) gives the runtime control for a prefetch start:
    for every start, the first pack at or after it in forward, else the first unpack at or after it
    (packs the plan acts on give control anyway).  An autograd node unpacks all its saved tensors
    right before its first op (``Trace.saved_unpack_op``), so a prefetch due at a later op of a node
    starts at the next node's unpacks, not before its op (``Simulator.instant_copy_memory`` counts it
    from there: ``Trace.progress_ops``)."""
    anchors = trace.pack_progress_op
    order = np.argsort(reads_at, kind="stable")
    progress: set[int] = set()
    late: list[int] = []
    fwd_known = bool(len(anchors) and anchors[0] >= 0)
    for _, op in prefetch:
        if op < b0 and fwd_known:  # forward: the first pack at or after the op
            j = int(np.searchsorted(anchors, op, side="left"))
            if j < n_saved:
                progress.add(j)
                continue
        if op >= b0 or fwd_known:  # backward, or after the last pack: the first unpack at or after it
            late.append(op)
    for op in late:
        j = int(np.searchsorted(reads_at[order], op, side="left"))
        if j < len(order) and reads_at[order[j]] != NO_OP:
            progress.add(int(order[j]))
    return progress


def build_index(trace: Trace, plan: Plan, *, check_ops: bool = False) -> PlanIndex:
    """Index ``plan`` (made for ``trace``, with its schedule) for the runtime.

    ``check_ops``: the windows of ops to number cover the whole forward pass (every op's name is
    compared with the trace's, and the op count at every module call), not only the ops re-runs need.

    Raises ``ValueError`` for a plan without a schedule (use
    :func:`dqn_swap.simulator.schedule_plan`) or with an action the runtime
    cannot carry out (on a tensor autograd does not save).
    """
    if plan.schedule is None:
        raise ValueError("the plan has no schedule; dqn_swap.simulator.schedule_plan(trace, plan) makes one")
    swap, recompute = _acted_on(trace, plan)
    n = trace.n_ops
    backward_ops = np.flatnonzero(trace.op_phase == Phase.BACKWARD)
    b0 = int(backward_ops[0]) if len(backward_ops) else n
    first = np.full(trace.n_tensors, NO_OP, dtype=np.int64)
    reads = (trace.event_kind == EventKind.READ) & (trace.op_phase[trace.event_op] == Phase.BACKWARD)
    np.minimum.at(first, trace.event_tensor[reads], trace.event_op[reads].astype(np.int64))

    saved = trace.saved.astype(np.int64)
    sizes = -(-trace.tensor_nbytes[saved] // SIZE_QUANTUM) * SIZE_QUANTUM
    sched = plan.schedule
    reruns = _reruns(trace, sched.recompute, recompute)

    counted = set(reruns.record)
    if check_ops:
        counted.update(range(b0))
    windows = _windows(trace, sorted(counted)) if counted else ()
    if check_ops and b0:
        # Counting goes on to the end of the forward pass (an op the live iteration runs between two
        # module calls and the trace does not is seen at once, and every module call checks the count).
        windows = tuple(Window(w.call, w.start, max(w.end, b0 - 1)) for w in windows)
    unpacked = trace.saved_unpack_op.astype(np.int64)
    if len(unpacked) and np.any(unpacked >= 0):
        reads_at = np.where(unpacked >= 0, unpacked, NO_OP)
    else:
        reads_at = first[saved]  # a trace that does not know its unpacks: the first backward read
    progress = _progress_packs(trace, sched.prefetch, len(saved), reads_at, b0)
    anchors = trace.pack_progress_op  # per pack, the op whose memory is allocated when it happens
    flags = [0] * len(saved)
    position = [-1] * len(saved)
    for k, tid in enumerate(saved.tolist()):
        f = 0
        if tid in swap:
            f |= SWAP
        elif tid in recompute:
            f |= RECOMPUTE
        elif tid in reruns.external:
            f |= TRACK
        if k in progress:
            f |= PROGRESS
        flags[k] = f
        if len(anchors) and anchors[k] >= 0:
            position[k] = int(anchors[k])

    fwd_write = (trace.event_kind == EventKind.WRITE) & (trace.op_phase[trace.event_op] == Phase.FORWARD)
    written = trace.event_tensor[fwd_write]
    written_persistent = frozenset(int(t) for t in np.unique(written) if trace.tensor_alloc_op[t] < 0)
    held_op = trace.held_op
    held_removed = {int(a.tensor): int(held_op[a.tensor]) for a in plan.actions
                    if held_op[a.tensor] >= trace.event_op[a.event]}
    return PlanIndex(trace=trace, plan=plan, swap=frozenset(swap), recompute=frozenset(recompute),
                     saved_tids=saved, saved_sizes=sizes, pack_flags=flags, pack_position=position,
                     first_backward_read=first, unpack_position=reads_at.tolist(), first_backward_op=b0,
                     prefetch=tuple(sched.prefetch), sequences=tuple(sched.recompute),
                     sequence_of=reruns.sequence_of, hold_inputs=reruns.hold, record_ops=frozenset(reruns.record),
                     forward_ops=reruns.forward_ops, windows=windows, written_in_forward=written_persistent,
                     max_inflight_d2h_bytes=int(sched.max_inflight_d2h_bytes), held_removed=held_removed)


def with_releases(index: PlanIndex, starts: dict[int, int], releases: dict[int, int]) -> PlanIndex:
    """``index`` with where the copies out start and the copies out to wait for
    (:func:`dqn_swap.simulator.swap_out_ops`: swapped tensor -> the op at whose end its copy starts,
    and -> the op from which the plan counts its bytes free).

    The runtime learns how far the iteration has come only at packs (forward) and unpacks
    (backward); between two such points the ops run without it.  So the releases due at any op
    up to the next point are done at the point before it: the *horizon* of a pack or an unpack
    is the first point after its own op (``trace.n_ops`` after the last; every op where the
    trace does not know where its packs happen).
    """
    trace = index.trace
    n = trace.n_ops
    order = sorted((op, tid) for tid, op in releases.items() if tid in index.swap)
    anchors = np.asarray(index.pack_position, dtype=np.int64)
    unpacks = np.asarray(index.unpack_position, dtype=np.int64)
    known = (unpacks >= 0) & (unpacks != NO_OP)
    # Every pack gives the runtime control in forward; in backward only the unpacks of packs it acts
    # on.  A release due at an op with no such point before it since the last one gets one: the pack
    # whose unpack comes last before that op is marked PROGRESS (its unpack then comes to the runtime).
    flags = index.pack_flags
    last_forward = int(anchors.max()) if len(anchors) and anchors.max() >= 0 else -1
    if known.any():
        ks = np.flatnonzero(known)
        by_unpack = ks[np.argsort(unpacks[ks], kind="stable")]
        at = unpacks[by_unpack]
        for op, _ in order:
            if op <= last_forward + 1:
                continue  # a forward pack comes before it
            j = int(np.searchsorted(at, op, side="left")) - 1  # the last unpack before the op
            if j >= 0:
                flags[int(by_unpack[j])] |= PROGRESS
    control = np.array([f != 0 for f in flags], dtype=bool)
    points = np.unique(np.concatenate([anchors[anchors >= 0], unpacks[known & control]]))
    # A point that comes before its op allocates (an unpack: its node has not begun; the first pack
    # at an op saving that op's inputs) does the releases due at that op itself: the point before it
    # need not wait for them (the ops in between run meanwhile, as in the simulation).
    before = np.zeros(len(points), dtype=bool)
    if len(points):
        before[np.searchsorted(points, unpacks[known & control])] = True
        packs = np.flatnonzero(anchors >= 0)
        if len(packs) and len(trace.saved_in_op) == len(anchors):
            first = packs[np.unique(anchors[packs], return_index=True)[1]]  # first pack at each position
            inputs = first[(trace.saved_in_op[first] == 0) & (trace.saved_op[first] == anchors[first])]
            before[np.searchsorted(points, anchors[inputs])] = True

    def horizon(ops: np.ndarray) -> list[int]:
        j = np.searchsorted(points, ops, side="right")
        jj = np.minimum(j, len(points) - 1)
        h = np.where(j < len(points), (points[jj] - before[jj]) if len(points) else n, n)
        return np.where((ops < 0) | (ops == NO_OP), n, h).astype(np.int64).tolist()

    index.copy_out_after = {t: op for t, op in starts.items() if t in index.swap}
    index.release_ops = [op for op, _ in order]
    index.release_tids = [tid for _, tid in order]
    index.pack_horizon = horizon(anchors)
    index.unpack_horizon = horizon(unpacks)
    return index


__all__ = ["NO_OP", "PROGRESS", "RECOMPUTE", "SIZE_QUANTUM", "SWAP", "TRACK", "OpInfo", "PlanIndex",
           "Window", "build_index", "round_size", "with_releases"]
