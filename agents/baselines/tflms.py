"""TFLMS: TensorFlow Large Model Support's swap-out threshold rule (Le et al. 2018, 2019).

Le, Imai, Negishi and Kawachiya, "TFLMS: Large model support in TensorFlow
by graph rewriting" (arXiv:1807.02037) and "Automatic GPU memory management
for large neural models in TensorFlow" (ISMM 2019), as summarised by the
window paper (section 2) and the offloading paper (section 6.1): TFLMS
rewrites the graph, inserting a swap-out/swap-in pair on an edge from a
forward op to a backward op when the topological distance between the two
exceeds ``swapout_threshold``; the swap-in is triggered ``swapin_ahead``
ops before the consumer.  The parameters are set by hand or by TFLMS's
simulation-based auto-tuning; the offloading paper reports, for each memory
limit, the parameters that give the least makespan among all values.

Mapping: for every forward activation (:class:`TraceFacts`) the distance is
the number of ops between the op that produced it and the first backward
op that reads it (trace order is a topological order of the graph); the
tensors with distance above the threshold are swapped out at their last
forward use -- the earliest moment the graph's swap-out frees device memory,
since the forward consumers still read the device copy until then.  Every
distinct threshold is simulated and the feasible plan of least makespan is
kept, as the offloading paper tunes TFLMS.  ``swapin_ahead`` is not searched:
our simulator fixes prefetch timing (earliest reuse first, as soon as the
tensor fits), so it would change nothing; it is recorded as ``None``.

Departure, for planning time only: thresholds that swap fewer bytes than
``M_peak - M_GPU`` cannot give a feasible plan (offloading paper,
Proposition 2) and are not simulated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts


def swap_distance(facts: TraceFacts) -> np.ndarray:
    """Ops from each activation's producer to its first use in backward."""
    return facts.act_need_op - facts.act_alloc_op


def thresholded(facts: TraceFacts, threshold: int) -> np.ndarray:
    """Positions (in :class:`TraceFacts` order) of the activations whose distance exceeds ``threshold``."""
    return np.flatnonzero(swap_distance(facts) > threshold)


class TflmsPlanner(BasePlanner):
    """TFLMS ``swapout_threshold`` rule, with the threshold tuned by simulation."""

    name = "tflms"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"swapout_threshold": None}

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        fixed = self.settings["swapout_threshold"]
        dist = swap_distance(facts)
        if fixed is not None:
            thresholds = [int(fixed)]
        else:  # every distinct rule: swap nothing, then ever lower thresholds
            thresholds = [int(dist.max(initial=0))] + sorted({int(d) - 1 for d in dist}, reverse=True)
        need = facts.trace.peak_bytes - evaluator.memory_limit
        sizes = facts.act_bytes
        candidates = {th: thresholded(facts, th) for th in thresholds}
        possible = {th: v for th, v in candidates.items() if sizes[v].sum() >= need}
        if not possible:  # nothing can fit: report the lowest threshold honestly
            low = min(candidates)
            possible = {low: candidates[low]}
        plans = {th: facts.activation_actions(v, ActionKind.SWAP) for th, v in possible.items()}
        best = evaluator.best(plans.values())
        threshold = max(th for th, v in plans.items() if v == best)
        return best, {"swapout_threshold": threshold, "swapin_ahead": None, "tuned": fixed is None,
                      "thresholds_simulated": len(possible), "swapped": len(best)}
