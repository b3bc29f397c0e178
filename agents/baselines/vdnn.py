"""VDNN: the vDNN-style heuristic as the offloading paper defines it (its section 6.1).

Beaumont, Eyraud-Dubois and Shilova, "Optimal GPU-CPU offloading strategies
for DNN training" (Euro-Par 2020), section 6.1: vDNN++ (Shriram et al.,
after vDNN, Rhu et al. 2016) offloads the inputs of convolutions, "because
CONV layers have a much longer computation latency, being more likely to
effectively hide the latency of offload/prefetch", either of every
convolution or of every other one.  Their chains carry no layer types, so
their VDNN computes the ratio ``u_{F_i} / |x_i|`` of every activation, and for
every threshold simulates the no-wait, ordered schedule that offloads all
activations whose ratio is above the threshold, and the one that offloads
half of them (every other one); it returns the best of these schedules.

Mapping: ``u_{F_i}`` of an activation is the time of the forward ops that
read it (the computation its offload can hide behind); "half" keeps every
other activation of the set in forward order.  Because our traces do name
their ops, the two original vDNN++ schedules -- offload the input of every
forward convolution, and of every other one -- are candidates as well (the
paper uses ratios only because its chains lack the names).  Every candidate
is simulated; the plan is the feasible candidate of least makespan.

Departure, for planning time only: a candidate offloading fewer bytes than
``M_peak - M_GPU`` cannot be feasible (the paper's Proposition 2) and is not
simulated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind
from dqn_swap.trace import Phase

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts


def forward_read_time(facts: TraceFacts) -> np.ndarray:
    """Seconds of the forward ops that read each activation (each op counted once)."""
    tr = facts.trace
    out = np.zeros(facts.n_activations)
    for i, t in enumerate(facts.act_tensor):
        ops = np.unique(facts.read_ops_of(int(t)))
        ops = ops[tr.op_phase[ops] == Phase.FORWARD]
        out[i] = tr.op_duration[ops].sum()
    return out


def convolution_inputs(facts: TraceFacts) -> np.ndarray:
    """Positions (in :class:`TraceFacts` order) of the activations a forward convolution reads."""
    tr = facts.trace
    conv_names = np.array(["convolution" in n for n in tr.op_names], dtype=bool)
    picked = []
    for i, t in enumerate(facts.act_tensor):
        ops = facts.read_ops_of(int(t))
        ops = ops[tr.op_phase[ops] == Phase.FORWARD]
        if conv_names[tr.op_name[ops]].any():
            picked.append(i)
    return np.array(picked, dtype=np.int64)


class VdnnPlanner(BasePlanner):
    """VDNN (offloading paper, section 6.1): ratio-threshold and convolution-input offloading."""

    name = "vdnn"

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        ratio = forward_read_time(facts) / np.maximum(facts.act_bytes, 1)
        sets: dict[str, np.ndarray] = {}
        for threshold in np.unique(ratio):
            chosen = np.flatnonzero(ratio >= threshold)
            sets[f"ratio>={threshold:.3e}"] = chosen
            sets[f"ratio>={threshold:.3e}/half"] = chosen[::2]
        conv = convolution_inputs(facts)
        sets["conv_inputs"] = conv
        sets["conv_inputs/half"] = conv[::2]
        need = facts.trace.peak_bytes - evaluator.memory_limit
        sizes = facts.act_bytes
        possible = {k: v for k, v in sets.items() if sizes[v].sum() >= need}
        if not possible:  # nothing can fit: report the most aggressive schedule honestly
            possible = {"all": np.arange(facts.n_activations)}
        candidates = {k: facts.activation_actions(v, ActionKind.SWAP) for k, v in possible.items()}
        best = evaluator.best(candidates.values())
        label = next(k for k, v in candidates.items() if v == best)
        return best, {"schedule": label, "candidates": len(sets), "simulated_candidates": len(possible),
                      "conv_inputs": len(conv)}
