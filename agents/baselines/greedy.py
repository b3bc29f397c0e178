"""GREEDY: the offloading paper's eager, ordered schedule (Theorem 2).

Beaumont, Eyraud-Dubois and Shilova, "Optimal GPU-CPU offloading strategies
for DNN training" (Euro-Par 2020), section 4: if an activation may be
offloaded partially, the no-wait, *eager* (offload ``x_0, x_1, ...`` in
order) and *ordered* schedule that offloads exactly ``M_peak - M_GPU`` bytes is
optimal (Theorem 2), because any valid schedule offloads at least that much
(Proposition 2) and offloading less is never slower (Lemma 2).  Rounding up
to whole activations gives the GREEDY heuristic: offload the first ``k``
activations, ``k`` the smallest index with ``sum_{i <= k} |x_i| >= M_peak - M_GPU``.

We take the activations in the order of the chain of :mod:`.chain` (by
first backward use, latest first: the activations backward needs last come
first, as ``x_0, x_1, ...`` do in a sequential network), ``M_peak`` the
trace's unplanned peak and ``M_GPU`` the memory limit; each chosen
activation is swapped at its last forward use and the simulator schedules
transfers no-wait and in order.

Departure: the paper's model knows only activations, so its ``k`` always
fits there; our simulator also counts temporaries, gradients and the
timing of releases and prefetches, so ``k`` may be refused.  Then, as the
paper's Lemma 2 suggests (the smallest sufficient prefix is best), we take
the smallest longer prefix the simulator accepts, found by binary search.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts, smallest_feasible
from .chain import build_chain


class GreedyPlanner(BasePlanner):
    """GREEDY (offloading paper, Theorem 2): offload the shortest sufficient prefix of activations."""

    name = "greedy"

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        need = facts.trace.peak_bytes - evaluator.memory_limit
        members = build_chain(facts).members
        cumulative = np.cumsum(facts.act_bytes[members])
        n = facts.n_activations
        k = 0 if need <= 0 else min(int(np.searchsorted(cumulative, need, side="left")) + 1, n)

        def prefix(j: int) -> ActionSet:
            return facts.activation_actions(members[:j], ActionKind.SWAP)

        chosen = k
        if not evaluator.feasible(prefix(k)):
            first = smallest_feasible(evaluator, prefix, k + 1, n + 1)
            chosen = first if first <= n else k
        return prefix(chosen), {"offload_bytes_needed": int(max(need, 0)), "theorem_k": k,
                                  "offloaded": chosen}
