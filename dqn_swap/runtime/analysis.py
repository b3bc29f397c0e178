"""What the runtime needs to know about a plan before the first iteration runs.

:class:`PlanIndex` turns a :class:`~dqn_swap.plan.Plan` and the
:class:`~dqn_swap.trace.Trace` it was made for into flat lookup tables:

* which tensors to swap and which to recompute (a tensor named by both is
  recomputed: recomputing frees it without any transfer);
* per saved-tensor packing index, the tensor id and its size, to identify the
  live tensors of a running iteration and to check they still match the trace;
* for recomputation, the forward ops that produce or modify the removed
  tensors and, transitively, the non-persistent tensors those ops read (the
  *recompute closure*); the runtime records how to re-run exactly these ops;
* the prefetch schedule: for every swapped tensor, the backward op at which
  its host-to-device copy is issued.  Tensors are prefetched earliest-reused
  first, each as soon as the planned memory curve stays under the limit until
  its reuse (the rule the simulator assumes, section 4.5 of the DQN paper).

It also builds plans by hand (:func:`make_plan`) for tests and users.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..plan import Action, ActionKind, Plan
from ..trace import EventKind, Phase, Role, Trace

#: The CUDA caching allocator hands out blocks in multiples of 512 bytes;
#: a trace recorded on CUDA stores sizes rounded up to it, one recorded on
#: ``meta`` or the CPU does not, so sizes are compared rounded.
SIZE_QUANTUM = 512

NO_OP = np.iinfo(np.int64).max


def round_size(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`SIZE_QUANTUM`."""
    return -(-int(nbytes) // SIZE_QUANTUM) * SIZE_QUANTUM


@dataclass
class OpInfo:
    """One forward op of the trace: its name and the storages it reads, creates and writes."""

    name: str
    reads: tuple[int, ...]
    fresh: tuple[int, ...]
    writes: tuple[int, ...]  # storages written that already existed (in-place / aliasing outputs)


@dataclass
class PlanIndex:
    """Lookup tables derived from a plan and its trace; see the module docstring."""

    trace: Trace
    plan: Plan
    swap: frozenset[int]
    recompute: frozenset[int]
    unsupported: tuple[Action, ...]
    saved_tids: np.ndarray
    saved_sizes: np.ndarray  # rounded with round_size
    first_backward_read: np.ndarray  # per tensor id; NO_OP when backward never reads it
    first_backward_op: int
    prefetch_op: dict[int, int]  # swapped tensor id -> backward op index issuing its prefetch
    prefetch_order: tuple[int, ...]  # swapped tensor ids, earliest-reused first
    closure: frozenset[int] = frozenset()  # tensor ids whose forward producers are recorded
    recipe_ops: dict[int, tuple[int, ...]] = field(default_factory=dict)  # op -> closure tids it creates/writes
    forward_ops: dict[int, OpInfo] = field(default_factory=dict)  # op index -> info, forward ops only
    n_forward_ops: int = 0

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


def _op_event_slices(trace: Trace) -> np.ndarray:
    """``starts[i]:starts[i+1]`` are the events of op ``i`` (events are in op order)."""
    return np.searchsorted(trace.event_op, np.arange(trace.n_ops + 1), side="left")


def _forward_ops(trace: Trace, starts: np.ndarray) -> dict[int, OpInfo]:
    ops: dict[int, OpInfo] = {}
    for i in np.flatnonzero(trace.op_phase == Phase.FORWARD):
        lo, hi = starts[i], starts[i + 1]
        kinds, tids = trace.event_kind[lo:hi], trace.event_tensor[lo:hi]
        fresh = tuple(int(t) for t in tids[kinds == EventKind.MALLOC])
        fresh_set = set(fresh)
        reads = tuple(int(t) for t in tids[kinds == EventKind.READ])
        writes = tuple(int(t) for t in tids[kinds == EventKind.WRITE] if int(t) not in fresh_set)
        ops[int(i)] = OpInfo(trace.op_names[trace.op_name[i]], reads, fresh, writes)
    return ops


def _closure(trace: Trace, ops: dict[int, OpInfo], targets: Iterable[int]) -> tuple[set[int], dict[int, list[int]]]:
    """Tensors whose forward history must be recorded to recompute ``targets``.

    For a storage: the op that created it and the ops that wrote it in place;
    for each of those ops, every non-persistent storage it reads (they may be
    gone by the time of recomputation and then need recomputing themselves).
    """
    writers: dict[int, list[int]] = {}
    for i, info in ops.items():
        for t in info.writes:
            writers.setdefault(t, []).append(i)
    closure: set[int] = set()
    recipe_ops: dict[int, list[int]] = {}
    stack = [int(t) for t in targets]
    while stack:
        tid = stack.pop()
        if tid in closure or trace.tensor_alloc_op[tid] < 0:
            continue
        producer = int(trace.tensor_alloc_op[tid])
        if producer not in ops:  # created outside the forward pass: cannot be re-run
            continue
        closure.add(tid)
        for op in [producer, *writers.get(tid, [])]:
            recipe_ops.setdefault(op, []).append(tid)
            info = ops[op]
            for src in (*info.reads, *info.writes):
                if src != tid and src not in closure and trace.tensor_alloc_op[src] >= 0:
                    stack.append(src)
    return closure, recipe_ops


def _prefetch_schedule(trace: Trace, swap: Iterable[int], recompute: Iterable[int], limit: int,
                       first_bwd_read: np.ndarray, b0: int) -> tuple[dict[int, int], tuple[int, ...]]:
    """Backward op at which each swapped tensor's prefetch is issued.

    The planned memory of backward op ``j`` is the unplanned one less every
    swapped tensor not yet prefetched and every recomputed tensor not yet
    recomputed (its reuse).  Swapped tensors are taken earliest-reused first;
    each is prefetched at the earliest op, no earlier than the previous
    prefetch, from which adding it back keeps the curve under ``limit`` until
    it dies; when no such op exists it is fetched on demand at its reuse.
    """
    n = trace.n_ops
    planned = trace.op_memory.astype(np.int64).copy()
    sizes = trace.tensor_nbytes
    free = np.where(trace.tensor_free_op < 0, n, trace.tensor_free_op).astype(np.int64)
    swap = sorted(set(int(t) for t in swap), key=lambda t: (int(first_bwd_read[t]), t))
    for tid in [*swap, *(int(t) for t in recompute)]:
        end = int(min(free[tid], n))
        if tid in recompute:
            end = int(min(end, first_bwd_read[tid]))
        if end > b0:
            planned[b0:end] -= int(sizes[tid])
    schedule: dict[int, int] = {}
    last = b0
    for tid in swap:
        use = int(first_bwd_read[tid])
        end = int(min(free[tid], n))
        if use >= n or end <= b0:  # never read in backward: nothing to prefetch
            continue
        use = max(use, last)
        segment = planned[last:end]
        suffix_max = np.maximum.accumulate(segment[::-1])[::-1]
        ok = np.flatnonzero(suffix_max + int(sizes[tid]) <= limit)
        at = last + int(ok[0]) if len(ok) and last + int(ok[0]) <= use else use
        planned[at:end] += int(sizes[tid])
        schedule[tid] = at
        last = at
    order = tuple(t for t in swap if t in schedule)
    return schedule, order


def build_index(trace: Trace, plan: Plan, memory_limit: int | None = None) -> PlanIndex:
    """Index ``plan`` (made for ``trace``) for the runtime.

    Actions on tensors that autograd never saves (temporaries, gradients,
    backward-phase tensors) cannot be carried out by a saved-tensor runtime;
    they are returned in ``unsupported`` and otherwise ignored.
    """
    kinds: dict[int, ActionKind] = {}
    unsupported: list[Action] = []
    for a in sorted(plan.actions):  # one action per tensor: the first in event order, as the simulator
        if a.tensor in kinds:
            continue
        if trace.tensor_saved_index[a.tensor] < 0:
            unsupported.append(a)
            continue
        if a.kind == ActionKind.RECOMPUTE and (trace.tensor_alloc_op[a.tensor] < 0 or
                                               trace.op_phase[trace.tensor_alloc_op[a.tensor]] != Phase.FORWARD):
            unsupported.append(a)  # only tensors created in the forward pass can be re-created
            continue
        kinds[a.tensor] = a.kind
    swap = frozenset(t for t, k in kinds.items() if k == ActionKind.SWAP)
    recompute = frozenset(t for t, k in kinds.items() if k == ActionKind.RECOMPUTE)

    n = trace.n_ops
    backward_ops = np.flatnonzero(trace.op_phase == Phase.BACKWARD)
    b0 = int(backward_ops[0]) if len(backward_ops) else n
    first = np.full(trace.n_tensors, NO_OP, dtype=np.int64)
    reads = (trace.event_kind == EventKind.READ) & (trace.op_phase[trace.event_op] == Phase.BACKWARD)
    np.minimum.at(first, trace.event_tensor[reads], trace.event_op[reads].astype(np.int64))

    limit = int(memory_limit if memory_limit is not None else plan.memory_limit)
    schedule, order = _prefetch_schedule(trace, swap, recompute, limit, first, b0)
    saved = trace.saved.astype(np.int64)
    sizes = -(-trace.tensor_nbytes[saved] // SIZE_QUANTUM) * SIZE_QUANTUM
    index = PlanIndex(trace=trace, plan=plan, swap=swap, recompute=recompute, unsupported=tuple(unsupported),
                      saved_tids=saved, saved_sizes=sizes, first_backward_read=first, first_backward_op=b0,
                      prefetch_op=schedule, prefetch_order=order)
    if recompute:
        starts = _op_event_slices(trace)
        index.forward_ops = _forward_ops(trace, starts)
        index.n_forward_ops = (max(index.forward_ops) + 1) if index.forward_ops else 0
        closure, recipe_ops = _closure(trace, index.forward_ops, recompute)
        index.closure = frozenset(closure)
        index.recipe_ops = {op: tuple(t) for op, t in recipe_ops.items()}
    return index


# ---------------------------------------------------------------- hand-made plans
def saved_activations(trace: Trace) -> list[int]:
    """Tensor ids of the activations autograd saves in the forward pass, in packing order."""
    seen: dict[int, None] = {}
    for tid in trace.saved.tolist():
        op = trace.tensor_alloc_op[tid]
        if trace.tensor_role[tid] == Role.SAVED and op >= 0 and trace.op_phase[op] == Phase.FORWARD:
            seen.setdefault(int(tid), None)
    return list(seen)


def last_forward_event(trace: Trace, tid: int) -> int:
    """The last forward-phase event on ``tid`` (a plan acts right after it)."""
    ev = np.flatnonzero((trace.event_tensor == tid) & (trace.op_phase[trace.event_op] == Phase.FORWARD)
                        & (trace.event_kind != EventKind.FREE))
    if not len(ev):
        raise ValueError(f"tensor {tid} has no forward event")
    return int(ev[-1])


def make_plan(trace: Trace, swap: Iterable[int] = (), recompute: Iterable[int] = (), *,
              memory_limit: int | None = None, planner: str = "manual") -> Plan:
    """A plan that swaps ``swap`` and recomputes ``recompute`` right after their last forward use.

    ``memory_limit`` defaults to the trace's unplanned peak.
    """
    actions = [Action(last_forward_event(trace, t), int(t), ActionKind.SWAP) for t in swap]
    actions += [Action(last_forward_event(trace, t), int(t), ActionKind.RECOMPUTE) for t in recompute]
    return Plan(actions=Plan.sorted_actions(actions),
                memory_limit=int(memory_limit if memory_limit is not None else trace.peak_bytes),
                trace_fingerprint=trace.fingerprint, profile=str(trace.meta.get("profile", "")),
                planner=planner)


def estimate_planned_peak(trace: Trace, swap: Iterable[int], recompute: Iterable[int]) -> int:
    """A quick estimate of the planned peak (no timing): the
    unplanned memory curve less every swapped or recomputed tensor between its
    last forward use and its first backward reuse.  The simulator is the
    reference; this is the fallback when it is not installed."""
    n = trace.n_ops
    mem = trace.op_memory.astype(np.int64).copy()
    first = np.full(trace.n_tensors, NO_OP, dtype=np.int64)
    reads = (trace.event_kind == EventKind.READ) & (trace.op_phase[trace.event_op] == Phase.BACKWARD)
    np.minimum.at(first, trace.event_tensor[reads], trace.event_op[reads].astype(np.int64))
    fwd_read = (trace.event_kind == EventKind.READ) & (trace.op_phase[trace.event_op] == Phase.FORWARD)
    last_fwd = np.full(trace.n_tensors, -1, dtype=np.int64)
    np.maximum.at(last_fwd, trace.event_tensor[fwd_read], trace.event_op[fwd_read].astype(np.int64))
    for tid in {*map(int, swap), *map(int, recompute)}:
        start = int(max(last_fwd[tid], trace.tensor_alloc_op[tid])) + 1
        end = int(min(first[tid], n if trace.tensor_free_op[tid] < 0 else trace.tensor_free_op[tid]))
        if end > start:
            mem[start:end] -= int(trace.tensor_nbytes[tid])
    return int(mem.max()) if n else trace.initial_bytes
