"""The exact planner's certified bound against exhaustive enumeration.

The program of :mod:`dqn_swap.agents.optimal.program` is a relaxation of the
simulator: its optimum is at most the simulated makespan of every plan.  Here
every plan of small random traces of every shape is simulated
(:mod:`dqn_swap.agents.optimal.exhaustive`), and the planner's certified bound
must stay at or below the best of them, and a plan it says is proved optimal
must be that best.  ``benchmarks/bench_bound.py`` runs the same check on
thousands of traces.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from dqn_swap.agents.optimal import OptimalPlanner, SwapProgram, candidates
from dqn_swap.agents.optimal.exhaustive import (CASE_PROFILES, SHAPES, enumerate_plans, plan_choices,
                                                random_case)
from dqn_swap.agents.optimal.solver import solve
from dqn_swap.cost import get_profile
from dqn_swap.simulator import Simulator
from dqn_swap.trace import Phase, Role, Trace, TraceBuilder

MB = 1_000_000
EXACT = {"incumbents": (), "gap": 0.0, "time_limit": 60.0}  # the program alone, solved to optimality
CASES_PER_SHAPE = 45  # 7 shapes: 315 traces


def returns_out_of_order() -> tuple[Trace, int]:
    """Seven ops: three 1 ms forward ops that cannot be re-run (each also writes a buffer) make
    saved tensors of 12, 24 and 36 MB; a 6 ms op with 100 MB of scratch is the only op over the
    limit, 30 MB under its memory; backward needs the 24 MB tensor first, then the 12 MB, then the
    36 MB one."""
    b = TraceBuilder()
    w = b.tensor(1000, Role.PARAMETER, preexisting=True)
    saved = []
    for size in (12, 24, 36):
        x = b.tensor(size * MB, Role.SAVED)
        b.op("aten.fill_", Phase.FORWARD, reads=[w], writes=[w], outputs=[x], duration=1e-3)
        b.mark_saved(x)
        saved.append(x)
    g = b.tensor(1000, Role.TEMPORARY)
    b.op("aten.heavy", Phase.FORWARD, reads=[w], outputs=[g], duration=6e-3, scratch=100 * MB)
    for i, d in ((1, 2e-3), (0, 3e-3), (2, 3e-3)):
        g2 = b.tensor(1000, Role.TEMPORARY)
        b.op("aten.backward", Phase.BACKWARD, reads=[g, saved[i]], outputs=[g2], frees=[g, saved[i]], duration=d)
        g = g2
    b.free(g)
    trace = b.build()
    return trace, int(trace.op_memory[3]) - 30 * MB


def test_a_prefetch_inside_the_op_over_the_limit() -> None:
    """The best plan swaps all three: the 36 MB copy out completes while the heavy op runs, and the
    24 MB tensor's copy back starts then, inside the op (memory allows it: 48 MB stay away).  The
    program counts a tensor away at an op's start and at its end separately, so it neither
    forbids that plan nor charges it a copy back after the op."""
    trace, limit = returns_out_of_order()
    profile = get_profile("v100-pcie3")
    sim = Simulator(trace, limit, profile)
    best = enumerate_plans(sim)
    assert best.makespan == pytest.approx(0.018020, abs=1e-9)
    assert len(best.actions) == 3 and {a.kind.name for a in best.actions} == {"SWAP"}
    # the 24 MB tensor comes back while the heavy op (op 3) runs
    run = sim.run(best.actions)
    middle = next(a.tensor for a in best.actions if trace.tensor_nbytes[a.tensor] == 24 * MB)
    assert dict(run.schedule.prefetch)[middle] == 3
    plan = OptimalPlanner(**EXACT).plan(trace, limit, profile)
    s = plan.settings
    assert plan.figures["makespan"] == pytest.approx(best.makespan, rel=1e-9)
    assert s["certified_bound"] <= best.makespan * (1 + 1e-9)
    assert s["proved_optimal"]


def _check(shape: str, trace: Trace, limit: int, profile) -> None:
    sim = Simulator(trace, limit, profile)
    best = enumerate_plans(sim)
    plan = OptimalPlanner(**EXACT).plan(trace, limit, profile)
    s = plan.settings
    where = f"{shape} on {profile.name}, limit {limit}"
    assert plan.figures["feasible"] == math.isfinite(best.makespan), where
    if math.isfinite(best.makespan):
        assert s["certified_bound"] <= best.makespan * (1 + 1e-9), where
        if s["proved_optimal"]:
            assert plan.figures["makespan"] == pytest.approx(best.makespan, rel=1e-9), where
        assert plan.figures["makespan"] >= best.makespan * (1 - 1e-9), where


@pytest.mark.parametrize("shape", SHAPES)
def test_bound_never_above_the_enumerated_optimum(shape: str) -> None:
    """On random traces of each shape, every profile among them: bound <= optimum, and a proof is right."""
    rng = random.Random(f"bound-{shape}")
    profiles = set()
    for _ in range(CASES_PER_SHAPE):
        _, trace, limit, profile = random_case(rng, shape)
        profiles.add(profile.name)
        _check(shape, trace, limit, profile)
    assert len(profiles) >= 4  # most profiles, the shared copy engine likely among them


def test_cases_cover_every_profile_and_out_of_order_returns() -> None:
    """The drawn cases include the shared copy engine, and saved tensors coming back in another
    order than they left (what broke the bound before)."""
    assert any(not p.duplex for p in CASE_PROFILES)
    rng = random.Random("cover")
    names, out_of_order = set(), 0
    for _ in range(60):
        _, trace, _, profile = random_case(rng, "out_of_order")
        names.add(profile.name)
        act, ret = trace.action_window
        moved = np.flatnonzero(act >= 0)
        # last out, first back for a stack-like backward pass; anything else is out of order
        by_leave = moved[np.argsort(act[moved], kind="stable")]
        by_return = moved[np.argsort(-ret[moved], kind="stable")]
        out_of_order += not np.array_equal(by_leave, by_return)
    assert names == {p.name for p in CASE_PROFILES}
    assert out_of_order >= 20


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gated", [False, True], ids=["anywhere", "gated"])
def test_program_charges_every_plan_at_most_its_simulated_makespan(seed: int, gated: bool) -> None:
    """Relaxation plan by plan: with every op over the limit a checkpoint and every op a re-run
    point, the program with a plan's actions fixed is never above that plan's simulated makespan,
    also where prefetches are issued only at some ops (``Simulator.points``, as in a recorded trace)."""
    rng = random.Random(7000 + seed)
    shape, trace, limit, profile = random_case(rng, SHAPES[seed % len(SHAPES)], max_plans=100)
    points = [k for k in range(trace.n_ops) if rng.random() < 0.3] if gated else None
    sim = Simulator(trace, limit, profile, points=points)
    over = np.flatnonzero(sim.index.op_memory > limit).tolist()
    prog = SwapProgram(sim, candidates(sim), over, rerun_points=range(trace.n_ops))
    checked = 0
    for combo in itertools.product(*plan_choices(sim).values()):
        actions = [a for a in combo if a is not None]
        r = sim.run(actions)
        if not r.feasible:
            continue
        lb, ub = prog.fix(actions)
        out = solve(prog, time_limit=30, gap=0.0, lb=lb, ub=ub)
        assert out.status == 0, (shape, actions, out.message)
        assert prog.makespan_seconds(out.objective) <= r.makespan * (1 + 1e-9), (shape, actions)
        checked += 1
    assert checked >= 1
