"""The makespan lower bound: Proposition 3 of the offloading paper, extended to recompute."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqn_swap.lower_bound import lower_bound, lower_bound_at, recompute_candidates
from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import Simulator
from dqn_swap.trace import Phase, Role, Trace, TraceBuilder
from tests.test_simulator import (profile, random_plan, random_trace, three_partition_instance,
                                  two_partition_instance)

F, B = Phase.FORWARD, Phase.BACKWARD


def peak_trace(recomputable: bool = True) -> Trace:
    """f0 (2 s) makes A (8 B); f1 (1 s) reads A and makes C (8 B): the peak, 16 B; b2 (4 s) frees C,
    b3 (1 s) reads and frees A.  T = 8 s.  At the peak only A can be off the device.  With
    ``recomputable=False`` an in-place op modifies A after f0, so re-running f0 cannot restore it."""
    b = TraceBuilder()
    x = b.tensor(0, Role.INPUT, preexisting=True)
    a = b.tensor(8, Role.SAVED)
    c = b.tensor(8, Role.SAVED)
    b.op("f0", F, reads=[x], outputs=[a], duration=2)
    if not recomputable:
        b.op("f0_", F, reads=[a], writes=[a], duration=0)
    b.op("f1", F, reads=[a], outputs=[c], duration=1)
    b.op("b2", B, reads=[c], frees=[c], duration=4)
    b.op("b3", B, reads=[a], frees=[a], duration=1)
    return b.build()


def test_no_excess_is_compute_time() -> None:
    trace = peak_trace()
    for limit in (trace.peak_bytes, trace.peak_bytes + 100):
        assert lower_bound(trace, limit, profile()) == trace.compute_time


def test_swap_only_is_proposition_3() -> None:
    """A modified in place after f0: nothing recomputable; LB = max(T, 2E/beta + d_peak)."""
    trace = peak_trace(recomputable=False)
    k = trace.peak_op
    assert trace.peak_bytes == 16 and trace.op_names[trace.op_name[k]] == "f1"
    swap, rec = recompute_candidates(trace, k)
    # At f1 (the first op at 16 B) A is alive, made earlier and read later: the only candidate.
    assert swap.sum() == 1 and not rec.any()
    T = trace.compute_time  # 8 s
    # E = 8 B at 1 B/s each way: 8 + d_f1 (1) + 8 = 17 s.
    assert lower_bound(trace, 8, profile(bw=1.0)) == 17.0
    # Faster links: 2E/beta + 1 = 2 + 1 < T.
    assert lower_bound(trace, 8, profile(bw=8.0)) == T
    # Per-copy latency counts once per direction; asymmetric links use each direction's rate.
    assert lower_bound(trace, 8, profile(bw=1.0, latency=0.5)) == 18.0
    assert lower_bound(trace, 8, profile(bw=1.0, h2d=4.0)) == 8 + 1 + 2
    # A second copy engine does not help: the two legs are separated by the peak op.
    assert lower_bound(trace, 8, profile(bw=1.0, duplex=False)) == lower_bound(trace, 8, profile(bw=1.0))


def test_recompute_crossing_closed_form() -> None:
    """A is recomputable by re-running f0 (2 s for 8 B: rho = 1/4 s/B).

    E = 8, c = 2 s/B, T = 8, X(s) = 1 + 2s:  T + r/4 = 1 + 2 (8 - r)  ->  r* = 4,  LB = 9."""
    trace = peak_trace()
    assert lower_bound(trace, 8, profile(bw=1.0)) == 9.0
    # Recompute everything (r = E) would cost T + 8/4 = 10 > 9; swapping everything 17 > 9.
    # A slow enough producer makes recompute useless: the bound falls back to swap-only.
    slow = trace.with_durations(np.where(np.arange(trace.n_ops) == 0, 100.0, trace.op_duration))
    assert lower_bound(slow, 8, profile(bw=1.0)) == pytest.approx(
        min(max(slow.compute_time, 17.0), slow.compute_time + 100.0))


def test_tight_on_two_partition_instance() -> None:
    """Theorem 3's instance: LB = max(T = 2, 2V/V + 0) = 2 = the optimum, which the simulator reaches."""
    V = 64
    trace, _ = two_partition_instance([8, 24, 16, 32, 40, 8], V)
    assert lower_bound(trace, 2 * V, profile(bw=V)) == 2.0
    trace3, _ = three_partition_instance([[20, 20, 24], [18, 22, 24]], V)
    assert lower_bound(trace3, 3 * V, profile(bw=V)) == 4.0


def test_never_above_exhaustive_optimum() -> None:
    """On tiny traces, LB <= the best makespan over every valid plan (all subsets, all kinds)."""
    checked = 0
    for seed in range(40):
        trace = random_trace(seed, max_layers=2)
        prof = profile(bw=float(np.random.default_rng(seed).choice([2.0, 8.0, 32.0])))
        sim = Simulator(trace, trace.peak_bytes, prof)
        va = sim.valid_actions()
        options: dict[int, list[Action | None]] = {}
        for e in np.flatnonzero(va.can_swap):
            t = int(trace.event_tensor[e])
            options.setdefault(t, [None]).append(Action(int(e), t, ActionKind.SWAP))
            if va.can_recompute[e]:
                options[t].append(Action(int(e), t, ActionKind.RECOMPUTE))
        combos = math.prod(len(v) for v in options.values())
        if combos > 4000:
            continue
        plans = [[a for a in combo if a is not None] for combo in itertools.product(*options.values())]
        # Limits where something must move: between the trace's minimum and its peak.
        for limit in np.unique(np.linspace(trace.minimum_memory, trace.peak_bytes, 5).astype(int)):
            s = Simulator(trace, int(limit), prof)
            best = min((r.makespan for r in map(s.run, plans) if r.feasible), default=math.inf)
            assert s.lower_bound <= best + 1e-9
            checked += best < math.inf
    assert checked > 20


def dense_case(seed: int) -> tuple[Simulator, list[Action]]:
    """Slow links, a planner-like dense plan, the plan's own minimal limit: LB often exceeds T."""
    rng = np.random.default_rng(seed)
    trace = random_trace(seed)
    prof = profile(bw=float(rng.uniform(0.25, 6)), h2d=float(rng.uniform(0.25, 6)),
                   duplex=bool(rng.random() < 0.5), latency=float(rng.choice([0.0, 0.05])))
    sim = Simulator(trace, trace.peak_bytes, prof)
    actions = random_plan(sim, rng, float(rng.choice([0.5, 1.0])), longest_gap=True)
    need = int(sim.memory_need(actions).max(initial=0))
    return Simulator(trace, max(need, trace.initial_bytes) + int(rng.integers(0, 3)), prof), actions


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_never_above_a_feasible_makespan(seed: int) -> None:
    sim, actions = dense_case(seed)
    r = sim.run(actions)
    assert r.feasible  # the limit is the plan's own need
    assert r.lower_bound >= r.compute_time
    assert r.makespan >= r.lower_bound * (1 - 1e-12) - 1e-12
    assert r.makespan_over_lower_bound >= 1 - 1e-12
    # The proof holds at any op with an excess, not only the peak.
    trace = sim.trace
    every = max(lower_bound_at(trace, k, sim.memory_limit, sim.profile) for k in range(trace.n_ops))
    assert r.makespan >= every * (1 - 1e-12) - 1e-12


def test_dense_cases_exercise_the_transfer_term() -> None:
    """The property above is not vacuous: many cases have LB > T, some with recompute candidates."""
    above = with_rec = 0
    for seed in range(200):
        sim, _ = dense_case(seed)
        if sim.lower_bound > sim.trace.compute_time:
            above += 1
            _, rec = recompute_candidates(sim.trace, sim.trace.peak_op)
            with_rec += bool(rec.any())
    assert above >= 30 and with_rec >= 10
