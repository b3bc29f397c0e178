"""The trace index: every per-event, per-op and per-tensor fact the simulator and its clients read.

Built once per :class:`~dqn_swap.trace.Trace` (it depends on nothing else: no limit, no
profile), held by :class:`~dqn_swap.simulator.Simulator` as ``sim.index``.  Planners, the
environment and the benchmarks read these arrays rather than computing the same facts again.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ..trace import EventKind, Phase, Role, Trace

# Only Trace.movable tensors (saved activations, saved inputs) are acted on; temporaries can
# still be re-created on the way to a recomputed tensor (the runtime replays the ops that made them).
RECOMPUTABLE_INPUT_ROLES = (Role.SAVED, Role.TEMPORARY)


def _next_op_of(keys: np.ndarray, tensor: np.ndarray, op: np.ndarray, stride: int, missing: int) -> np.ndarray:
    """Per ``(tensor, op)`` pair, the first op after ``op`` among ``keys`` (sorted unique
    ``tensor * stride + op``) of the same tensor, else ``missing``."""
    if not len(keys):
        return np.full(len(tensor), missing, dtype=np.int64)
    j = np.searchsorted(keys, tensor * stride + op, side="right")
    cand = keys[np.minimum(j, len(keys) - 1)]
    return np.where((j < len(keys)) & (cand // stride == tensor), cand % stride, missing).astype(np.int64)


class TraceIndex:
    """Static tables of one trace (all int64 / float64 / bool NumPy arrays unless said otherwise).

    Per event ``e``: ``event_op``, ``event_tensor``, and two *next uses*:

    * ``event_next_access[e]``: the trace's next access of the tensor, the first op after
      ``event_op[e]`` that reads or writes it (-1: none);
    * ``event_return_op[e]``: where a tensor acted on at ``e`` must be back on the device: the
      next access, clipped at the event of a plan's action (``event_op[e] ==
      Trace.action_window[0]``) to the tensor's return op (``Trace.action_window[1]``; an
      autograd node unpacks what it saved before its first op, ``Trace.saved_unpack_op``).
      Equal to ``event_next_access`` elsewhere.

    Per op ``k``: ``op_malloc`` / ``op_free`` (bytes allocated when it starts / released when it
    ends), ``op_scratch``, ``op_memory`` (bytes allocated while it runs without a plan,
    :attr:`Trace.op_memory`: the same arrays), ``op_duration``, ``op_phase``, and its inputs
    (tensors it reads and did not allocate itself: a re-run's inputs) as a CSR table
    ``op_inputs_ptr`` / ``op_inputs_idx`` (``op_inputs``: the same as a list of tuples).

    Per tensor: ``tensor_nbytes``, ``tensor_alloc_op``, ``tensor_free_op``, ``tensor_held_op``
    (:attr:`Trace.held_op`: an action frees it only after that op), ``movable``
    (:attr:`Trace.movable`) and ``recompute_limit`` (the last op before which it can be
    recomputed, -1: never; :meth:`_recompute_limits`).
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        n_ops, n_t = trace.n_ops, trace.n_tensors
        self.n_ops, self.n_tensors, self.n_events = n_ops, n_t, trace.n_events
        kind = trace.event_kind
        eop, ete = trace.event_op.astype(np.int64), trace.event_tensor.astype(np.int64)
        self.event_kind = kind
        self.event_op, self.event_tensor = eop, ete
        self.tensor_nbytes = trace.tensor_nbytes.astype(np.int64)
        alloc, free = trace.tensor_alloc_op.astype(np.int64), trace.tensor_free_op.astype(np.int64)
        self.tensor_alloc_op, self.tensor_free_op = alloc, free
        self.tensor_held_op = np.ascontiguousarray(trace.held_op, dtype=np.int64)
        self.movable = trace.movable
        self.initial_bytes = int(trace.initial_bytes)

        self.op_malloc = trace.op_malloc_bytes
        self.op_free = trace.op_free_bytes
        self.op_scratch = trace.op_scratch.astype(np.int64)
        self.op_memory = trace.op_memory
        self.op_duration = np.ascontiguousarray(trace.op_duration, dtype=np.float64)
        self.op_phase = trace.op_phase.astype(np.int64)
        self.op_end = trace.op_start + trace.op_duration

        stride = n_ops + 1
        is_use = (kind == EventKind.READ) | (kind == EventKind.WRITE)
        self.event_next_access = _next_op_of(np.unique(ete[is_use] * stride + eop[is_use]), ete, eop, stride, -1)
        action_op, return_op = trace.action_window
        at_action = (action_op[ete] >= 0) & (eop == action_op[ete]) & (self.event_next_access >= 0)
        self.event_return_op = np.where(at_action, np.minimum(self.event_next_access, return_op[ete]),
                                        self.event_next_access).astype(np.int64)
        #: per event: a read or write at the tensor's action op, used again (where a plan may act)
        self.event_at_action = is_use & (action_op[ete] >= 0) & (eop == action_op[ete]) & (self.event_return_op >= 0)

        reads = kind == EventKind.READ
        order = np.argsort(eop[reads], kind="stable")
        r_op, r_t = eop[reads][order], ete[reads][order]
        own = alloc[r_t] == r_op
        r_op, r_t = r_op[~own], r_t[~own]
        self.op_inputs_ptr = np.searchsorted(r_op, np.arange(n_ops + 1)).astype(np.int64)
        self.op_inputs_idx = np.ascontiguousarray(r_t, dtype=np.int64)
        self.recompute_limit = self._recompute_limits(
            np.isin(trace.tensor_role, RECOMPUTABLE_INPUT_ROLES))

    @cached_property
    def op_inputs(self) -> list[tuple[int, ...]]:
        """Per op, the tensors it reads and did not allocate itself (a re-run's inputs)."""
        ptr, idx = self.op_inputs_ptr.tolist(), self.op_inputs_idx.tolist()
        return [tuple(idx[ptr[p]:ptr[p + 1]]) for p in range(self.n_ops)]

    def _recompute_limits(self, role_ok: np.ndarray) -> np.ndarray:
        """Per tensor, the last op ``n`` before which it can be recomputed (-1: never).

        ``rec(T, n)`` (the validity rule of :mod:`dqn_swap.simulator`) is monotone in ``n``:
        inputs alive at a later op are alive at an earlier one.  So it is ``n <= limit[T]``, with
        ``limit[T] = min over inputs Y of producer p of
        max(min(free_op[Y], next write of Y after p), limit[Y])``.
        """
        trace = self.trace
        kind, eop, ete = self.event_kind, self.event_op, self.event_tensor
        alloc, free = self.tensor_alloc_op, self.tensor_free_op
        n_ops, n_t = self.n_ops, self.n_tensors
        big = n_ops + 1
        w = kind == EventKind.WRITE
        # Tensors never written after the op that allocated them.
        later = w & (eop != alloc[ete])
        stable = np.ones(n_t, dtype=bool)
        stable[ete[later]] = False
        # Ops writing something they did not allocate have side effects: never re-run them.
        side_effect = np.zeros(n_ops, dtype=bool)
        side_effect[eop[later]] = True
        # Next write of each tensor after each read event's op.
        stride = n_ops + 1
        reads = np.flatnonzero(kind == EventKind.READ)
        next_write = _next_op_of(np.unique(ete[w] * stride + eop[w]), ete[reads], eop[reads], stride, big)
        alive_lim = np.where(free < 0, big, free)
        leaf_lim = np.minimum(alive_lim[ete[reads]], next_write)  # Y usable as a leaf at n <= this

        producer_ok = (trace.op_phase == Phase.FORWARD) & ~side_effect
        produced = alloc >= 0
        base_ok = role_ok & stable & produced
        base_ok[produced] &= producer_ok[alloc[produced]]

        # Per producer op: min over its inputs; tensors processed in producer order (inputs come first).
        r_ops = eop[reads].tolist()
        r_ts = ete[reads].tolist()
        leaf_l = leaf_lim.tolist()
        alloc_l = alloc.tolist()
        by_op: dict[int, list[tuple[int, int]]] = {}
        for o, t, lf in zip(r_ops, r_ts, leaf_l):
            if alloc_l[t] != o and producer_ok[o]:
                by_op.setdefault(o, []).append((t, lf))
        limit_l = [-1] * n_t
        outputs_by_op: dict[int, list[int]] = {}
        for t in np.flatnonzero(base_ok).tolist():
            outputs_by_op.setdefault(alloc_l[t], []).append(t)
        for p in sorted(outputs_by_op):
            b = big
            for t, lf in by_op.get(p, ()):
                v = lf if lf > limit_l[t] else limit_l[t]
                if v < b:
                    b = v
            for t in outputs_by_op[p]:
                limit_l[t] = b
        return np.asarray(limit_l, dtype=np.int64)


class IndexLists:
    """The index as plain Python lists, for the reference engine's loops (list indexing beats
    NumPy scalar access); built when the reference engine first runs."""

    def __init__(self, index: TraceIndex, valid_swap: np.ndarray, valid_rec: np.ndarray) -> None:
        self.ev_tensor: list[int] = index.event_tensor.tolist()
        self.ev_op: list[int] = index.event_op.tolist()
        self.ev_next: list[int] = index.event_return_op.tolist()
        self.can_swap: list[bool] = valid_swap.tolist()
        self.can_rec: list[bool] = valid_rec.tolist()
        self.nbytes: list[int] = index.tensor_nbytes.tolist()
        self.alloc: list[int] = index.tensor_alloc_op.tolist()
        self.free: list[int] = index.tensor_free_op.tolist()
        self.held: list[int] = index.tensor_held_op.tolist()
        self.mal: list[int] = index.op_malloc.tolist()
        self.scr: list[int] = index.op_scratch.tolist()
        self.fre: list[int] = index.op_free.tolist()
        self.dur: list[float] = index.op_duration.tolist()
        self.oend: list[float] = index.op_end.tolist()
        self.phase: list[int] = index.op_phase.tolist()
        self.inputs: list[tuple[int, ...]] = index.op_inputs
