"""A user's own planner: registered by name (or named ``package.module:name`` on the command line,
or given as an object to ``autoplan``), it plans wherever the project's own planners do."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from dqn_swap.agents import get_planner, planner_names
from dqn_swap.cli import main
from dqn_swap.planners import manual_plan, register, saved_activations, unregister
from dqn_swap.recorder import record_trace
from dqn_swap.user_loop import autoplan

PLANNER_SOURCE = '''
from dqn_swap.planners import manual_plan, saved_activations


class SwapAll:
    """Swap every saved activation (a user's planner)."""

    name = "swap-every-activation"

    def plan(self, trace, memory_limit, profile=None):
        return manual_plan(trace, swap=saved_activations(trace), memory_limit=memory_limit, planner=self.name,
                           profile=profile)
'''


class SwapAll:
    """Swap every saved activation (a user's planner)."""

    name = "mine"

    def __init__(self) -> None:
        self.calls = 0

    def plan(self, trace, memory_limit, profile=None):  # noqa: ANN001, ANN201
        self.calls += 1
        return manual_plan(trace, swap=saved_activations(trace), memory_limit=memory_limit, planner=self.name,
                           profile=profile)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


def _train(planner: object, steps: int = 3) -> tuple[dict, object]:
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    planned = autoplan(net, "30%", planner=planner, optimizer=opt, verbose=False) if planner is not None else None
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(64, 32)
        if planned is not None:
            with planned.step():
                net(x).square().mean().backward()
        else:
            net(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    summary = planned.summary() if planned is not None else None
    if planned is not None:
        planned.remove()
    return {k: v.clone() for k, v in net.state_dict().items()}, summary


@pytest.fixture
def mine():  # noqa: ANN201
    register("mine", SwapAll)
    try:
        yield
    finally:
        unregister("mine")


def test_a_registered_planner_plans_from_python_the_command_line_and_autoplan(mine, tmp_path: Path) -> None:  # noqa: ANN001
    assert "mine" in planner_names("user") and "mine" in planner_names()
    net = _net()
    trace = record_trace(net, (torch.randn(64, 32),), lambda out: out.square().mean(), lambda p: torch.optim.Adam(p))
    plan = get_planner("mine").plan(trace, trace.peak_bytes)
    assert plan.planner == "mine" and plan.n_swap == len(saved_activations(trace))
    trace.save(tmp_path / "t.trace")
    assert main(["plan", str(tmp_path / "t.trace"), "-m", "50%", "--planner", "mine", "-o",
                 str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["planner"] == "mine"
    plain, _ = _train(None)
    planned, summary = _train("mine")
    assert summary["planner"] == "mine" and all(p["swaps"] > 0 for p in summary["plans"].values())
    assert all(torch.equal(plain[k], planned[k]) for k in plain)


def test_autoplan_takes_a_planner_object() -> None:
    planner = SwapAll()
    plain, _ = _train(None)
    planned, summary = _train(planner)
    assert planner.calls == 1 and summary["planner"] == "mine"
    assert all(torch.equal(plain[k], planned[k]) for k in plain)


def test_the_command_line_takes_a_planner_of_the_current_folder(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    net = _net()
    trace = record_trace(net, (torch.randn(64, 32),), lambda out: out.square().mean(), lambda p: torch.optim.Adam(p))
    (tmp_path / "my_planners.py").write_text(PLANNER_SOURCE)
    trace.save(tmp_path / "t.trace")
    monkeypatch.chdir(tmp_path)
    spec = "my_planners:SwapAll"
    try:
        assert main(["plan", "t.trace", "-m", "50%", "--planner", spec, "-o", "p.json"]) == 0
        assert json.loads((tmp_path / "p.json").read_text())["planner"] == "swap-every-activation"
    finally:
        if spec in planner_names():
            unregister(spec)
        sys.modules.pop("my_planners", None)


def test_what_is_not_a_planner_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="not a planner registered by the user"):
        unregister("greedy")
    register("not-one", lambda: 42)
    try:
        with pytest.raises(ValueError, match="no plan"):
            get_planner("not-one")
    finally:
        unregister("not-one")
    with pytest.raises(TypeError, match="planner must be str .a planner's name. or an object"):
        autoplan(_net(), "50%", planner=3.5)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.trace").write_text("")
    assert main(["plan", "t.trace", "-m", "50%", "--planner", "nosuch_module:Planner"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
