"""The ``sqrt-n`` planner: sublinear-memory checkpointing (Chen et al. 2016; MXNet's memonger).

Chen, Xu, Zhang and Guestrin, "Training deep nets with sublinear memory
cost" (arXiv:1604.06174): split an ``n``-layer chain into about ``sqrt(n)``
segments, keep only each segment's output during forward, and recompute
each segment's inside from its kept input during backward (section 4.1),
for ``O(sqrt(n))`` memory at the cost of one more forward pass.  For general
graphs, "Memory Planning with Budget" (their Algorithm 2) walks the nodes
in topological order, adding up the memory of dropped outputs, and keeps a
node whose output is a *candidate stage-splitting point* once the running
total exceeds a budget ``B``; memonger's ``search_plan`` tries ``B = 0``, then
``B = sqrt(x * y / 2)`` from the previous run's kept bytes ``x`` and largest
segment ``y`` (three times), then a grid of six budgets between the smallest
segment size seen and ``sqrt(2)`` times the last guess, and keeps the plan
of least memory.

Mapping: a *layer* is a forward op that produces activations
(:class:`TraceFacts`); its outputs are kept or dropped together.  A layer is
a candidate splitting point when it cuts the forward graph: no tensor
produced before it is read by a later forward op (in a ResNet, the block
outputs).  Dropping an activation is a recompute action at its last forward
use; the simulator re-runs its producer before its next read, which is the
segment recomputation done one op at a time.  Activations the simulator
cannot recompute -- those written in place after they were produced (a
batch-norm output that an in-place ReLU overwrites), or whose producer has
side effects -- stay resident whatever the plan.  The ``sqrt(n)`` plan keeps a
splitting point every ``ceil(sqrt(n))`` layers; with ``budget_search`` the
memonger budgets are candidates too.  Every candidate is simulated and the
feasible one of least makespan is kept (memonger ranks by memory because it
has no limit to meet; with none feasible, the closest miss is returned).

The method needs about ``sqrt(n)`` splitting points to cut ``n`` layers into
``sqrt(n)`` segments.  A recurrent network (the zoo's ``lstm`` models, the GRU
sequence-to-sequence family) has almost none: the input sequence and each
layer's outputs are read at every time step, so a whole recurrence is one
segment, and re-creating it one op at a time before each backward read costs a
number of re-runs quadratic in its length (on ``lstm`` at batch 32, 1,398
dropped activations took 718,046 re-runs: a simulated overhead of 8,762 %).
With fewer splitting points than ``ceil(sqrt(n)) - 1`` the planner says it is
not applicable (``Plan.settings["not_applicable"]``, and ``limitation`` when
the limit needs a plan) and returns the empty plan, whose simulated figures
are then its honest result: feasible only where no plan is needed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind
from dqn_swap.trace import Phase

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts


def layers(facts: TraceFacts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward ops producing activations, their activation bytes, and whether each is a splitting point."""
    tr = facts.trace
    ops = np.unique(facts.act_alloc_op)
    sizes = np.zeros(len(ops), dtype=np.int64)
    np.add.at(sizes, np.searchsorted(ops, facts.act_alloc_op), facts.act_bytes)
    # latest[k]: the last forward op reading any tensor produced before op k.
    n_fwd = facts.backward_start
    latest = np.full(n_fwd + 1, -1, dtype=np.int64)
    for t in np.flatnonzero((tr.tensor_alloc_op >= 0) & (tr.tensor_alloc_op < n_fwd)):
        reads = facts.read_ops_of(int(t))
        reads = reads[tr.op_phase[reads] == Phase.FORWARD]
        if len(reads):
            k = int(tr.tensor_alloc_op[t]) + 1
            latest[k] = max(latest[k], int(reads[-1]))
    latest = np.maximum.accumulate(latest)
    split = latest[ops] <= ops
    return ops, sizes, split


def budget_plan(sizes: np.ndarray, split: np.ndarray, budget: float) -> tuple[np.ndarray, int, int]:
    """Chen et al.'s Algorithm 2: which layers to keep, kept bytes ``x`` and largest segment ``y``."""
    keep = np.zeros(len(sizes), dtype=bool)
    temp = kept = largest = 0
    for i, size in enumerate(sizes):
        temp += int(size)
        if split[i] and temp > budget:
            keep[i] = True
            kept += int(size)
            largest = max(largest, temp)
            temp = 0
    return keep, kept, max(largest, temp)


def sqrt_plan(split: np.ndarray) -> np.ndarray:
    """Keep a splitting point every ``ceil(sqrt(n))`` layers: about ``sqrt(n)`` segments."""
    n = len(split)
    every = math.ceil(math.sqrt(n)) if n else 1
    keep, _, _ = budget_plan(np.ones(n, dtype=np.int64), split, every - 1)
    return keep


def not_applicable(n_layers: int, splitting_points: int) -> str:
    """Why sqrt(n) checkpointing cannot segment this graph (empty: it can); see the module docstring."""
    needed = math.ceil(math.sqrt(n_layers)) - 1 if n_layers else 0
    if splitting_points >= needed:
        return ""
    return (f"not applicable: the forward graph has {splitting_points} splitting points among {n_layers} layers, "
            f"fewer than the {needed} that sqrt(n) segments need (tensors read across many layers, such as a "
            "recurrence's input sequence and state or an encoder's output that every decoder layer reads, leave "
            "few places to cut, and re-creating a long segment one op at a time costs re-runs quadratic in its "
            "length)")


def memonger_budgets(sizes: np.ndarray, split: np.ndarray, trials: int = 6, guesses: int = 3) -> list[float]:
    """The budgets memonger's ``search_plan`` tries (see the module docstring)."""
    budgets = [0.0]
    _, kept, smallest = budget_plan(sizes, split, 0.0)
    budget = math.sqrt(kept * smallest / 2)
    for _ in range(guesses - 1):
        budgets.append(budget)
        _, kept, largest = budget_plan(sizes, split, budget)
        smallest = min(smallest, largest)
        budget = math.sqrt(kept * largest / 2)
    top = budget * math.sqrt(2)
    step = (top - smallest) / trials
    if step > 0:
        budgets += [smallest + step * (k + 1) for k in range(trials)]
    return budgets


class SqrtNPlanner(BasePlanner):
    """Chen et al.'s sqrt(n) recompute-only checkpointing with memonger's budget search."""

    name = "sqrt-n"
    limitation = ("recompute only: it never swaps, so each segment's kept input, the activations that cannot be "
                  "recomputed (written in place after they were made) and a segment's re-created activations "
                  "stay on the device")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"budget_search": True}

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        ops, sizes, split = layers(facts)
        why = not_applicable(len(ops), int(split.sum()))
        if why:
            return (), {"schedule": None, "layers": len(ops), "splitting_points": int(split.sum()),
                        "not_applicable": why}
        layer_of = np.searchsorted(ops, facts.act_alloc_op)
        droppable = evaluator.can_recompute[facts.act_event]

        def plan_of(keep: np.ndarray) -> ActionSet:
            return facts.activation_actions(np.flatnonzero(~keep[layer_of] & droppable), ActionKind.RECOMPUTE)

        candidates: dict[str, tuple[np.ndarray, ActionSet]] = {}
        keep = sqrt_plan(split)
        candidates["sqrt(n)"] = (keep, plan_of(keep))
        if self.settings["budget_search"]:
            for b in memonger_budgets(sizes, split):
                keep = budget_plan(sizes, split, b)[0]
                candidates[f"budget={b:.0f}"] = (keep, plan_of(keep))
        best = evaluator.best(a for _, a in candidates.values())
        label = next(k for k, (_, a) in candidates.items() if a == best)
        kept = candidates[label][0]
        return best, {"schedule": label, "layers": len(ops), "splitting_points": int(split.sum()),
                      "segments": int(kept.sum()), "recomputed": len(best),
                      "not_recomputable": int((~droppable).sum())}
