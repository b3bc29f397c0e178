"""The exact planner ``optimal``: against enumeration, DYNPROG, the lower bound and every baseline."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from dqn_swap.agents import get_planner
from dqn_swap.agents.baselines import PLANNERS
from dqn_swap.agents.optimal import OptimalPlanner, SwapProgram, candidates, critical_ops
from dqn_swap.agents.optimal.solver import parse_progress, solve
from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import Simulator
from dqn_swap.trace import Trace

from .test_baselines import MB, PROFILE, between, chain_trace, conv_relu_trace, random_chain

QUICK = {"incumbents": (), "time_limit": 60.0, "gap": 0.0}  # the program alone, no baseline to lean on


def enumerate_best(trace: Trace, limit: int) -> float:
    """Least simulated makespan over every plan: keep, swap or recompute each actionable tensor."""
    sim = Simulator(trace, limit, PROFILE)
    can_swap, can_rec = sim.valid_actions()
    choices: dict[int, list[Action | None]] = {}
    for e in np.flatnonzero(can_swap).tolist():  # one event per tensor: its last valid one
        t = int(trace.event_tensor[e])
        opts: list[Action | None] = [None, Action(e, t, ActionKind.SWAP)]
        if can_rec[e]:
            opts.append(Action(e, t, ActionKind.RECOMPUTE))
        choices[t] = opts
    assert 3 ** len(choices) <= 20_000, "too many plans to enumerate"
    best = math.inf
    for combo in itertools.product(*choices.values()):
        r = sim.run([a for a in combo if a is not None])
        if r.feasible:
            best = min(best, r.makespan)
    return best


def tiny_cases() -> list[tuple[str, Trace, int]]:
    cases = []
    for seed in range(6):
        trace, limit = random_chain(random.Random(seed))
        cases.append((f"chain{seed}", trace, limit))
    relu = conv_relu_trace(3, 12 * MB, 24 * MB)
    for f in (0.2, 0.5, 0.8):
        cases.append((f"conv-relu@{f}", relu, between(relu, f)))
    return cases


@pytest.mark.parametrize("case", tiny_cases(), ids=lambda c: c[0])
def test_equals_the_enumerated_optimum(case: tuple[str, Trace, int]) -> None:
    """On tiny traces the plan is the best of every possible plan, and the bound certifies it."""
    _, trace, limit = case
    best = enumerate_best(trace, limit)
    plan = OptimalPlanner(**QUICK).plan(trace, limit, PROFILE)
    s = plan.settings
    assert plan.figures["feasible"] == math.isfinite(best)
    if math.isfinite(best):
        assert plan.figures["makespan"] == pytest.approx(best, rel=1e-9)
        assert s["certified_bound"] <= best * (1 + 1e-9)
        assert s["proved_optimal"], s


def test_bound_is_valid_on_a_network(tiny_resnet_trace: Trace) -> None:
    """Never below the lower bound, never above any baseline's simulated makespan."""
    trace = tiny_resnet_trace
    sim = Simulator(trace, 0, PROFILE)
    for f in (0.3, 0.6):
        limit = between(trace, f)
        plan = OptimalPlanner(**QUICK).plan(trace, limit, PROFILE)
        bound = plan.settings["certified_bound"]
        assert bound >= Simulator(trace, limit, PROFILE).lower_bound * (1 - 1e-12)
        assert plan.figures["feasible"]
        for name in PLANNERS:
            other = PLANNERS[name]().plan(trace, limit, PROFILE)
            if other.figures["feasible"]:
                assert bound <= other.figures["makespan"] * (1 + 1e-9), name
                # and, proved optimal, the plan is at least as good as every baseline's
                if plan.settings["proved_optimal"]:
                    assert plan.figures["makespan"] <= other.figures["makespan"] * (1 + 1e-9), name
    del sim


def test_never_worse_than_a_baseline_in_its_own_model(tiny_resnet_trace: Trace) -> None:
    """Solved to optimality, the program's value is at most what it charges any baseline's plan."""
    trace = tiny_resnet_trace
    limit = between(trace, 0.4)
    sim = Simulator(trace, limit, PROFILE)
    cands = candidates(sim)
    prog = SwapProgram(sim, cands, critical_ops(sim, cands))
    opt = solve(prog, time_limit=60, gap=0.0)
    assert opt.status == 0
    names = ["window", "tflms", "lru", "checkpoint"]  # swap-only, mixed and recompute-only plans
    compared = 0
    for name in names:
        plan = PLANNERS[name]().plan(trace, limit, PROFILE)
        lb, ub = prog.fix(plan.actions)
        fixed = solve(prog, time_limit=60, gap=0.0, lb=lb, ub=ub)
        if fixed.status == 0:  # the baseline's actions cover every checkpoint
            compared += 1
            assert opt.objective <= fixed.objective * (1 + 1e-9), name
    assert compared >= 3


@pytest.mark.parametrize("seed", range(4))
def test_consistent_with_dynprog_on_chains(seed: int) -> None:
    """On chains DYNPROG plans swaps only; the exact planner is never worse, and never below its bound."""
    trace, limit = random_chain(random.Random(100 + seed))
    dyn = get_planner("dynprog").plan(trace, limit, PROFILE)
    opt = OptimalPlanner(**QUICK).plan(trace, limit, PROFILE)
    if dyn.figures["feasible"]:
        assert opt.figures["feasible"]
        assert opt.figures["makespan"] <= dyn.figures["makespan"] * (1 + 1e-9)
        assert opt.settings["certified_bound"] <= dyn.figures["makespan"] * (1 + 1e-9)


def test_impossible_limit_is_proved() -> None:
    """Below the memory no plan reaches, the program is infeasible and the plan says so."""
    trace = chain_trace([24 * MB] * 5, [1e-3] * 4, [1e-3] * 5)
    plan = OptimalPlanner(**QUICK).plan(trace, 1000, PROFILE)
    assert not plan.figures["feasible"]


def test_progress_rows_are_parsed() -> None:
    row = " R       0       0         0   0.00%   226.7104663     227.928168         0.53%        0      0      0       860     0.2s"
    p = parse_progress(row)
    assert p is not None and p.bound == pytest.approx(226.7104663) and p.incumbent == pytest.approx(227.928168)
    assert parse_progress("         0       0         0   0.00%   89.95307918     inf                  inf        0      0      0         0     0.1s").incumbent == math.inf
    assert parse_progress("Presolving model") is None


def test_progress_line_shows_incumbent_and_bound(tiny_resnet_trace: Trace, capfd: pytest.CaptureFixture[str]) -> None:
    plan = OptimalPlanner(progress=True, incumbents=()).plan(tiny_resnet_trace, between(tiny_resnet_trace, 0.3), PROFILE)
    out, err = capfd.readouterr()
    assert "incumbent" in err and "bound" in err
    assert "HiGHS" not in out  # the solver's log is read, not shown
    assert plan.figures["feasible"]
