"""The planner contract and its one registry (dqn_swap.planners), and plans made by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dqn_swap
import dqn_swap.agents
from dqn_swap import planners
from dqn_swap.planners import (KINDS, Planner, check_planner_name, get_planner, manual_plan, planner_help,
                               planner_names, saved_activations)


def test_every_name_is_registered_once_with_its_kind() -> None:
    names = planner_names()
    assert len(names) == len(set(names))
    assert names == tuple(n for k in KINDS for n in planner_names(k))
    assert planner_names("dqn") == ("auto", "dqn", "dqn-search") and planner_names("optimal") == ("optimal",)
    assert planner_names("baseline") == ("none", "window", "greedy", "dynprog", "vdnn", "lru", "tflms", "sqrt-n",
                                         "layrub")
    assert planner_names("switch") == ("per-block", "offload-all", "offload-all+per-block", "knapsack")
    assert planner_names("simple") == ("swap-all", "recompute-all", "greedy-swap")
    help_text = planner_help()
    assert all(f"{n}: " in help_text for n in names) and "\n" not in help_text
    with pytest.raises(ValueError, match="unknown kind of planner 'learned'"):
        planner_names("learned")


def test_the_face_the_agents_and_the_core_hand_out_one_get_planner() -> None:
    assert dqn_swap.get_planner is dqn_swap.agents.get_planner is get_planner


@pytest.mark.parametrize("name", [n for n in ("none", "sqrt-n", "swap-all", "greedy-swap", "optimal")])
def test_registered_planners_follow_the_contract(name: str) -> None:
    planner = get_planner(name)
    assert isinstance(planner, Planner) and planner.name == name


def test_unknown_and_renamed_names_are_one_line() -> None:
    with pytest.raises(ValueError, match=r"^unknown planner 'nope'; choose one of: auto, dqn, dqn-search, none, .*greedy-swap$"):
        get_planner("nope")
    for call in (lambda: get_planner("checkpoint"), lambda: check_planner_name("checkpoint")):
        with pytest.raises(ValueError, match=r"^planner 'checkpoint' is now called 'sqrt-n'$"):
            call()
    assert check_planner_name("sqrt-n") == "sqrt-n"


def test_the_command_line_refuses_the_old_names_in_one_line(tmp_path, capsys) -> None:
    from dqn_swap.cli import main

    assert main(["record", "--model", "mlp_tiny", "--batch-size", "2", "--device", "meta",
                 "-o", str(tmp_path / "m.trace")]) == 0
    capsys.readouterr()
    assert main(["plan", str(tmp_path / "m.trace"), "-m", "50%", "--planner", "checkpoint",
                 "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dqn-swap plan: error: planner 'checkpoint' is now called 'sqrt-n'"
    assert main(["run", "--model", "mlp_tiny", "--device", "cpu", "-m", "50%", "--methods", "planned,checkpoint"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dqn-swap run: error: --methods: the method 'checkpoint' is now called 'torch-checkpoint'"


def test_register_checks_its_entries_and_passes_the_agent_only_where_taken(monkeypatch) -> None:
    monkeypatch.setattr(planners, "_REGISTRY", {})
    with pytest.raises(ValueError, match="no planner is registered yet; import dqn_swap.agents"):
        get_planner("none")
    built: list[dict] = []

    class Fake:
        name = "fake"

        def __init__(self, **settings) -> None:
            built.append(settings)

        def plan(self, trace, memory_limit, profile=None):  # noqa: ANN001, ANN201
            raise NotImplementedError

    planners.register("fake", Fake, kind="baseline", summary="a fake")
    planners.register("fake", Fake, kind="baseline", summary="a fake")  # the same entry again: no change
    planners.register("reader", Fake, kind="dqn", summary="reads an agent", takes_agent=True)
    get_planner("fake", agent="a.pt", k=1)
    get_planner("reader", agent="a.pt", k=2)
    assert built == [{"k": 1}, {"agent": "a.pt", "k": 2}]
    for bad, message in ((dict(name="fake", kind="baseline", summary="another"), "already registered"),
                         (dict(name="x", kind="learned", summary="s"), "kind must be one of"),
                         (dict(name="x", kind="dqn", summary="two\nlines"), "one line"),
                         (dict(name="checkpoint", kind="dqn", summary="s"), "new non-empty string")):
        with pytest.raises(ValueError, match=message):
            planners.register(factory=Fake, **bad)
    assert planner_names() == ("reader", "fake")


@pytest.mark.subprocess
def test_the_core_registry_imports_no_agent() -> None:
    """``dqn_swap.planners`` is core: importing it registers nothing and loads neither the agents nor torch."""
    code = ("import sys, dqn_swap.planners as p; print(p.planner_names(), "
            "any(m == 'torch' or m.startswith('dqn_swap.agents') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "() False"


def test_a_manual_plan_is_checked_and_scheduled(tiny_resnet_trace) -> None:
    from dqn_swap.simulator import simulate

    trace = tiny_resnet_trace
    acts = saved_activations(trace)
    plan = manual_plan(trace, swap=acts[:2], planner="hand")
    assert plan.planner == "hand" and plan.n_swap == 2 and plan.schedule is not None
    assert plan.memory_limit == trace.peak_bytes
    assert plan.figures == simulate(trace, plan).figures()
    assert {t for t, _ in plan.schedule.prefetch} == set(acts[:2])
