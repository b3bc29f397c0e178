"""``auto``, the default planner: the fastest of its candidates, within its budget, recorded in the plan."""

from __future__ import annotations

import inspect

import pytest

import dqn_swap
from dqn_swap.agents.auto import (BASE_SECONDS, MAX_SECONDS, QUICK_BASELINES, TFLMS_EVENTS, default_seconds,
                                  quick_baselines)
from dqn_swap.plan import Plan
from dqn_swap.planners import DEFAULT_PLANNER, get_planner
from dqn_swap.trace import resolve_memory_limit


@pytest.fixture(scope="module")
def auto(tiny_resnet_trace):
    """The planner, after one simulation: the compiled engine's first compile (once per install,
    cached on disk after it; in CI's fresh clone, in the first test that simulates) is not a plan's
    time, which the budget bounds."""
    from dqn_swap.simulator import simulate

    planner = get_planner("auto", threads=1)
    simulate(tiny_resnet_trace, get_planner("lru").plan(tiny_resnet_trace, tiny_resnet_trace.peak_bytes))
    return planner


def test_the_default_planner_is_auto_at_every_entry_point() -> None:
    from dqn_swap.cli.simulate_cmd import make_plan
    from dqn_swap.integrations import AutoPlan

    assert DEFAULT_PLANNER == "auto"
    assert inspect.signature(dqn_swap.autoplan).parameters["planner"].default == "auto"
    assert inspect.signature(AutoPlan).parameters["planner"].default == "auto"
    assert "planner_name = planner_name or DEFAULT_PLANNER" in inspect.getsource(make_plan)


def test_the_budget_grows_gently_with_the_trace() -> None:
    assert default_seconds(10) == BASE_SECONDS == default_seconds(4_300)
    assert default_seconds(25_211) == pytest.approx(11.5, abs=0.1)  # a 32-layer Llama at 4,096 tokens
    assert default_seconds(79_794) == pytest.approx(23.0, abs=0.2)  # ResNet-1001 b64
    assert default_seconds(10**7) == MAX_SECONDS
    assert "dynprog" not in QUICK_BASELINES and "tflms" not in QUICK_BASELINES
    assert quick_baselines(TFLMS_EVENTS)[-1] == "tflms" and "tflms" not in quick_baselines(TFLMS_EVENTS + 1)
    with pytest.raises(ValueError, match="time_limit must be a positive number"):
        get_planner("auto", time_limit=0)


@pytest.mark.parametrize("fraction", [0.5, 0.3])
def test_auto_is_the_fastest_of_its_candidates_and_says_which(auto, tiny_resnet_trace, fraction) -> None:
    trace = tiny_resnet_trace
    limit = trace.minimum_memory + int(fraction * (trace.peak_bytes - trace.minimum_memory))
    plan = auto.plan(trace, limit)
    s = plan.settings
    assert plan.planner == "auto" and plan.figures["feasible"] and plan.figures["peak_bytes"] <= limit
    # every quick baseline ran; the plan is the fastest candidate, and no slower than any of them
    assert set(quick_baselines(trace.n_events)) <= set(s["candidates"])
    fitting = {n: o for n, o in s["candidates"].items() if o is not None}
    assert s["chosen"] in fitting and plan.figures["overhead"] == pytest.approx(min(fitting.values()), abs=1e-6)
    for name in quick_baselines(trace.n_events):
        other = get_planner(name).plan(trace, limit)
        if other.figures["feasible"]:
            assert plan.figures["makespan"] <= other.figures["makespan"] * (1 + 1e-12)
    if not s["cut_by_time"]:  # dqn-search ran to its own budget of simulations: auto is no slower
        search = get_planner("dqn-search", threads=1).plan(trace, limit)
        assert plan.figures["makespan"] <= search.figures["makespan"] * (1 + 1e-12)
    assert s["time_limit"] == default_seconds(trace.n_events) and s["plan_seconds"] <= s["time_limit"] + 2.0
    if s["chosen"] != "dqn-search":
        assert s["from_planner"] in quick_baselines(trace.n_events)


def test_a_plan_at_the_lower_bound_ends_the_search(auto, tiny_resnet_trace) -> None:
    trace = tiny_resnet_trace
    plan = auto.plan(trace, trace.peak_bytes)  # every baseline's empty plan is optimal here
    assert plan.figures["makespan"] == pytest.approx(plan.figures["lower_bound"])
    assert "dqn-search" not in plan.settings["candidates"] and "dqn_search" not in plan.settings


def test_a_tiny_budget_still_gives_the_best_baseline_and_names_what_was_cut(tiny_resnet_trace) -> None:
    trace = tiny_resnet_trace
    limit = resolve_memory_limit(trace, "30%")
    plan = get_planner("auto", time_limit=1e-4, threads=1).plan(trace, limit)
    s = plan.settings
    assert s["time_limit"] == 1e-4 and plan.figures["feasible"]
    assert any(c.startswith("dqn-search") for c in s["cut_by_time"]) or "dqn-search" not in s["candidates"]
    best_baseline = min((o for n, o in s["candidates"].items() if n in QUICK_BASELINES and o is not None))
    assert plan.figures["overhead"] <= best_baseline + 1e-9


def test_the_plan_file_records_who_made_the_plan(auto, tiny_resnet_trace, tmp_path) -> None:
    trace = tiny_resnet_trace
    plan = auto.plan(trace, resolve_memory_limit(trace, "50%"))
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json", trace)
    assert back.planner == "auto" and back.settings["chosen"] == plan.settings["chosen"]
    assert back.settings["candidates"] == plan.settings["candidates"]
