"""Offload every saved activation, as torchtune's ``OffloadActivations`` does, alone and with per-block checkpointing.

What users switch on.  torchtune's ``OffloadActivations``
(``torchtune/training/_activation_offloading.py``, the recipes'
``enable_activation_offloading``) is a ``saved_tensors_hooks`` context: every
tensor autograd saves for backward that is at least ``min_offload_size`` bytes
(default 1024) and is not a parameter or buffer is copied to pinned host
memory on a side stream, and brought back when backward unpacks it.  It does
not look at the memory limit: everything goes.  The recipes combine it with
per-layer activation checkpointing (``enable_activation_checkpointing``), so
that what autograd saves is only each checkpointed layer's input, and that is
offloaded too.

``offload-all``: every activation (:class:`~.base.TraceFacts`: a tensor
autograd saved for backward and used again in backward, the batch included
when autograd saves it) of at least ``min_offload_bytes`` is swapped after its
last forward use.  In the simulator's terms this is Layrub's plan
(:mod:`.layrub`) with torchtune's size floor.

``offload-all+per-block``: per-block checkpointing (:mod:`.per_block`)
recomputes what it recomputes inside the blocks; every other activation of at
least ``min_offload_bytes`` -- the blocks' inputs, the activations outside
blocks, and those inside blocks the simulator cannot recompute -- is swapped.
Without repeated blocks it is not applicable, like per-block checkpointing.

Where the plan does not fit, it is infeasible, as the user's run would run
out of memory.

Departures (the ruler's model, :mod:`dqn_swap.simulator`): torchtune starts
each copy to the host when the tensor is saved, and keeps up to
``max_fwd_stash_size`` (5) recent ones on the device until their copies
complete; the simulator starts a copy at the tensor's last forward use and
frees the device memory when the copy completes.  torchtune brings a tensor
back when backward unpacks it, on demand; the simulator prefetches swapped
tensors earliest reuse first as soon as they fit under the limit, which
stalls backward less.  So these figures are what the switch costs at best.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts
from .per_block import block_container, not_applicable, per_block_recompute

#: torchtune's ``OffloadActivations(min_offload_size=1024)``: smaller tensors stay on the device
MIN_OFFLOAD_BYTES = 1024


def offloadable(facts: TraceFacts, evaluator: Evaluator, min_bytes: int) -> np.ndarray:
    """Whether each activation (in :class:`TraceFacts` order) may be offloaded: big enough and swappable."""
    if not facts.n_activations:
        return np.zeros(0, dtype=bool)
    return (facts.act_bytes >= min_bytes) & evaluator.can_swap[facts.act_event]


def _check_min_bytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"min_offload_bytes must be a non-negative whole number of bytes, not {value!r}")
    return int(value)


class _Offloading(BasePlanner):
    """Shared setting of both planners: torchtune's size floor, checked when the planner is made."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"min_offload_bytes": MIN_OFFLOAD_BYTES}

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.settings["min_offload_bytes"] = _check_min_bytes(self.settings["min_offload_bytes"])


class OffloadAllPlanner(_Offloading):
    """torchtune's activation offloading: swap every saved activation of at least ``min_offload_bytes``."""

    name = "offload-all"
    limitation = ("swaps only: everything stays until its swap-out completes, and what is smaller than "
                  "min_offload_bytes, the tensors no plan may move and each op's own memory stay on the device")

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        min_bytes = self.settings["min_offload_bytes"]
        chosen = np.flatnonzero(offloadable(facts, evaluator, min_bytes))
        actions = facts.activation_actions(chosen.tolist(), ActionKind.SWAP)
        return actions, {"offloaded": len(actions), "kept": facts.n_activations - len(actions),
                         "offloaded_bytes": int(facts.act_bytes[chosen].sum()) if len(chosen) else 0}


class OffloadAllPerBlockPlanner(_Offloading):
    """torchtune's offloading on top of per-block checkpointing: recompute inside blocks, offload the rest."""

    name = "offload-all+per-block"
    limitation = ("recomputes inside repeated blocks and swaps the rest, whatever the limit: each block's "
                  "re-created activations, what is smaller than min_offload_bytes and the tensors no plan may "
                  "move stay on the device")

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        min_bytes = self.settings["min_offload_bytes"]
        blocks, recompute, stuck = per_block_recompute(facts, evaluator)
        why = not_applicable(facts.trace, blocks)
        if why:
            return (), {"blocks": len(blocks), "not_applicable": why}
        swap = offloadable(facts, evaluator, min_bytes)
        swap[recompute] = False
        actions = (facts.activation_actions(recompute.tolist(), ActionKind.RECOMPUTE)
                   + facts.activation_actions(np.flatnonzero(swap).tolist(), ActionKind.SWAP))
        return tuple(sorted(actions)), {
            "blocks": len(blocks), "containers": block_container(blocks), "recomputed": len(recompute),
            "offloaded": int(swap.sum()), "not_recomputable": len(stuck),
            "kept": facts.n_activations - len(recompute) - int(swap.sum())}
