"""Per-block activation checkpointing, as Hugging Face's ``gradient_checkpointing_enable()`` applies it.

What users switch on.  In ``transformers`` every decoder or encoder layer is
a ``GradientCheckpointingLayer`` (``transformers/modeling_layers.py``); after
``model.gradient_checkpointing_enable()`` each layer's ``forward`` runs under
``torch.utils.checkpoint``: in forward the layer keeps only its inputs, and
in backward its forward is run again to re-create everything it saved for
backward.  It is all or nothing: every layer, every activation inside it,
whatever the memory limit.  torchtune's ``apply_selective_activation_checkpointing``
with ``ac_mode="full"`` and torchvision users wrapping each residual block in
``checkpoint`` do the same.

In the trace's terms:

* **Blocks** come from the module paths the recorder gave the ops.  A block
  is the outermost module whose path ends in an integer (a child of a
  ``ModuleList`` or ``Sequential``: ``model.layers.3``, ``blocks.0``,
  ``features.7``) and that contains other modules -- a leaf such as the stem
  convolution ``features.0`` of a ``Sequential`` is not a block.  Ops run by
  the block's own ``forward`` (a residual add) and by its submodules belong
  to it.  With fewer than two blocks (no module paths, or nothing repeated)
  the planner says it is not applicable and returns the empty plan, as the
  other baselines do where their method does not apply.
* **Recomputed**: every activation (:class:`~.base.TraceFacts`: a tensor
  autograd saved for backward, used again after forward) produced by an op
  of a block and read in forward only by ops of that block -- all of them,
  not only as many as the limit needs.  A recompute action removes it after
  its last forward use.
* **Kept**: the blocks' inputs, i.e. what a block receives from outside --
  activations made before it (the previous block's output, which that block
  hands on and the next keeps as its checkpoint input, and tensors made
  outside every block, such as rotary tables), the batch, and activations
  outside every block.  An activation inside a block that the simulator
  cannot recompute (written in place after it was made, or made by an op
  with side effects; :meth:`~dqn_swap.simulator.Simulator.valid_actions`)
  stays too; ``settings["not_recomputable"]`` counts them.

Where the plan does not fit the limit the simulator says so and the plan is
infeasible, as the user's switch would run out of memory.

Departure (the ruler's recompute model, :mod:`dqn_swap.simulator`): the
simulator re-creates each removed activation just in time before its first
backward reader, re-running its producers back to the nearest resident
tensors, and frees what it re-created on the way.  ``torch.utils.checkpoint``
re-runs the whole layer once, at the layer's first backward op, and keeps all
it re-created until each one's backward use.  The simulator therefore holds
less memory during a block's backward; its recompute time differs from one
re-run of the blocks' forward ops both ways: an op whose output several
backward readers need is re-run for each of them, and an op whose outputs are
kept (block outputs, activations it cannot recompute) is not re-run at all.
``benchmarks/bench_user_baselines.py`` reports both figures.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind
from dqn_swap.trace import Phase, Trace

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts


def block_paths(trace: Trace) -> list[str]:
    """The trace's repeated blocks (module docstring), in the order their first forward op runs."""
    names = trace.module_names
    candidates: set[str] = set()
    for name in names:
        parts = name.split(".") if name else []
        for i, part in enumerate(parts):
            if part.isdigit():
                candidates.add(".".join(parts[:i + 1]))
                break
    blocks = [c for c in candidates if any(n.startswith(c + ".") for n in names)]
    if not blocks:
        return []
    first_op: dict[str, int] = {}
    owner = block_of_module(trace, blocks)
    forward = trace.op_phase == Phase.FORWARD
    for op in np.flatnonzero(forward).tolist():
        b = owner[trace.op_module[op]]
        if b >= 0:
            first_op.setdefault(blocks[b], op)
    return sorted(first_op, key=lambda b: first_op[b])


def block_of_module(trace: Trace, blocks: list[str]) -> np.ndarray:
    """Per module name of the trace: the index in ``blocks`` of the block it lies in, -1 for none."""
    out = np.full(len(trace.module_names), -1, dtype=np.int64)
    for m, name in enumerate(trace.module_names):
        for b, path in enumerate(blocks):
            if name == path or name.startswith(path + "."):
                out[m] = b
                break
    return out


def block_of_op(trace: Trace, blocks: list[str]) -> np.ndarray:
    """Per op: the index in ``blocks`` of the block whose forward ran it, -1 for none (backward ops too)."""
    if not trace.n_ops:
        return np.zeros(0, dtype=np.int64)
    out = block_of_module(trace, blocks)[trace.op_module]
    out[trace.op_phase != Phase.FORWARD] = -1
    return out


def inside_blocks(facts: TraceFacts, blocks: list[str]) -> np.ndarray:
    """Positions (in :class:`TraceFacts` order) of the activations made inside a block and read in
    forward only by that block's ops: what checkpointing the block re-creates in backward."""
    tr = facts.trace
    owner = block_of_op(tr, blocks)
    picked = []
    for i, (t, alloc) in enumerate(zip(facts.act_tensor.tolist(), facts.act_alloc_op.tolist())):
        if alloc < 0 or owner[alloc] < 0:
            continue
        reads = facts.read_ops_of(t)
        reads = reads[tr.op_phase[reads] == Phase.FORWARD]
        if np.all(owner[reads] == owner[alloc]):
            picked.append(i)
    return np.array(picked, dtype=np.int64)


def not_applicable(trace: Trace, blocks: list[str]) -> str:
    """Why per-block checkpointing cannot apply to ``trace`` (empty: it can)."""
    if len(blocks) >= 2:
        return ""
    if not any(trace.module_names):
        return "not applicable: the trace records no module paths, so it has no blocks to checkpoint"
    return ("not applicable: the trace has no repeated blocks (two or more modules at paths ending in an index, "
            "such as `layers.0`, that contain other modules)")


def per_block_recompute(facts: TraceFacts, evaluator: Evaluator) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The blocks, the activations per-block checkpointing recomputes, and those inside blocks it cannot.

    The second and third are positions in :class:`TraceFacts` order; both are empty without blocks.
    """
    blocks = block_paths(facts.trace)
    if len(blocks) < 2:
        empty = np.zeros(0, dtype=np.int64)
        return blocks, empty, empty
    inside = inside_blocks(facts, blocks)
    ok = evaluator.can_recompute[facts.act_event[inside]] if len(inside) else np.zeros(0, dtype=bool)
    return blocks, inside[ok], inside[~ok]


def block_container(blocks: list[str]) -> list[str]:
    """The containers the blocks are children of (``model.layers`` for ``model.layers.3``), in order."""
    out: list[str] = []
    for b in blocks:
        parent = b.rsplit(".", 1)[0] if "." in b else ""
        if parent not in out:
            out.append(parent)
    return out


class PerBlockPlanner(BasePlanner):
    """Hugging Face's per-layer gradient checkpointing: recompute everything saved inside each block."""

    name = "per-block"
    limitation = ("recomputes inside repeated blocks only, all of it whatever the limit: the blocks' inputs, "
                  "the activations outside blocks and those that cannot be recomputed stay on the device")

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        blocks, recompute, stuck = per_block_recompute(facts, evaluator)
        why = not_applicable(facts.trace, blocks)
        if why:
            return (), {"blocks": len(blocks), "not_applicable": why}
        actions = facts.activation_actions(recompute.tolist(), ActionKind.RECOMPUTE)
        return actions, {"blocks": len(blocks), "containers": block_container(blocks),
                         "recomputed": len(actions), "not_recomputable": len(stuck),
                         "kept": facts.n_activations - len(actions)}
