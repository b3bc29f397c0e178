"""Layrub's inter-layer memory reuse and data migration (Jin et al., TACO 2018).

Jin et al., "Layer-centric memory reuse and data migration for extreme-scale
deep learning on many-core architectures", section 3.3 (inter-layer reuse)
and section 4.1 (implementation): a *Tracer* counts, before training, how
many later layers refer to each layer's activation data (``addRef``); during
the forward phase each use decrements the count (``subRef``) and when it
reaches zero *InterLayer* offloads the data to host memory on a separate
CUDA stream (``Offload``).  In the backward phase, while layer ``l``
computes, the data of layer ``l - 1`` is loaded back (``Loadin``): prefetch
one layer ahead.  The strategy does not depend on the memory available: it
offloads every layer's output, keeping device memory nearly constant in
depth.

Mapping: a layer's activation data are the trace's forward activations
(tensors autograd saved for backward), and the reference count reaches zero
at each one's last forward use (:class:`TraceFacts`), where its swap acts.
Prefetching is not ours to choose: the simulator brings swapped tensors back
earliest-reuse first as soon as they fit, which starts at least as early as
Layrub's one-layer lookahead whenever memory allows.  Layrub's intra-layer
reuse (gradients written over activations, section 3.2) and its compressed
ReLU masks (section 4.2) change the framework's allocator, not what is
transferred, and have no counterpart in a plan.
"""

from __future__ import annotations

from typing import Any

from dqn_swap.plan import ActionKind

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts


class LayrubPlanner(BasePlanner):
    """Layrub inter-layer strategy: offload every activation once its reference count is zero."""

    name = "layrub"

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        return facts.activation_actions(range(facts.n_activations), ActionKind.SWAP), {
            "offloaded": facts.n_activations}
