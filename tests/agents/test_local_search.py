"""Local search over a finished plan (dqn_swap.agents.local_search): never slower, always feasible."""

from __future__ import annotations

import numpy as np
import pytest

from dqn_swap.agents import get_planner
from dqn_swap.agents.local_search import default_simulations, polish
from dqn_swap.cost import get_profile
from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import Simulator

PROFILE = get_profile("v100-pcie3")


def test_an_unneeded_recompute_is_dropped(tiny_resnet_trace) -> None:
    """At the unplanned peak nothing has to leave: a re-run only costs time, and polish drops it."""
    trace = tiny_resnet_trace
    sim = Simulator(trace, trace.peak_bytes, PROFILE)
    valid = sim.valid_actions()
    events = np.flatnonzero(valid.can_recompute)
    durations = trace.op_duration[np.maximum(trace.tensor_alloc_op[trace.event_tensor[events]], 0)]
    e = int(events[np.argmax(durations)])  # the costliest re-run offered
    extra = Action(e, int(trace.event_tensor[e]), ActionKind.RECOMPUTE)
    before = sim.run([extra])
    assert before.feasible and before.makespan > trace.compute_time
    got = polish(sim, [extra])
    assert got.actions == () and got.dropped == 1
    assert got.result.makespan == pytest.approx(trace.compute_time)


@pytest.mark.parametrize("planner", ["sqrt-n", "lru", "window", "vdnn"])
@pytest.mark.parametrize("fraction", [0.3, 0.6])
def test_polish_keeps_plans_feasible_and_never_slower(tiny_resnet_trace, planner: str, fraction: float) -> None:
    trace = tiny_resnet_trace
    limit = int(trace.minimum_memory + fraction * (trace.peak_bytes - trace.minimum_memory))
    plan = get_planner(planner).plan(trace, limit, PROFILE)
    sim = Simulator(trace, limit, PROFILE)
    before = sim.run(list(plan.actions))
    if not before.feasible:
        pytest.skip(f"{planner} does not fit at {fraction:.0%}")
    got = polish(sim, plan.actions)
    assert got.result.feasible and got.result.makespan <= before.makespan
    again = sim.run(list(got.actions))  # the figures are the polished plan's own
    assert again.feasible and again.makespan == got.result.makespan
    assert all(sim.why_invalid(a) is None for a in got.actions)
    assert len(got.actions) == len(plan.actions) - got.dropped


def test_polish_refuses_a_plan_that_does_not_fit(tiny_resnet_trace) -> None:
    trace = tiny_resnet_trace
    sim = Simulator(trace, trace.minimum_memory, PROFILE)
    with pytest.raises(ValueError, match="fits"):
        polish(sim, [])


@pytest.mark.parametrize("budget", [{"max_simulations": 0}, {"max_seconds": 0.0}, {"max_simulations": 7}])
def test_polish_stops_at_its_budget(tiny_resnet_trace, budget) -> None:
    trace = tiny_resnet_trace
    limit = int(trace.minimum_memory + 0.3 * (trace.peak_bytes - trace.minimum_memory))
    plan = get_planner("lru").plan(trace, limit, PROFILE)
    sim = Simulator(trace, limit, PROFILE)
    assert sim.run(list(plan.actions)).feasible
    got = polish(sim, plan.actions, **budget)
    assert got.simulations == budget.get("max_simulations", 0)
    if got.simulations == 0:
        assert got.actions == tuple(sorted(plan.actions))


def test_polish_is_deterministic_under_a_simulation_budget(tiny_resnet_trace) -> None:
    """The budget counts simulations, not seconds: the same plan in, the same plan out."""
    trace = tiny_resnet_trace
    limit = int(trace.minimum_memory + 0.3 * (trace.peak_bytes - trace.minimum_memory))
    plan = get_planner("lru").plan(trace, limit, PROFILE)
    sim = Simulator(trace, limit, PROFILE)
    runs = [polish(sim, plan.actions, max_simulations=40) for _ in range(2)]
    assert runs[0].actions == runs[1].actions and runs[0].simulations == runs[1].simulations == 40


def test_default_budget_scales_with_the_trace() -> None:
    assert default_simulations(4325) == 250_000_000 // 4325  # ResNet-50 b64
    assert default_simulations(10) == 100_000 and default_simulations(10**9) == 1_000
