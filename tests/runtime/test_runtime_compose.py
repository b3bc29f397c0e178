"""The runtime composed with other PyTorch features: activation checkpointing and torch.compile.

* Regions under non-reentrant ``torch.utils.checkpoint`` keep their own saved-tensor hooks
  (the recorder and the runtime see the same packs around them); planned training of a
  model with a checkpointed block is bit-identical to unplanned training.
* ``torch.compile`` is refused with one line, never a silent fallback: a compiled module
  (``torch.compile(model)`` or ``model.compile()``) when the runtime is made, and a
  compiled training step (dynamo traces the ``with`` block, or runs it after a graph break)
  when the block is entered.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dqn_swap.recorder import RecordingError, record_trace
from dqn_swap.runtime import PlannedExecution, UnsupportedTrainingError

from ..runtime_support import MODELS, Workload, _custom, assert_same_training, hand_plan, train, trace_of


class CheckpointedNet(nn.Module):
    """Three blocks; the middle one runs under non-reentrant activation checkpointing."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 24), nn.GELU())
                                    for _ in range(3))
        self.head = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x)
        x = checkpoint(self.blocks[1], x, use_reentrant=False)
        x = self.blocks[2](x)
        return self.head(x)


MODELS["checkpointed"] = _custom(CheckpointedNet, (32, 24), 3)


@pytest.mark.parametrize("kind", ["swap", "recompute", "mixed"])
def test_a_checkpointed_region_keeps_working(kind: str) -> None:
    trace = trace_of("checkpointed")
    assert (trace.op_phase == 1).sum() > (trace.op_phase == 0).sum() / 2  # the region re-runs in backward
    plan = hand_plan("checkpointed", kind)
    assert plan.actions
    assert_same_training("checkpointed", train("checkpointed", plan))


def test_a_compiled_module_is_refused_with_one_line() -> None:
    w: Workload = MODELS["mlp_tiny"]()
    trace = trace_of("mlp_tiny")
    for compiled in (torch.compile(w.model), ):
        with pytest.raises(UnsupportedTrainingError, match="torch.compile") as info:
            PlannedExecution(compiled, hand_plan("mlp_tiny", "swap"), trace)
        assert "\n" not in str(info.value)
    w.model.compile()  # in place: the module's call is compiled
    with pytest.raises(UnsupportedTrainingError, match="torch.compile"):
        PlannedExecution(w.model, hand_plan("mlp_tiny", "swap"), trace)
    with pytest.raises(RecordingError, match="torch.compile"):
        record_trace(w.model, w.inputs, w.loss_fn, w.make_optimizer)


def test_a_compiled_training_step_is_refused_not_run_eagerly() -> None:
    w: Workload = MODELS["mlp_tiny"]()
    rt = PlannedExecution(w.model, hand_plan("mlp_tiny", "mixed"), trace_of("mlp_tiny"))

    def step() -> torch.Tensor:
        with rt:
            loss = w.loss_fn(w.model(*w.inputs))
            loss.backward()
        return loss

    compiled = torch.compile(step, backend="eager")  # no code generation: dynamo alone
    with pytest.raises(UnsupportedTrainingError, match="inside a function compiled with torch.compile"):
        compiled()
    torch._dynamo.reset()
    step()  # the same step, not compiled, runs
    assert rt.stats is not None and rt.stats.recomputed > 0
