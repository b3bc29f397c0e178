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
from dqn_swap.plan import Plan
from dqn_swap.planner_options import PlannerOption
from dqn_swap.planners import manual_plan, register, saved_activations, unregister
from dqn_swap.recorder import record_trace
from dqn_swap.integrations import autoplan

from .runtime_support import assert_same_state, mlp_loop

PLANNER_SOURCE = '''
from dqn_swap.planner_options import PlannerOption
from dqn_swap.planners import manual_plan, saved_activations


class SwapAll:
    """Swap every saved activation (a user's planner)."""

    name = "swap-every-activation"

    def plan(self, trace, memory_limit, profile=None):
        return manual_plan(trace, swap=saved_activations(trace), memory_limit=memory_limit, planner=self.name,
                           profile=profile)


class SwapSome:
    """Swap the largest saved activations (a user's planner with a flag of its own)."""

    name = "swap-some"
    options = (PlannerOption("largest", "how many of the largest saved activations to swap", parse=int,
                             metavar="N"),)

    def __init__(self, largest=1):
        self.largest = largest

    def plan(self, trace, memory_limit, profile=None):
        chosen = sorted(saved_activations(trace), key=lambda t: -int(trace.tensor_nbytes[t]))[:self.largest]
        return manual_plan(trace, swap=chosen, memory_limit=memory_limit, planner=self.name, profile=profile)
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


def _planned_like_plain(planner: object) -> dict:
    """``planner`` in ``autoplan`` at 30 %: the training state equals plain training's; its summary."""
    plain, plain_opt, _ = mlp_loop(None)
    model, opt, planned = mlp_loop({"memory_limit": "30%", "planner": planner})
    assert_same_state(plain, plain_opt, model, opt)
    return planned.summary()


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
    summary = _planned_like_plain("mine")
    assert summary["planner"] == "mine" and all(p["swaps"] > 0 for p in summary["plans"].values())


def test_autoplan_takes_a_planner_object() -> None:
    planner = SwapAll()
    summary = _planned_like_plain(planner)
    assert planner.calls == 1 and summary["planner"] == "mine"


@pytest.fixture
def planners_folder(tmp_path: Path, monkeypatch):  # noqa: ANN001, ANN201
    """The current folder holds ``my_planners.py`` (PLANNER_SOURCE) and a trace, ``t.trace``; the
    planners the test registers from it are unregistered after."""
    net = _net()
    trace = record_trace(net, (torch.randn(64, 32),), lambda out: out.square().mean(), lambda p: torch.optim.Adam(p))
    (tmp_path / "my_planners.py").write_text(PLANNER_SOURCE)
    trace.save(tmp_path / "t.trace")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in planner_names():
        if name.startswith("my_planners:"):
            unregister(name)
    sys.modules.pop("my_planners", None)


def test_the_command_line_takes_a_planner_of_the_current_folder(planners_folder: Path) -> None:
    assert main(["plan", "t.trace", "-m", "50%", "--planner", "my_planners:SwapAll", "-o", "p.json"]) == 0
    assert json.loads((planners_folder / "p.json").read_text())["planner"] == "swap-every-activation"


def test_a_planner_of_the_current_folder_declares_its_flags(planners_folder: Path, capsys) -> None:  # noqa: ANN001
    """A user's planner class lists its options: the command line then takes them as flags, hands
    them to the planner, and refuses them for a planner that does not read them."""
    spec = "my_planners:SwapSome"
    for n in (1, 2):
        assert main(["plan", "t.trace", "-m", "100%", "--planner", spec, "--largest", str(n), "-o", f"p{n}.json"]) == 0
        assert Plan.load(planners_folder / f"p{n}.json").n_swap == n
    assert main(["plan", "t.trace", "-m", "100%", "--planner", "greedy", "--largest", "2", "-o", "g.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"--largest is read by {spec} only, and --planner greedy does not read it "
                            f"(name one that does: --planner {spec})"), err
    assert not (planners_folder / "g.json").exists()


def test_a_flag_means_one_thing() -> None:
    """Planners that read a flag share its one option; another planner declaring the same flag with
    another meaning, or a flag of the command line's own, is refused at registration."""
    from dqn_swap.agents import TIME_LIMIT, planner_options

    assert planner_options()["--time-limit"] == (TIME_LIMIT, ("auto", "dqn-search", "optimal"))
    assert {o.setting for o, _ in planner_options().values()} >= {"time_limit", "decode", "members", "polish_simulations"}
    with pytest.raises(ValueError, match="--time-limit is taken by planner 'auto' with another meaning"):
        register("slow", SwapAll, options=(PlannerOption("time_limit", "minutes", parse=float),))
    with pytest.raises(ValueError, match="--agent is taken by the command line"):
        register("agent-reader", SwapAll, options=(PlannerOption("agent", "a file"),))
    register("patient", SwapAll, options=(TIME_LIMIT,))  # the same option: the same flag, read by one more
    try:
        assert planner_options()["--time-limit"][1][-1] == "patient"
    finally:
        unregister("patient")
    assert "slow" not in planner_names() and "agent-reader" not in planner_names()


def test_renamed_settings_still_work_and_say_their_new_name() -> None:
    with pytest.warns(DeprecationWarning, match="'time_budget' is now called 'time_limit'"):
        assert get_planner("dqn-search", time_budget=3.0).time_limit == 3.0
    with pytest.warns(DeprecationWarning, match="'seconds' is now called 'time_limit'"):
        assert get_planner("auto", seconds=2.0).time_limit == 2.0


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
