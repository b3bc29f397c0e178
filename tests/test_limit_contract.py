"""One limit contract: every public entry point takes every form of a memory limit and resolves it
to the same bytes; inside, where only resolved bytes travel (a simulator, a planner), anything
else is refused in one line instead of being read as bytes (``Simulator(trace, 0.5)`` once
quietly became a limit of 0 bytes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from dqn_swap import MemoryLimit, MemoryLimitError
from dqn_swap.agents import get_planner
from dqn_swap.cli import main as cli_main
from dqn_swap.env import SwapRecomputeEnv
from dqn_swap.limits import resolve_limit
from dqn_swap.recorder import record_trace
from dqn_swap.runtime import PlannedExecution
from dqn_swap.simulator import Simulator
from dqn_swap.integrations import autoplan


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


@pytest.fixture(scope="module")
def trace():  # noqa: ANN201
    net, x = _net(), torch.randn(64, 32)
    return record_trace(net, (x,), lambda out: out.square().mean(), lambda p: torch.optim.SGD(p, lr=0.1))


def forms(trace) -> dict[str, object]:  # noqa: ANN001
    """Five spellings of one limit: 60 % of the way from the trace's minimum to its peak."""
    b = resolve_limit(trace, "60%")
    x = b / trace.peak_bytes  # (a CPU trace holds nothing outside the iteration)
    return {"percent": "60%", "MemoryLimit": MemoryLimit.parse("60%"), "times": f"{x!r}x", "int": b,
            "size": f"{b}B", "numpy int": np.int64(b)}


def test_every_public_entry_point_takes_every_form(trace, tmp_path: Path) -> None:  # noqa: ANN001
    want = resolve_limit(trace, "60%")
    saved = tmp_path / "t.trace"
    trace.save(saved)
    plan = get_planner("sqrt-n").plan(trace, want)
    for name, spec in forms(trace).items():
        assert resolve_limit(trace, spec) == want, name
        assert SwapRecomputeEnv(trace, spec).memory_limit == want, name
        assert PlannedExecution(_net(), plan, trace, memory_limit=spec).plan.memory_limit <= want, name
        out = tmp_path / f"{name.replace(' ', '_')}.json"
        assert cli_main(["plan", str(saved), "-m", str(spec), "--planner", "sqrt-n", "-o", str(out)]) == 0, name
        assert json.loads(out.read_text())["memory_limit"] == want, name


def _autoplan_limit(spec: object) -> int:
    """The plan limit ``autoplan`` trained under, given ``spec``."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    planned = autoplan(net, spec, planner="sqrt-n", optimizer=opt, verbose=False)
    x = torch.randn(64, 32)
    try:
        for _ in range(2):
            with planned.step():
                net(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        (plan,) = planned.summary()["plans"].values()
        return int(plan["memory_limit"])
    finally:
        planned.remove()


def test_autoplan_resolves_every_form_to_the_same_plan_limit() -> None:
    """(``autoplan`` records its own trace, so the bytes of a size are those its 60 % resolved to.)"""
    want = _autoplan_limit("60%")
    for spec in (MemoryLimit.parse("60%"), want, f"{want}B", np.int64(want)):
        assert _autoplan_limit(spec) == want, spec


@pytest.mark.parametrize("bad", [0.5, "50%", "0.5x", MemoryLimit.parse("50%"), 1e6, True, -1, np.float64(3e5)])
def test_an_unresolved_limit_is_refused_inside(trace, bad: object) -> None:  # noqa: ANN001
    with pytest.raises(MemoryLimitError, match="resolve"if not (isinstance(bad, int) and not isinstance(bad, bool))
                       else "at least 0"):
        Simulator(trace, bad)
    with pytest.raises(MemoryLimitError):
        get_planner("greedy").plan(trace, bad)
