"""SuperNeurons-style memory management: an LRU tensor cache plus recomputation of cheap layers.

Wang et al., "SuperNeurons: Dynamic GPU memory management for training deep
neural networks" (PPoPP 2018), as the DQN paper describes it (Chen, "GPU
memory management for neural networks using deep Q-network", sections 2
and 5): GPU memory is a cache of tensors with least-recently-used
replacement -- when an allocation does not fit, the tensors used longest ago
are offloaded to host memory and brought back when next needed -- and
cheap layers (ReLU, batch normalisation, pooling: the layers whose forward
pass costs little for the memory their output takes) are recomputed in
backward instead of being kept or transferred.  The DQN paper runs it in
three modes: recomputation, swapping, and both.

Mapping: we replay the trace's unplanned memory curve op by op with the
cache (:func:`lru_replay`).  Before an op runs, the evicted tensors it uses
come back; its outputs are allocated; if the total exceeds the cache
capacity, resident saved activations not used by this op and used again
later are evicted, least recently used first, until it fits.  An
evicted tensor is dropped for recomputation when its producer is a cheap
forward op and offloaded otherwise (mode ``"both"``); mode ``"swap"``
offloads every eviction and mode ``"recompute"`` only evicts cheap
tensors.  An op is *cheap* when its duration per byte moved is at most
``cheap_factor`` times that of a purely memory-bound kernel on the profile
(``launch_overhead + bytes / (memory_bandwidth * efficiency)``): element-wise
ops, normalisation and pooling are memory-bound, convolutions and matrix
products are not.  Each eviction becomes one action at the tensor's last use
before the eviction; a tensor that came back stays (one action per tensor).

Departure: SuperNeurons reacts at run time, when an allocation actually
fails; a static plan must leave the headroom that transfers still in
flight need.  The replay's capacity therefore starts at the memory limit
and, while the simulator finds the plan infeasible, is lowered: down a grid
of ``search_steps`` capacities towards the persistent bytes until one plan
is feasible, then by bisection towards the largest feasible capacity.  An
evicted cheap tensor that the simulator cannot recompute (written in place
after it was produced) is offloaded instead.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from dqn_swap.plan import Action, ActionKind
from dqn_swap.trace import Phase

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts

MODES = ("both", "swap", "recompute")


def cheap_ops(facts: TraceFacts, factor: float, profile_launch: float, bytes_per_second: float) -> np.ndarray:
    """Bool per op: forward ops whose duration is within ``factor`` of a memory-bound kernel's."""
    tr = facts.trace
    memory_bound = profile_launch + tr.op_bytes / bytes_per_second
    return (tr.op_phase == Phase.FORWARD) & (tr.op_duration <= factor * memory_bound)


def lru_replay(facts: TraceFacts, capacity: int, cheap: np.ndarray, evict_expensive: bool,
               can_swap: np.ndarray, can_recompute: np.ndarray) -> ActionSet:
    """Actions of an LRU cache of ``capacity`` bytes replaying the trace (see the module docstring).

    ``cheap`` marks tensors dropped for recomputation when evicted (where the
    simulator allows recomputing them); ``evict_expensive`` allows offloading
    the others.  ``can_swap`` and ``can_recompute`` are the simulator's
    per-event validity masks.
    """
    tr = facts.trace
    nbytes = tr.tensor_nbytes.tolist()
    saved = tr.movable.tolist()
    memory = tr.initial_bytes
    lru: OrderedDict[int, int] = OrderedDict()  # resident saved tensor -> op of its last use
    away: set[int] = set()
    acted: set[int] = set()
    actions: list[Action] = []
    uses, mallocs, frees = facts.op_uses
    for op in range(tr.n_ops):
        used = uses[op]
        for t in used:
            if t in away:  # evicted tensors come back before the op uses them
                away.discard(t)
                memory += nbytes[t]
        memory += mallocs[op]
        for t in used:
            if saved[t] and t not in acted:
                lru[t] = op
                lru.move_to_end(t)
        if memory > capacity:
            for t in list(lru):
                if memory <= capacity:
                    break
                if t in used:
                    break  # everything from here on was used by this op
                last_op = lru[t]
                event = facts.last_event_at(t, last_op)
                if cheap[t] and can_recompute[event]:
                    action_kind = ActionKind.RECOMPUTE
                elif evict_expensive and can_swap[event]:
                    action_kind = ActionKind.SWAP
                else:
                    continue  # not evictable here (e.g. never used again)
                del lru[t]
                acted.add(t)
                away.add(t)
                memory -= nbytes[t]
                actions.append(Action(event, t, action_kind))
        for t in frees[op]:
            lru.pop(t, None)
            if t not in away:
                memory -= nbytes[t]
    return tuple(sorted(actions))


class LruPlanner(BasePlanner):
    """SuperNeurons-style LRU swapping with recomputation of cheap layers."""

    name = "lru"
    limitation = ("it recomputes every evicted cheap layer (normalisation, activation, pooling, add), and a re-run "
                  "needs the layer's input on the device beside its output at the busiest backward ops; "
                  "mode=swap swaps them instead")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"mode": "both", "cheap_factor": 1.5, "search_steps": 12}

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        mode = self.settings["mode"]
        if mode not in MODES:
            raise ValueError(f"lru mode must be one of {', '.join(MODES)}, not {mode!r}")
        tr = facts.trace
        p = evaluator.profile
        cheap = cheap_ops(facts, float(self.settings["cheap_factor"]), p.launch_overhead,
                          p.memory_bandwidth * p.efficiency)
        producer = np.maximum(tr.tensor_alloc_op, 0)
        cheap_tensor = np.zeros(tr.n_tensors, dtype=bool)
        if mode != "swap":
            cheap_tensor = (tr.tensor_alloc_op >= 0) & cheap[producer]
        evict_expensive = mode != "recompute"

        def plan_at(capacity: int) -> ActionSet:
            return lru_replay(facts, capacity, cheap_tensor, evict_expensive, evaluator.can_swap,
                              evaluator.can_recompute)

        limit = evaluator.memory_limit
        tried = {limit: plan_at(limit)}
        if not evaluator.feasible(tried[limit]):
            # Feasibility need not be monotone in the capacity (evicting more also means more
            # recomputation, which allocates): scan down a grid, then bisect the first gap.
            floor = min(tr.persistent_bytes, limit)
            grid = self.settings["search_steps"]
            hi = limit
            for j in range(1, grid + 1):
                lo = limit - (limit - floor) * j // grid
                tried[lo] = plan_at(lo)
                if evaluator.feasible(tried[lo]):
                    for _ in range(grid):
                        mid = (lo + hi) // 2
                        if mid in (lo, hi):
                            break
                        tried[mid] = plan_at(mid)
                        if evaluator.feasible(tried[mid]):
                            lo = mid
                        else:
                            hi = mid
                    break
                hi = lo
        best = evaluator.best(tried.values())
        capacity = max(c for c, a in tried.items() if a == best)
        return best, {"capacity": capacity, "cheap_ops": int(cheap.sum()),
                      "swapped": sum(a.kind == ActionKind.SWAP for a in best),
                      "recomputed": sum(a.kind == ActionKind.RECOMPUTE for a in best)}
