"""One family of errors: every error dqn-swap raises on purpose is a ``DqnSwapError``, an input
error or a runtime error, and ``dqn_swap`` exports each by name."""

from __future__ import annotations

import pytest
import torch

import dqn_swap
from dqn_swap import DqnSwapError, DqnSwapInputError, DqnSwapRuntimeError

INPUT = ("MemoryLimitError", "TraceError", "PlanError", "AgentFileError", "InfeasiblePlanError")
RUNTIME = ("AutoPlanError", "RecordingError", "TraceMismatchError", "RecomputeError", "UnsupportedTrainingError",
           "PlannedOutOfMemoryError")


@pytest.mark.parametrize("name", INPUT + RUNTIME)
def test_every_error_is_exported_and_in_its_branch(name: str) -> None:
    cls = getattr(dqn_swap, name)
    assert name in dqn_swap.__all__ and issubclass(cls, DqnSwapError)
    if name in INPUT:
        assert issubclass(cls, DqnSwapInputError) and issubclass(cls, ValueError)
        assert not issubclass(cls, DqnSwapRuntimeError)
    else:
        assert issubclass(cls, DqnSwapRuntimeError) and issubclass(cls, RuntimeError)
        assert not issubclass(cls, DqnSwapInputError)


def test_a_planned_out_of_memory_error_is_torchs_too() -> None:
    assert issubclass(dqn_swap.PlannedOutOfMemoryError, torch.OutOfMemoryError)
    with pytest.raises(torch.OutOfMemoryError):
        raise dqn_swap.PlannedOutOfMemoryError("an allocation failed under a plan")


def test_one_except_catches_what_the_library_raises(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(DqnSwapInputError, match="ambiguous"):
        dqn_swap.MemoryLimit.parse(0.5)
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    with pytest.raises(DqnSwapInputError):
        dqn_swap.Plan.load(bad)
    with pytest.raises(DqnSwapError):
        dqn_swap.Trace.load(bad)
