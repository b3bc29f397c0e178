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


def _random_plan(sim: Simulator, rng: np.random.Generator, n: int) -> list[Action]:
    """Up to ``n`` valid actions on distinct tensors, swaps and recomputes mixed."""
    from dqn_swap.agents.local_search import valid_actions_by_tensor

    by_tensor = valid_actions_by_tensor(sim)
    tensors = rng.permutation(sorted(by_tensor))[:n]
    return [by_tensor[int(t)][int(rng.integers(len(by_tensor[int(t)])))] for t in tensors]


def test_a_swaps_window_is_exactly_its_change_in_memory_need(tiny_resnet_trace) -> None:
    """Property: adding a swap whose tensor no re-run reads lowers ``memory_need`` by its bytes over
    its window and nowhere else, whatever else the plan holds (swaps, recomputes)."""
    from dqn_swap.agents.local_search import add_window, valid_actions_by_tensor, window_of

    trace = tiny_resnet_trace
    sim = Simulator(trace, trace.peak_bytes, PROFILE)
    lo, hi = window_of(sim)
    by_tensor = valid_actions_by_tensor(sim)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(60):
        plan = _random_plan(sim, rng, int(rng.integers(0, 12)))
        res = sim.run(plan)
        reread = {y for p in set(res.recompute_ops) for y in sim.index.op_inputs[p]}
        free = [t for t in by_tensor if t not in {a.tensor for a in plan} and t not in reread]
        swaps = [a for t in free for a in by_tensor[t] if a.kind == ActionKind.SWAP]
        if not swaps:
            continue
        s = swaps[int(rng.integers(len(swaps)))]
        expected = sim.memory_need(plan).copy()
        add_window(expected, int(lo[s.event]), int(hi[s.event]), int(trace.tensor_nbytes[s.tensor]))
        assert np.array_equal(sim.memory_need(plan + [s]), expected)
        checked += 1
    assert checked >= 30


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_need_test_says_what_memory_need_says_on_random_moves(tiny_resnet_trace, seed: int) -> None:
    """Property: for a feasible plan and a random move (drop, flip, shift, replace), the need test's
    verdict is ``max(memory_need(trial)) <= limit``."""
    from dqn_swap.agents.local_search import NeedTest, valid_actions_by_tensor, window_of

    trace = tiny_resnet_trace
    rng = np.random.default_rng(seed)
    nbytes = trace.tensor_nbytes.astype(np.int64).tolist()
    verdicts = set()
    for _ in range(12):
        probe = Simulator(trace, trace.peak_bytes, PROFILE)
        plan = _random_plan(probe, rng, int(rng.integers(1, 14)))
        need = int(probe.memory_need(plan).max())
        # a limit the plan just fits, or with a little room
        limit = need + int(rng.choice([0, 1, int(trace.tensor_nbytes.max())]))
        sim = Simulator(trace, limit, PROFILE)
        res = sim.run(plan)
        assert res.feasible
        lo, hi = window_of(sim)
        test = NeedTest(sim, lo, hi, nbytes)
        test.reset(plan, res)
        by_tensor = valid_actions_by_tensor(sim)
        for _ in range(25):
            action = plan[int(rng.integers(len(plan)))]
            rest = [a for a in plan if a != action]
            used = {a.tensor for a in rest}
            choices: list[Action | None] = [None, Action(action.event, action.tensor, ActionKind(1 - int(action.kind)))]
            choices += [b for b in by_tensor[action.tensor] if b != action]
            choices += [b for t, acts in by_tensor.items() if t not in used and t != action.tensor for b in acts]
            added = choices[int(rng.integers(len(choices)))]
            trial = rest if added is None else rest + [added]
            if added is not None and sim.why_invalid(added) is not None:
                continue
            hot = test.without(rest, action)
            got = test.fits(trial, added, *hot)
            assert got == (int(sim.memory_need(trial).max()) <= limit)
            assert got == sim.run(trial).feasible  # the simulator's property: need <= limit exactly
            verdicts.add(got)
    assert verdicts == {True, False}


@pytest.mark.parametrize("planner,fraction", [("lru", 0.3), ("sqrt-n", 0.6), ("vdnn", 0.6)])
def test_screening_takes_the_same_path_in_fewer_simulations(tiny_resnet_trace, planner: str, fraction: float) -> None:
    """Rejecting trials on their memory need rejects exactly what the simulator would: the same plan
    comes out, after fewer simulations."""
    trace = tiny_resnet_trace
    limit = int(trace.minimum_memory + fraction * (trace.peak_bytes - trace.minimum_memory))
    plan = get_planner(planner).plan(trace, limit, PROFILE)
    sim = Simulator(trace, limit, PROFILE)
    assert sim.run(list(plan.actions)).feasible
    screened = polish(sim, plan.actions)
    every = polish(sim, plan.actions, screen=False)
    assert screened.actions == every.actions and screened.result.makespan == every.result.makespan
    assert screened.rejected > 0 and screened.simulations == every.simulations - screened.rejected
    assert every.rejected == 0


def test_a_shift_to_an_equivalent_event_is_not_tried(tiny_resnet_trace) -> None:
    """Another event of the same op and next use would give the same plan: no trial for it."""
    from dqn_swap.agents.local_search import valid_actions_by_tensor, window_of

    trace = tiny_resnet_trace
    sim = Simulator(trace, trace.peak_bytes, PROFILE)
    lo, hi = window_of(sim)
    for acts in valid_actions_by_tensor(sim).values():
        swaps = [a for a in acts if a.kind == ActionKind.SWAP]
        for a in swaps:
            for b in swaps:
                if a != b:  # every swap of a tensor acts after its last forward use: the same window
                    assert (lo[a.event], hi[a.event]) == (lo[b.event], hi[b.event])
