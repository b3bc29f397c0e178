"""The knapsack of ``torch.compile``'s memory-budget partitioner, on the recorded trace.

What users switch on.  With ``torch._functorch.config.activation_memory_budget``
below 1, the min-cut partitioner of ``torch.compile``
(``torch/_functorch/partitioners.py``, ``choose_saved_values_set``) decides
which forward values to save for backward and which to recompute by a 0/1
knapsack (``torch/_functorch/_activation_checkpointing/knapsack.py``): the
items are the values it could recompute, an item's weight is its size, its
value the runtime its recomputation would cost (estimated from FLOPs by
default), and the knapsack *saves* the set of greatest total runtime whose
size fits the budget; everything else is recomputed.  The default solver is
``dp_knapsack``, a dynamic program over sizes quantised to 10,000 steps of the
budget's range; ``greedy_knapsack`` saves items by runtime per byte, largest
first, while they fit.

In the simulator's model (:mod:`dqn_swap.simulator`):

* the budget is the memory limit minus what the trace needs at its peak op
  besides the saved activations: ``budget = limit - (op_memory[peak] - held)``,
  where ``held`` is the bytes of the activations (:class:`~.base.TraceFacts`)
  alive across the peak op -- made before it, used again after it -- which a
  plan can keep off the device while it runs;
* the items are those held activations the simulator can recompute
  (:meth:`~dqn_swap.simulator.Simulator.valid_actions`, ``can_recompute`` at
  the activation's last forward use); the held ones it cannot recompute are
  always saved and take their bytes off the budget first;
* an item's weight is its bytes, its value the duration of the op that
  produced it (the trace's own time, where ``torch.compile`` counts FLOPs);
* the activations not held across the peak cost nothing there and are saved.

The solver is ``dp`` (default, torch's ``dp_knapsack``: exact on the
quantised sizes) or ``greedy`` (torch's ``greedy_knapsack``).  Sizes are
quantised to ``resolution`` steps (default 10,000, torch's ``S``) of the
items' total size, rounded to the nearest step as torch does; where the
rounding lets the saved set exceed the budget in bytes, the program is solved
again with less capacity until it does not, and items the rounding left out
that still fit are added (:func:`dp_in_bytes`; torch accepts both errors).
As with torch's ``dp_knapsack``, an item whose producer takes no time adds no
value and is recomputed.  With steps of one byte (small traces) the dynamic
program is the exact optimum of the 0/1 knapsack.  Every item not saved is
recomputed after its last forward use.

Like a user lowering ``activation_memory_budget`` until the step fits, with
``budget_search`` (default) a plan the simulator finds infeasible is solved
again at 90 %, 80 %, ... 0 % of the items' budget, and the first feasible one
is kept (settings ``budget_fraction``); when none fits, the closest miss
(:meth:`~.base.Evaluator.rank`); without the search, the plan at the full
budget comes back as it is.

Departures from the real partitioner: it works on the joint forward-backward
FX graph, where recomputing a value re-runs the fused chain of cheap ops that
leads to it from saved values (its min cut chooses those), and the size of
every saved value counts, whatever its lifetime; here the items are the
recorded trace's saved activations, each re-created by re-running its
producer (and, recursively, producers of inputs no longer resident: the
simulator's recompute rule, which the knapsack's values do not count), and
only the activations alive across the peak op weigh on the budget.  The
partitioner bans some values from recompute (reductions, values used far
apart, ops not on its allow-list) before its knapsack; the simulator's
validity rules play that part here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts

SOLVERS = ("dp", "greedy")
#: torch's ``dp_knapsack`` quantises sizes to this many steps (its ``S``)
RESOLUTION = 10_000
#: the budget fractions ``budget_search`` tries after the full budget
SEARCH_FRACTIONS = tuple(k / 10 for k in range(9, -1, -1))


def dp_knapsack(weights: Sequence[int], values: Sequence[float], capacity: int) -> np.ndarray:
    """The 0/1 knapsack by dynamic programming over whole-number weights: which items to take.

    Maximises ``sum(values[taken])`` subject to ``sum(weights[taken]) <= capacity``;
    ``best[c]`` after item ``i`` is the greatest value of items ``0..i`` within weight
    ``c`` (torch's ``dp_knapsack``).  Items of weight 0 are always taken; a tie takes
    the item only if it adds value.  Returns a boolean mask over the items.
    """
    w = np.asarray(weights, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if w.shape != v.shape or w.ndim != 1:
        raise ValueError("weights and values must be two lists of the same length")
    if len(w) and (w.min() < 0 or v.min() < 0):
        raise ValueError("knapsack weights and values must be non-negative")
    n = len(w)
    taken = np.zeros(n, dtype=bool)
    if capacity < 0:
        return taken
    best = np.zeros(capacity + 1, dtype=np.float64)
    take = np.zeros((n, capacity + 1), dtype=bool)
    for i in range(n):
        wi, vi = int(w[i]), float(v[i])
        if wi > capacity:
            continue
        candidate = best[:capacity + 1 - wi] + vi
        better = candidate > best[wi:]
        take[i, wi:] = better
        best[wi:] = np.where(better, candidate, best[wi:])
    c = capacity
    for i in range(n - 1, -1, -1):
        if take[i, c]:
            taken[i] = True
            c -= int(w[i])
    return taken


def greedy_knapsack(weights: Sequence[int], values: Sequence[float], capacity: int) -> np.ndarray:
    """torch's ``greedy_knapsack``: items by value per weight, largest first, taken while they fit."""
    w = np.asarray(weights, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    ratio = np.divide(v, w, out=np.full(len(w), np.inf), where=w > 0)
    order = sorted(range(len(w)), key=lambda i: -ratio[i])  # stable: ties in item order, as torch's sort
    taken = np.zeros(len(w), dtype=bool)
    total = 0
    for i in order:
        if total + int(w[i]) <= capacity:
            total += int(w[i])
            taken[i] = True
    return taken


def quantise(weights: np.ndarray, resolution: int) -> tuple[np.ndarray, int]:
    """Weights in steps of ``unit = ceil(sum(weights) / resolution)`` bytes (at least 1), rounded to the
    nearest step as torch's ``dp_knapsack`` rounds its normalised sizes.  Returns ``(steps, unit)``."""
    total = int(weights.sum()) if len(weights) else 0
    unit = max(1, math.ceil(total / resolution))
    return (weights.astype(np.int64) * 2 + unit) // (2 * unit), unit


def dp_in_bytes(weights: np.ndarray, values: np.ndarray, budget: int, resolution: int) -> np.ndarray:
    """:func:`dp_knapsack` on sizes quantised to ``resolution`` steps, within ``budget`` *bytes*.

    Rounded sizes can make the chosen set a little larger than the budget in bytes; then the
    capacity in steps is lowered by the excess (rounded up) and the program solved again, until
    the set fits (at capacity 0 only items of less than half a step are left).  Rounding can also
    leave out an item that would still fit in bytes: such items are then added, most valuable
    first, while they fit.  With steps of one byte it is :func:`dp_knapsack` itself.
    """
    taken = np.zeros(len(weights), dtype=bool)
    if budget < 0:
        return taken
    steps, unit = quantise(weights, resolution)
    cap = budget // unit
    while True:
        taken = dp_knapsack(steps, values, cap)
        excess = int(weights[taken].sum()) - budget
        if excess <= 0:
            break
        if cap <= 0:  # only sub-step items are left, and they still do not fit
            taken[:] = False
            break
        cap = max(0, cap - -(-excess // unit))
    room = budget - int(weights[taken].sum())
    for i in sorted(np.flatnonzero(~taken).tolist(), key=lambda i: (-values[i], i)):
        if values[i] > 0 and weights[i] <= room:
            taken[i] = True
            room -= int(weights[i])
    return taken


def held_at(facts: TraceFacts, op: int) -> np.ndarray:
    """Whether each activation is alive across ``op``: its last forward use before, its next use after."""
    return (facts.act_ready_op < op) & (facts.act_need_op > op)


class KnapsackPlanner(BasePlanner):
    """``torch.compile``'s activation-memory-budget knapsack: recompute the cheapest bytes down to the budget."""

    name = "knapsack"
    limitation = ("recompute only, of the activations alive across the trace's peak op: what cannot be "
                  "recomputed, the tensors no plan may move and each op's own memory stay on the device")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"solver": "dp", "resolution": RESOLUTION, "budget_search": True}

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        solver, resolution = self.settings["solver"], self.settings["resolution"]
        if solver not in SOLVERS:
            raise ValueError(f"knapsack solver must be one of {', '.join(SOLVERS)}, not {solver!r}")
        if isinstance(resolution, bool) or not isinstance(resolution, int) or not 1 <= resolution <= 10**7:
            raise ValueError(f"resolution must be a whole number of steps from 1 to 10000000, not {resolution!r}")
        if not isinstance(self.settings["budget_search"], bool):
            raise ValueError(f"budget_search must be true or false, not {self.settings['budget_search']!r}")

    def solve(self, weights: np.ndarray, values: np.ndarray, budget: int) -> np.ndarray:
        """Which items to save under ``budget`` bytes, by the configured solver."""
        if self.settings["solver"] == "greedy":
            return greedy_knapsack(weights, values, budget)
        return dp_in_bytes(weights, values, budget, self.settings["resolution"])

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        tr = facts.trace
        peak = tr.peak_op
        held = held_at(facts, peak) if facts.n_activations else np.zeros(0, dtype=bool)
        can = evaluator.can_recompute[facts.act_event] if facts.n_activations else held
        items = np.flatnonzero(held & can)
        fixed = int(facts.act_bytes[held & ~can].sum()) if facts.n_activations else 0
        held_bytes = int(facts.act_bytes[held].sum()) if facts.n_activations else 0
        budget = evaluator.memory_limit - (int(tr.op_memory[peak]) - held_bytes)
        item_budget = budget - fixed
        weights = facts.act_bytes[items].astype(np.int64)
        values = tr.op_duration[facts.act_alloc_op[items]].astype(np.float64)

        def plan_at(fraction: float) -> tuple[ActionSet, np.ndarray]:
            cap = int(math.floor(item_budget * fraction)) if item_budget > 0 else item_budget
            saved = self.solve(weights, values, cap)
            return facts.activation_actions(items[~saved].tolist(), ActionKind.RECOMPUTE), saved

        fraction = 1.0
        actions, saved = plan_at(fraction)
        if self.settings["budget_search"] and item_budget > 0 and not evaluator.feasible(actions):
            tried = {fraction: (actions, saved)}
            for f in SEARCH_FRACTIONS:
                tried[f] = plan_at(f)
                if evaluator.feasible(tried[f][0]):
                    break
            fraction = min(tried, key=lambda f: (evaluator.rank(tried[f][0]), -f))
            actions, saved = tried[fraction]
        return actions, {
            "peak_op": int(peak), "budget_bytes": int(budget), "item_budget_bytes": int(item_budget),
            "budget_fraction": fraction, "items": len(items), "held_not_recomputable_bytes": fixed,
            "saved": int(saved.sum()), "recomputed": len(actions),
            "recompute_estimate_s": float(values[~saved].sum()) if len(items) else 0.0}
