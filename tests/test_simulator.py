"""Tests of the simulator: hand-computed cases from the papers, invariants, a reference model.

Hand-made traces use a profile with 0 copy latency and bandwidths in bytes per
second chosen so every time is an exact binary fraction: the expected figures
below are exact, not approximate.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqn_swap.cost import DeviceProfile, get_profile
from dqn_swap.plan import Action, ActionKind, Plan, PlanError, RecomputeStep
from dqn_swap.simulator import Simulator, SimResult, simulate
from dqn_swap.trace import EventKind, Phase, Role, Trace, TraceBuilder

F, B, O = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER
SWAP, REC = ActionKind.SWAP, ActionKind.RECOMPUTE


def profile(bw: float = 2.0, duplex: bool = True, latency: float = 0.0, h2d: float | None = None) -> DeviceProfile:
    """A profile whose copies take ``bytes / bw`` seconds."""
    return dataclasses.replace(get_profile("v100-pcie3"), name="test", d2h_bandwidth=float(bw),
                               h2d_bandwidth=float(h2d if h2d is not None else bw), duplex=duplex,
                               transfer_latency=latency)


def event_of(trace: Trace, op: int, tensor: int, kind: EventKind | None = None) -> int:
    """The event of ``op`` on ``tensor`` (a read or write unless ``kind`` says otherwise)."""
    for e in range(trace.n_events):
        if trace.event_op[e] == op and trace.event_tensor[e] == tensor:
            k = EventKind(trace.event_kind[e])
            if (kind is None and k in (EventKind.READ, EventKind.WRITE)) or k == kind:
                return e
    raise AssertionError(f"no event of op {op} on tensor {tensor}")


def mem_at(result: SimResult, t: float) -> int:
    """Allocated bytes right after time ``t`` on the result's timeline (step curve)."""
    times, values = result.timeline
    i = int(np.searchsorted(times, t, side="right")) - 1
    return int(values[i])


# --------------------------------------------------------------------------- DQN paper, Figure 4
def figure4_trace(backward_gap: int = 2) -> tuple[Trace, dict[str, int]]:
    """Ops of 1 s; X0 (3 B) is offloaded after its last forward read; copies at 2 B/s (1.5 s).

    f0 makes X0, f1 reads it and makes X1, f2 reads X1, f3 makes X2 (3 B) and
    needs X0's memory under a 4 B limit.  Backward: b4 frees X2, ``backward_gap``
    ops read X1, the last op reads X0.
    """
    b = TraceBuilder()
    x0, x1, x2 = b.tensor(3, Role.SAVED), b.tensor(1, Role.SAVED), b.tensor(3, Role.SAVED)
    b.op("f0", F, outputs=[x0], duration=1)
    b.op("f1", F, reads=[x0], outputs=[x1], duration=1)
    b.op("f2", F, reads=[x1], duration=1)
    b.op("f3", F, reads=[x1], outputs=[x2], duration=1)
    b.op("b4", B, reads=[x2], frees=[x2], duration=1)
    for i in range(backward_gap):
        b.op(f"b{5 + i}", B, reads=[x1], frees=[x1] if i == backward_gap - 1 else [], duration=1)
    last = b.op("bx", B, reads=[x0], frees=[x0], duration=1)
    return b.build(), {"x0": x0, "x1": x1, "x2": x2, "last": last}


def test_no_actions_is_exact_and_matches_trace_memory() -> None:
    trace, _ = figure4_trace()
    sim = Simulator(trace, trace.peak_bytes, profile())
    assert np.array_equal(sim.index.op_memory, trace.op_memory)
    r = sim.run([])
    assert r.feasible and r.makespan == trace.compute_time and r.overhead == 0.0
    assert r.peak_bytes == trace.peak_bytes == 7 and r.bytes_d2h == r.bytes_h2d == 0
    assert r.stall == {"swap_out": 0.0, "prefetch": 0.0, "recompute": 0.0}


def test_figure4_offload_pauses_half_a_second() -> None:
    """DQN paper 4.6: offloading X0 takes 1.5 s, ops take 1 s: at the limit the GPU pauses 0.5 s."""
    trace, t = figure4_trace()
    sim = Simulator(trace, 4, profile(bw=2.0))
    r = sim.run([Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)], timeline=True)
    assert r.feasible
    assert r.makespan == 8.5 and r.compute_time == 8.0 and r.overhead == 0.5 / 8
    assert r.stall == {"swap_out": 0.5, "prefetch": 0.0, "recompute": 0.0}
    assert r.stall_by_phase == {"forward": 0.5, "backward": 0.0, "optimizer": 0.0}
    assert r.bytes_d2h == r.bytes_h2d == 3 and r.peak_bytes == 4
    # Memory: X0 leaves at 3.5 (copy 2.0-3.5), f3 allocates X2 at once; b4 frees X2 at 5.5 and the
    # prefetch of X0 (admitted once b4 is done) brings it back from 5.5 to 7.0, before bx at 7.5.
    times, values = r.timeline
    assert times[-1] == 8.5 and values[-1] == 0
    assert [mem_at(r, x) for x in (0.5, 1.5, 3.2, 3.5, 5.0, 6.0, 7.7, 8.5)] == [3, 4, 4, 4, 4, 4, 3, 0]
    assert list(zip(times.tolist(), values.tolist())) == [
        (0.0, 0), (0.0, 3), (1.0, 4), (3.5, 1), (3.5, 4), (5.5, 1), (5.5, 4), (7.5, 3), (8.5, 0)]


@pytest.mark.parametrize("limit,release", [(4, 3), (7, 4)])
def test_swap_out_ops_release_at_the_first_op_after_the_copy(limit: int, release: int) -> None:
    """X0's copy runs 2.0-3.5.  At 4 B f3 (op 3) waits for it and starts at 3.5: op 3 counts on its
    bytes.  At 7 B nothing waits: f3 starts at 3.0, during the copy, so the first op after it is b4."""
    from dqn_swap.simulator import swap_out_ops

    trace, t = figure4_trace()
    plan = Plan((Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP),), limit, trace.fingerprint, "test", "hand")
    assert swap_out_ops(trace, plan, profile(bw=2.0))[1] == {t["x0"]: release}


def test_figure4_offload_is_free_with_room() -> None:
    """Not at the limit: the copy overlaps f2, f3 (agent 'rounded up' to a later node), no pause."""
    trace, t = figure4_trace()
    r = Simulator(trace, 7, profile(bw=2.0)).run([Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)])
    assert r.feasible and r.makespan == 8.0 and r.stall["swap_out"] == 0.0
    # With room, the admission rule brings X0 back as soon as its copy is done (never above 7 B).
    assert r.peak_bytes == 7


def test_figure4_remove_costs_the_recompute() -> None:
    """DQN paper 4.7: removing X0 costs the time to recompute it (f0, 1 s) before its backward use."""
    trace, t = figure4_trace()
    r = Simulator(trace, 4, profile()).run([Action(event_of(trace, 1, t["x0"]), t["x0"], REC)], timeline=True)
    assert r.feasible and r.makespan == 9.0
    assert r.recompute_time == 1.0 and r.recompute_ops == (0,)
    assert r.stall == {"swap_out": 0.0, "prefetch": 0.0, "recompute": 1.0}
    assert r.stall_by_phase["backward"] == 1.0
    assert r.bytes_d2h == 0 and r.peak_bytes == 4
    # X0 freed when f1 ends (2.0); re-allocated by the re-run of f0 at 7.0 (after X1 is freed).
    assert [mem_at(r, x) for x in (1.5, 2.0, 3.5, 6.5, 7.0, 8.5, 9.0)] == [4, 1, 4, 1, 3, 3, 0]


def test_prefetch_late_stalls_backward() -> None:
    """Only one op between X2's free and X0's use: the 1.5 s prefetch arrives 0.5 s late."""
    trace, t = figure4_trace(backward_gap=1)
    r = Simulator(trace, 4, profile(bw=2.0)).run([Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)])
    # forward: 0.5 s waiting for the swap-out; backward: prefetch 5.5-7.0, the last op was due at 6.5.
    assert r.feasible and r.makespan == 7.0 + 0.5 + 0.5
    assert r.stall == {"swap_out": 0.5, "prefetch": 0.5, "recompute": 0.0}
    assert r.stall_by_phase == {"forward": 0.5, "backward": 0.5, "optimizer": 0.0}


def test_infeasible_names_op_needed_available() -> None:
    trace, t = figure4_trace()
    r = Simulator(trace, 3, profile()).run([Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)])
    assert not r.feasible and r.infeasible is not None
    assert (r.infeasible.op, r.infeasible.needed, r.infeasible.available) == (1, 1, 0)
    assert r.makespan == 1.0  # stuck when f0 ended
    assert r.overhead == 0.0  # no stall accrued before getting stuck
    assert math.isinf(r.makespan_over_lower_bound) and r.figures()["makespan_over_lower_bound"] is None
    msg = r.infeasible.message(trace)
    assert msg.startswith("#1 f1 (<top>, forward)") and "needs 1 B" in msg and "only 0 B available" in msg
    assert "\n" not in msg
    assert r.peak_bytes <= 3
    # Too little removed: f3 needs 3 B more with X0 gone and only 2 free under 3 B... also infeasible.
    r = Simulator(trace, 4, profile()).run([])
    assert not r.feasible and r.infeasible.op == 3 and r.infeasible.needed == 3 and r.infeasible.available == 0


def test_overcommit_runs_the_whole_iteration() -> None:
    """``overcommit=True``: the first excess is reported, then the device has just enough memory."""
    trace, t = figure4_trace()
    r = Simulator(trace, 4, profile()).run([], overcommit=True)
    assert not r.feasible and (r.infeasible.op, r.infeasible.needed, r.infeasible.available) == (3, 3, 0)
    assert r.makespan == 8.0 and r.overhead == 0.0 and r.peak_bytes == 7  # nothing waits: no plan
    # X0 offloaded under 3 B: f1 is 1 B short (the limit becomes 4 B), then it runs exactly as the
    # feasible 4 B case of Figure 4 (0.5 s pause in forward, prefetch on time).
    x0 = Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)
    r = Simulator(trace, 3, profile(bw=2.0)).run([x0], overcommit=True, timeline=True)
    assert not r.feasible and (r.infeasible.op, r.infeasible.needed, r.infeasible.available) == (1, 1, 0)
    assert r.makespan == 8.5 and r.overhead == 0.5 / 8 and r.stall["swap_out"] == 0.5
    assert r.bytes_d2h == r.bytes_h2d == 3 and r.peak_bytes == 4
    assert r.timeline[0][-1] == 8.5 and r.timeline[1][-1] == 0
    hard = Simulator(trace, 3, profile(bw=2.0)).run([x0])
    assert hard.infeasible == r.infeasible and hard.makespan == 1.0


def test_preexisting_over_limit_is_infeasible() -> None:
    b = TraceBuilder()
    w = b.tensor(10, Role.PARAMETER, preexisting=True)
    b.op("mm", F, reads=[w], duration=1)
    r = Simulator(b.build(), 5, profile()).run([])
    assert not r.feasible and r.infeasible.op == 0 and r.infeasible.needed == 10


# --------------------------------------------------------------------------- engines
def engines_trace() -> tuple[Trace, list[Action]]:
    """A is swapped after f0 and read by f3; B swapped after f1 and read by f4; copies 1 s each.

    Duplex: A's prefetch (2-3) overlaps B's swap-out (2-3): no stall.  One
    engine: B's swap-out (requested at 2) goes first, A comes back 3-4, f3 waits 1 s.
    """
    b = TraceBuilder()
    a, bb = b.tensor(2, Role.SAVED), b.tensor(2, Role.SAVED)
    b.op("f0", F, outputs=[a], duration=1)
    b.op("f1", F, outputs=[bb], duration=1)
    b.op("f2", F, duration=1)
    b.op("f3", B, reads=[a], frees=[a], duration=1)
    b.op("f4", B, reads=[bb], frees=[bb], duration=1)
    trace = b.build()
    return trace, [Action(event_of(trace, 0, a), a, SWAP), Action(event_of(trace, 1, bb), bb, SWAP)]


def test_duplex_overlaps_copies() -> None:
    trace, acts = engines_trace()
    r = Simulator(trace, 100, profile(bw=2.0, duplex=True)).run(acts)
    assert r.feasible and r.makespan == 5.0 and r.stall["prefetch"] == 0.0


def test_single_engine_serialises_copies() -> None:
    trace, acts = engines_trace()
    r = Simulator(trace, 100, profile(bw=2.0, duplex=False)).run(acts)
    assert r.feasible and r.makespan == 6.0
    assert r.stall == {"swap_out": 0.0, "prefetch": 1.0, "recompute": 0.0}
    assert r.stall_by_phase["backward"] == 1.0


# --------------------------------------------------------------------------- recompute rules
def chain_with_dead_temporary() -> tuple[Trace, dict[str, int]]:
    """f0 makes T (temporary, dead after f1), f1 reads T and makes A (saved); b3 makes a
    gradient G (4 B) that b4 reads with A."""
    b = TraceBuilder()
    x = b.tensor(1, Role.INPUT, preexisting=True)
    tmp, a, c, g = (b.tensor(2, Role.TEMPORARY), b.tensor(4, Role.SAVED), b.tensor(4, Role.SAVED),
                    b.tensor(4, Role.TEMPORARY))
    b.op("f0", F, reads=[x], outputs=[tmp], duration=0.5)
    b.op("f1", F, reads=[tmp], outputs=[a], frees=[tmp], duration=0.25)
    b.op("f2", F, reads=[a], outputs=[c], duration=1)
    b.op("b3", B, reads=[c], outputs=[g], frees=[c], duration=1)
    b.op("b4", B, reads=[a, g], frees=[a, g], duration=1)
    return b.build(), {"x": x, "tmp": tmp, "a": a, "c": c, "g": g}


def test_recursive_recompute_of_dead_input() -> None:
    trace, t = chain_with_dead_temporary()
    assert trace.peak_bytes == 13  # b3: x + A + C + G
    sim = Simulator(trace, 11, profile())
    act = Action(event_of(trace, 2, t["a"]), t["a"], REC)
    assert sim.valid_actions().can_recompute[act.event]
    r = sim.run([act], timeline=True)
    # Before b4: re-run f0 (T, 2 B) then f1 (A, 4 B); T is freed right after f1's re-run.
    assert r.feasible and r.recompute_ops == (0, 1) and r.recompute_time == 0.75
    assert r.makespan == trace.compute_time + 0.75
    # x + G = 5 B stay; during f1's re-run x + G + T + A = 11 B; then x + G + A = 9 B.
    t_b4 = trace.op_start[4]
    assert [mem_at(r, t_b4 + d) for d in (0.0, 0.5, 0.75, 1.75)] == [7, 11, 9, 0 + 1]
    assert r.peak_bytes == 11 and r.peak_op == 4
    # At 10 B the forward fits but the recompute sequence does not: the plan is infeasible at b4,
    # stuck allocating f1's re-run (4 B needed, 3 B free).
    r = Simulator(trace, 10, profile()).run([act])
    assert not r.feasible and r.infeasible.op == 4
    assert (r.infeasible.needed, r.infeasible.available) == (4, 3)
    assert "recomputing with #1 f1" in r.infeasible.reason
    assert int(sim.analyse([act]).need[4]) == 11


def test_recompute_reads_swapped_input() -> None:
    """A removed tensor whose producer reads a swapped tensor: the re-run is the swapped one's next use."""
    b = TraceBuilder()
    s, a, c = b.tensor(2, Role.SAVED), b.tensor(4, Role.SAVED), b.tensor(4, Role.SAVED)
    b.op("f0", F, outputs=[s], duration=1)
    b.op("f1", F, reads=[s], outputs=[a], duration=1)
    b.op("f2", F, reads=[a], outputs=[c], duration=1)
    b.op("b3", B, reads=[c], frees=[c], duration=1)
    b.op("b4", B, reads=[a], frees=[a], duration=1)
    b.op("b5", B, reads=[s], frees=[s], duration=1)
    trace = b.build()
    sim = Simulator(trace, 100, profile(bw=2.0))
    acts = [Action(event_of(trace, 1, s), s, SWAP), Action(event_of(trace, 2, a), a, REC)]
    prep = sim.analyse(acts)
    assert prep.next_use[s] == 4  # needed by the re-run of f1 before b4, not by b5
    r = sim.run(acts)
    # s goes out 2-3 and, with room, comes back 3-4; the re-run of f1 (1 s) before b4.
    assert r.feasible and r.makespan == 7.0 and r.recompute_ops == (1,) and r.stall["prefetch"] == 0.0


def test_inplace_modified_tensor_is_not_recomputable() -> None:
    b = TraceBuilder()
    x = b.tensor(1, Role.INPUT, preexisting=True)
    a = b.tensor(4, Role.SAVED)
    b.op("bn", F, reads=[x], outputs=[a], duration=1)
    b.op("relu_", F, reads=[a], writes=[a], duration=1)
    b.op("bwd", B, reads=[a], frees=[a], duration=1)
    trace = b.build()
    sim = Simulator(trace, 100, profile())
    va = sim.valid_actions()
    e = event_of(trace, 1, a, EventKind.READ)
    assert va.can_swap[e] and not va.can_recompute[e]
    with pytest.raises(ValueError, match="would not give the same value"):
        sim.run([Action(e, a, REC)])


def test_invalid_actions_raise_clear_errors() -> None:
    trace, t = figure4_trace()
    b = TraceBuilder()
    w = b.tensor(4, Role.PARAMETER, preexisting=True)
    y = b.tensor(4, Role.SAVED)
    b.op("mm", F, reads=[w], outputs=[y], duration=1)
    b.op("bwd", B, reads=[y, w], frees=[y], duration=1)
    tr2 = b.build()
    sim2 = Simulator(tr2, 100, profile())
    with pytest.raises(ValueError, match="parameter"):
        sim2.run([Action(event_of(tr2, 0, w), w, SWAP)])
    sim = Simulator(trace, 100, profile())
    with pytest.raises(ValueError, match="outside the trace"):
        sim.run([Action(10_000, t["x0"], SWAP)])
    with pytest.raises(ValueError, match="touches tensor"):
        sim.run([Action(event_of(trace, 1, t["x0"]), t["x1"], SWAP)])
    with pytest.raises(ValueError, match="malloc, not a read or write"):
        sim.run([Action(event_of(trace, 0, t["x0"], EventKind.MALLOC), t["x0"], SWAP)])
    with pytest.raises(ValueError, match="not used again"):
        sim.run([Action(event_of(trace, trace.n_ops - 1, t["x0"]), t["x0"], SWAP)])
    with pytest.raises(ValueError, match="unknown action kind"):
        sim.run([Action(event_of(trace, 1, t["x0"]), t["x0"], 7)])  # type: ignore[arg-type]
    assert sim.why_invalid(Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)) is None


def test_duplicate_actions_first_in_event_order_wins() -> None:
    trace, t = figure4_trace()
    sim = Simulator(trace, 4, profile(bw=2.0))
    swap = Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)
    rec = Action(event_of(trace, 1, t["x0"]), t["x0"], REC)
    r = sim.run([rec, swap])  # the same event: the swap comes first and wins
    assert r.ignored_actions == (rec,) and r.recompute_ops == () and r.bytes_d2h == 3
    r2 = sim.run([swap, swap])
    assert r2.ignored_actions == (swap,) and r2.makespan == 8.5
    plan = Plan((swap, rec), 4, trace.fingerprint, "test", "hand")
    with pytest.raises(ValueError, match="more than one action"):
        simulate(trace, plan, profile=profile())


def test_simulate_plan_and_actions() -> None:
    trace, t = figure4_trace()
    swap = Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)
    plan = Plan((swap,), 4, trace.fingerprint, "v100-pcie3", "hand")
    r = simulate(trace, plan, profile=profile(bw=2.0))
    assert r.memory_limit == 4 and r.makespan == 8.5
    assert simulate(trace, [swap], 4, profile(bw=2.0)).makespan == 8.5
    with pytest.raises(ValueError, match="memory_limit"):
        simulate(trace, [swap])
    bad = dataclasses.replace(plan, trace_fingerprint="0" * 16)
    with pytest.raises(PlanError):
        simulate(trace, bad)
    # No profile given: the plan's (a named one) applies; default from the trace meta otherwise.
    assert simulate(trace, plan).feasible
    fig = r.figures()
    json.dumps(fig)
    assert fig["makespan"] == 8.5 and fig["stall"]["swap_out"] == 0.5 and fig["infeasible"] is None


# --------------------------------------------------------------------------- offloading paper reductions
def two_partition_instance(u: list[int], V: int) -> tuple[Trace, list[int]]:
    """Theorem 3's instance (Figure 3): activations of sizes ``u`` (sum 2V), F_n and B_n of 1 s,
    x_{n+2} of size V, all else 0 s and 0 B, beta = V, M_GPU = 2V; optimal makespan 2 iff a partition exists."""
    b = TraceBuilder()
    xs = [b.tensor(s, Role.SAVED) for s in u]
    z, big, w = b.tensor(0, Role.SAVED), b.tensor(V, Role.SAVED), b.tensor(0, Role.SAVED)
    for j, x in enumerate(xs):
        b.op(f"F{j}", F, reads=[xs[j - 1]] if j else [], outputs=[x], duration=0)
    b.op("Fn", F, reads=[xs[-1]], outputs=[z], duration=1)
    b.op("Fn+1", F, reads=[z], outputs=[big], duration=0)
    b.op("Fn+2", F, reads=[big], outputs=[w], duration=0)
    b.op("Bn+2", B, reads=[w, big], frees=[w], duration=0)
    b.op("Bn+1", B, reads=[big, z], frees=[big], duration=0)
    b.op("Bn", B, reads=[z], frees=[z], duration=1)
    for j in reversed(range(len(xs))):
        b.op(f"B{j}", B, reads=[xs[j]], frees=[xs[j]], duration=0)
    return b.build(), xs


@pytest.mark.parametrize("duplex", [True, False])
def test_two_partition_optimum(duplex: bool) -> None:
    V = 64
    u = [8, 24, 16, 32, 40, 8]  # {24, 40} = 64 = V
    trace, xs = two_partition_instance(u, V)
    sim = Simulator(trace, 2 * V, profile(bw=V, duplex=duplex))
    assert trace.peak_bytes == 3 * V and sim.lower_bound == 2.0
    good = [Action(event_of(trace, j + 1, xs[j], EventKind.READ), xs[j], SWAP) for j in (1, 4)]
    r = sim.run(good)
    assert r.feasible and r.makespan == 2.0 and r.makespan_over_lower_bound == 1.0
    assert r.bytes_d2h == r.bytes_h2d == V
    # A set of 72 B: its copies need more than F_n's second, F_{n+1} waits; then 72 B come back.
    bad = [Action(event_of(trace, j + 1, xs[j], EventKind.READ), xs[j], SWAP) for j in (3, 4)]
    rb = sim.run(bad)
    assert rb.feasible and rb.makespan > 2.0


def three_partition_instance(groups: list[list[int]], V: int) -> tuple[Trace, list[int]]:
    """Theorem 1's instance (Figure 2) with m = len(groups): 3m activations (sizes in ``groups``
    order), m forward ops of 1 s each making an activation of V, B_3m of m s, beta = V.

    The paper states M_GPU = mV; our model reserves an op's output when it starts,
    so the same schedule needs (m+1)V: with it, makespan 2m iff the sizes split
    into m triples of sum V transferred one triple per forward op."""
    m = len(groups)
    sizes = [s for g in groups for s in g]
    b = TraceBuilder()
    xs = [b.tensor(s, Role.SAVED) for s in sizes]
    for j, x in enumerate(xs):
        b.op(f"F{j}", F, reads=[xs[j - 1]] if j else [], outputs=[x], duration=0)
    prev = xs[-1]
    bigs, zeros = [], []
    for k in range(m):
        big, q = b.tensor(V, Role.SAVED), b.tensor(0, Role.SAVED)
        b.op(f"C{k}", F, reads=[prev], outputs=[big], duration=1)
        b.op(f"Q{k}", F, reads=[big], outputs=[q], duration=0)
        bigs.append(big), zeros.append(q)
        prev = q
    for k in reversed(range(m)):
        b.op(f"Q'{k}", B, reads=[zeros[k], bigs[k]], frees=[zeros[k]], duration=0)
        b.op(f"C'{k}", B, reads=[bigs[k]], frees=[bigs[k]], duration=m if k == 0 else 0)
    for j in reversed(range(len(xs))):
        b.op(f"B{j}", B, reads=[xs[j]], frees=[xs[j]], duration=0)
    return b.build(), xs


def test_three_partition_optimum_and_wrong_grouping() -> None:
    V, m = 64, 2
    good_trace, xs = three_partition_instance([[20, 20, 24], [18, 22, 24]], V)
    sim = Simulator(good_trace, (m + 1) * V, profile(bw=V))
    plan = [Action(event_of(good_trace, j + 1, x, EventKind.READ), x, SWAP) for j, x in enumerate(xs)]
    r = sim.run(plan)
    assert r.feasible and r.makespan == 2.0 * m and r.overhead == 0.0
    assert r.lower_bound == 2.0 * m  # T = 2m dominates the transfer term (2(m-1) + 1)
    # Same sizes, grouped [20, 20, 18] / [24, 22, 24]: after 1 s only 58 B are out; C_1 waits for
    # the 24 B copy to end at 82/64 s, and everything after shifts by 18/64 = 0.28125 s.
    bad_trace, xs = three_partition_instance([[20, 20, 18], [24, 22, 24]], V)
    sim = Simulator(bad_trace, (m + 1) * V, profile(bw=V))
    plan = [Action(event_of(bad_trace, j + 1, x, EventKind.READ), x, SWAP) for j, x in enumerate(xs)]
    r = sim.run(plan)
    assert r.feasible and r.makespan == 4.28125
    assert r.stall == {"swap_out": 0.28125, "prefetch": 0.0, "recompute": 0.0}


# --------------------------------------------------------------------------- random traces
def random_trace(seed: int, max_layers: int = 7) -> Trace:
    """A small training-like trace: forward chain with skips, dead temporaries, in-place ops,
    workspaces; backward in reverse; an optimizer step.  Frees at each tensor's last use."""
    rng = np.random.default_rng(seed)
    specs: list[dict[str, Any]] = []
    roles: list[Role] = []
    sizes: list[int] = []
    pre: list[bool] = []

    def tensor(role: Role, preexisting: bool = False, size: int | None = None) -> int:
        roles.append(role)
        sizes.append(int(rng.integers(0, 17)) * 4 if size is None else size)
        pre.append(preexisting)
        return len(roles) - 1

    def dur() -> float:
        return float(rng.choice([0.0, 0.25, 0.5, 1.0, 2.0])) if rng.random() < 0.5 else float(rng.uniform(0, 2))

    def op(name: str, phase: Phase, reads=(), outputs=(), writes=()) -> None:
        scratch = int(rng.integers(1, 9)) * 4 if rng.random() < 0.25 else 0  # a kernel's workspace
        specs.append(dict(name=name, phase=phase, reads=list(reads), outputs=list(outputs),
                          writes=list(writes), duration=dur(), scratch=scratch))

    grad_scale = float(rng.choice([0.0, 0.25, 1.0]))  # small gradients: the peak ends the forward

    def grad_size() -> int:
        return int(rng.integers(0, 17) * grad_scale) * 4

    L = int(rng.integers(1, max_layers + 1))
    params = [tensor(Role.PARAMETER, True) for _ in range(L)]
    h = tensor(Role.INPUT, True)
    acts = [h]
    layer_inputs = []
    for layer in range(L):
        reads = [acts[-1], params[layer]]
        if len(acts) > 2 and rng.random() < 0.3:
            reads.append(acts[int(rng.integers(0, len(acts) - 1))])
        layer_inputs.append(list(reads))
        if rng.random() < 0.3:  # two ops, the first output dies after the second
            t = tensor(Role.TEMPORARY)
            op(f"f{layer}a", F, reads=reads, outputs=[t])
            reads = [t]
        out = tensor(Role.SAVED if rng.random() < 0.8 else Role.TEMPORARY)
        ws = [tensor(Role.TEMPORARY)] if rng.random() < 0.3 else []
        op(f"f{layer}", F, reads=reads, outputs=[out, *ws])
        if rng.random() < 0.2:
            op(f"f{layer}_", F, reads=[out], writes=[out])
        acts.append(out)
    grad = tensor(Role.TEMPORARY, size=grad_size())
    op("loss", F, reads=[acts[-1]], outputs=[grad])
    pgrads = []
    for layer in reversed(range(L)):
        new_grad = tensor(Role.TEMPORARY, size=grad_size())
        pg = tensor(Role.GRADIENT, size=grad_size())
        pgrads.append((layer, pg))
        op(f"b{layer}", B, reads=[grad, acts[layer + 1], *layer_inputs[layer]], outputs=[new_grad, pg])
        grad = new_grad
    for layer, pg in pgrads:
        op(f"opt{layer}", O, reads=[pg, params[layer]], writes=[params[layer]])

    last: dict[int, int] = {}
    for i, s in enumerate(specs):
        for t in (*s["reads"], *s["outputs"], *s["writes"]):
            last[t] = i
    keep = {t for t in range(len(roles)) if roles[t] in (Role.PARAMETER, Role.INPUT)} | {grad}
    b = TraceBuilder()
    for t in range(len(roles)):
        b.tensor(sizes[t], roles[t], preexisting=pre[t])
    for i, s in enumerate(specs):
        frees = [t for t in dict.fromkeys((*s["reads"], *s["outputs"], *s["writes"]))
                 if last[t] == i and t not in keep]
        b.op(s["name"], s["phase"], reads=s["reads"], outputs=s["outputs"], writes=s["writes"],
             frees=frees, duration=s["duration"], scratch=s["scratch"])
    return b.build({"profile": "v100-pcie3"})


def random_plan(sim: Simulator, rng: np.random.Generator, density: float,
                longest_gap: bool | None = None) -> list[Action]:
    """Random valid actions, usually one per tensor, sometimes a duplicate.

    With ``longest_gap`` (random if None) each chosen tensor is acted on at its
    event with the longest reuse gap, like a planner would; else at a random event.
    """
    trace = sim.trace
    va = sim.valid_actions()
    if longest_gap is None:
        longest_gap = bool(rng.random() < 0.5)
    by_tensor: dict[int, list[tuple[int, ActionKind]]] = {}
    for e in np.flatnonzero(va.can_swap):
        by_tensor.setdefault(int(trace.event_tensor[e]), []).append((int(e), SWAP))
    for e in np.flatnonzero(va.can_recompute):
        by_tensor.setdefault(int(trace.event_tensor[e]), []).append((int(e), REC))
    actions = []
    for t, options in by_tensor.items():
        if rng.random() < density:
            if longest_gap:
                gap = {e: sim.index.event_return_op[e] - trace.event_op[e] for e, _ in options}
                best = max(gap.values())
                options = [(e, k) for e, k in options if gap[e] == best]
            e, k = options[int(rng.integers(len(options)))]
            actions.append(Action(e, t, k))
            if rng.random() < 0.05:
                e, k = options[int(rng.integers(len(options)))]
                actions.append(Action(e, t, k))
    rng.shuffle(actions)
    return actions


def random_profile(rng: np.random.Generator) -> DeviceProfile:
    return profile(bw=float(rng.choice([8.0, 32.0, 128.0, rng.uniform(4, 256)])),
                   h2d=float(rng.choice([8.0, 32.0, 128.0, rng.uniform(4, 256)])),
                   duplex=bool(rng.random() < 0.5), latency=float(rng.choice([0.0, 0.01])))


def random_limit(trace: Trace, rng: np.random.Generator) -> int:
    lo = max(trace.persistent_bytes, int(trace.minimum_memory * 0.9))
    hi = int(trace.peak_bytes * 1.1) + 1
    return int(rng.integers(lo, max(hi, lo + 1)))


def random_case(seed: int, density: float) -> tuple[Simulator, list[Action]]:
    """A random trace, profile, plan and limit; half the time the limit is the plan's own
    minimum (its largest need, plus 0-3 bytes) so the run is feasible and tight; half the time
    gated (prefetches issued only at random points, ``Simulator.points``)."""
    rng = np.random.default_rng(seed)
    trace = random_trace(seed)
    prof = random_profile(rng)
    prng = np.random.default_rng(seed + 1_000_003)  # apart, so that the other draws stay as they were
    points = np.flatnonzero(prng.random(trace.n_ops) < prng.choice([0.1, 0.3, 0.7])) if prng.random() < 0.5 else None
    sim = Simulator(trace, random_limit(trace, rng), prof, points=points)
    actions = random_plan(sim, rng, density)
    if rng.random() < 0.5:
        tight = max(int(sim.analyse(actions).need.max(initial=0)), trace.initial_bytes)
        sim = Simulator(trace, tight + int(rng.integers(0, 4)), prof, points=points)
    return sim, actions


# --------------------------------------------------------------------------- reference model
def reference_run(sim: Simulator, actions: list[Action]) -> tuple[bool, float, int, int, int, float]:
    """The model of the module docstring, written naively (no gates, no caches).

    Shares only the static analysis (``Simulator.analyse``: closures, next uses, need) with
    the simulator.  Returns (feasible, makespan or stuck time, peak, bytes_d2h,
    bytes_h2d, recompute_time).
    """
    prep = sim.analyse(actions)
    trace, limit, prof = sim.trace, sim.memory_limit, sim.profile
    nb = [int(x) for x in trace.tensor_nbytes]
    need0 = prep.need.astype(np.int64).copy()
    L = sim.lists
    mal, fre, scr = L.mal, L.fre, L.scr
    d2h_t = lambda x: float(prof.transfer_time(nb[x], "d2h"))  # noqa: E731
    h2d_t = lambda x: float(prof.transfer_time(nb[x], "h2d"))  # noqa: E731
    # run: scratch of the op or re-run on the compute stream now (allocated on top of mem)
    st: dict[str, Any] = dict(mem=trace.initial_bytes, peak=trace.initial_bytes, pending=0, d2h_free=0.0, h2d_free=0.0,
                              bd=0, bh=0, run=0, inpt=True)
    # Gated (Simulator.points): a prefetch is issued only while the runtime is in control (at the start
    # of a point, or of an op that waits for copies back or re-runs ops), and copies when the link is free.
    points = sim.points
    d2h: list[tuple[float, int]] = []  # scheduled swap-outs not yet completed
    d2h_end: dict[int, float] = {}
    started: dict[int, int] = {}  # tensor -> its use op, for every prefetch started
    h2d_end: dict[int, float] = {}
    queue: list[tuple[int, int]] = []

    class Stuck(Exception):
        pass

    def need(j: int) -> int:
        return int(need0[j]) + sum(nb[z] for z, n in started.items() if n > j)

    def head_time(k0: int, now: float) -> float:
        if not queue:
            return math.inf
        n, y = min(queue)
        if n > k0 and any(need(j) + st["pending"] + nb[y] > limit for j in range(k0, n)):
            return math.inf
        if st["mem"] + st["run"] + nb[y] > limit:
            return math.inf
        free_at = st["h2d_free"] if prof.duplex else max(st["h2d_free"], st["d2h_free"])
        if points is not None:  # issued at once, unless the link stays busy past the next point
            ok = st["inpt"] and (n <= k0 or free_at <= st["pt"] + sim.horizon[k0])
            return max(d2h_end[y], now) if ok else math.inf
        return max(d2h_end[y], free_at, now)

    def step(T: float, k0: int, incl: bool, now: float) -> bool:
        """Process the earliest copy event before T; False when there is none."""
        td = min(d2h)[0] if d2h else math.inf
        tp = head_time(k0, now)
        t = min(td, tp)
        if t > T or (t == T and not incl) or t == math.inf:
            return False
        if td <= tp:
            _, x = min(d2h)
            d2h.remove((td, x))
            st["mem"] -= nb[x]
            st["pending"] -= nb[x]
        else:
            n, y = min(queue)
            queue.remove((n, y))
            st["mem"] += nb[y]
            st["peak"] = max(st["peak"], st["mem"] + st["run"])
            started[y] = n
            free_at = st["h2d_free"] if prof.duplex else max(st["h2d_free"], st["d2h_free"])
            h2d_end[y] = max(tp, free_at) + h2d_t(y)
            st["h2d_free"] = h2d_end[y]
            if not prof.duplex:
                st["d2h_free"] = h2d_end[y]
            st["bh"] += nb[y]
        return True

    def run_until(T: float, k0: int, incl: bool, now: float) -> float:
        while True:
            td = min(d2h)[0] if d2h else math.inf
            tp = head_time(k0, now)
            t = min(td, tp)
            if not step(T, k0, incl, now):
                return now
            now = max(now, t)

    def wait_fit(amount: int, k0: int, now: float) -> float:
        while st["mem"] + amount > limit:
            if not d2h:
                raise Stuck(now)
            now = run_until(min(d2h)[0], k0, True, now)
        return now

    def wait_back(y: int, k0: int, now: float) -> float:
        while y not in h2d_end:
            td = min(d2h)[0] if d2h else math.inf
            t = min(td, head_time(k0, now))
            if t == math.inf:
                raise Stuck(now)
            now = run_until(t, k0, True, now)
        if h2d_end[y] > now:
            now = run_until(h2d_end[y], k0, True, now)
            now = h2d_end[y]
        return now

    now = 0.0
    rec = 0.0
    try:
        if st["mem"] > limit:
            raise Stuck(0.0)
        for k in range(trace.n_ops):
            st["inpt"] = points is None or bool(points[k]) or k in prep.special
            st["pt"] = now
            now = run_until(now, k, True, now)
            steps, waits = prep.special.get(k, ((), ()))
            for y in waits:
                now = wait_back(y, k, now)
            for p, d, amount, scratch, release, leaves in steps:
                assert scratch == scr[p]
                for y in leaves:
                    now = wait_back(y, k, now)
                now = wait_fit(amount + scratch, k, now)
                st["mem"] += amount
                st["peak"] = max(st["peak"], st["mem"] + scratch)
                st["run"] = scratch
                run_until(now + d, k, False, now)
                st["run"] = 0
                now += d
                rec += d
                st["mem"] -= release
            if points is not None and k in prep.special and now > st["pt"]:
                st["pt"] = now  # its waits and re-runs are over: the horizon counts from here
                now = run_until(now, k, True, now)
            now = wait_fit(mal[k] + scr[k], k, now)
            st["mem"] += mal[k]
            st["peak"] = max(st["peak"], st["mem"] + scr[k])
            end = now + float(trace.op_duration[k])
            st["inpt"] = points is None
            st["run"] = scr[k]
            run_until(end, k, False, now)
            st["run"] = 0
            now = end
            st["mem"] -= fre[k]
            for x, is_swap in prep.issues.get(k, ()):
                if is_swap:
                    s = max(now, st["d2h_free"] if prof.duplex else max(st["d2h_free"], st["h2d_free"]))
                    d2h_end[x] = s + d2h_t(x)
                    st["d2h_free"] = d2h_end[x]
                    if not prof.duplex:
                        st["h2d_free"] = d2h_end[x]
                    d2h.append((d2h_end[x], x))
                    st["pending"] += nb[x]
                    st["bd"] += nb[x]
                    queue.append((prep.next_use[x], x))
                else:
                    st["mem"] -= nb[x]
    except Stuck as e:
        return False, float(e.args[0]), st["peak"], st["bd"], st["bh"], rec
    return True, now, st["peak"], st["bd"], st["bh"], rec


# --------------------------------------------------------------------------- properties
def check_invariants(sim: Simulator, actions: list[Action], r: SimResult) -> None:
    trace = sim.trace
    prep = sim.analyse(actions)
    assert r.peak_bytes <= r.memory_limit
    # Honesty: a plan is feasible exactly when every op's need under the plan fits.
    assert r.feasible == (int(prep.need.max(initial=0)) <= sim.memory_limit
                          and trace.initial_bytes <= sim.memory_limit)
    assert r.recompute_time == pytest.approx(float(sum(trace.op_duration[p] for p in r.recompute_ops)),
                                             rel=1e-12, abs=1e-12)
    assert r.stall["recompute"] == r.recompute_time
    total = sum(r.stall.values())
    assert sum(r.stall_by_phase.values()) == pytest.approx(total, rel=1e-9, abs=1e-9)
    assert r.overhead == pytest.approx(total / r.compute_time, rel=1e-9, abs=1e-12) and r.overhead >= 0
    if r.feasible:
        assert r.makespan >= r.compute_time
        assert r.makespan - r.compute_time == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert r.makespan >= r.lower_bound * (1 - 1e-12) - 1e-12
        assert r.overhead >= 0
    if r.timeline is not None:
        times, values = r.timeline
        assert values.max() == r.peak_bytes and np.all(np.diff(times) >= 0)
        if r.feasible:  # everything swapped or removed came back and was freed as in the trace
            end = int(trace.memory_after_event[-1]) if trace.n_events else trace.initial_bytes
            assert values[-1] == end and times[-1] == pytest.approx(r.makespan, rel=1e-9, abs=1e-9)
    json.dumps(r.figures())


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), density=st.sampled_from([0.2, 0.5, 0.9]))
def test_random_plans_invariants_and_reference(seed: int, density: float) -> None:
    sim, actions = random_case(seed, density)
    r = sim.run(actions, timeline=True)
    check_invariants(sim, actions, r)
    feasible, makespan, peak, bd, bh, rec = reference_run(sim, actions)
    assert r.feasible == feasible
    assert r.makespan == pytest.approx(makespan, rel=1e-9, abs=1e-9)
    assert (r.peak_bytes, r.bytes_d2h, r.bytes_h2d) == (peak, bd, bh)
    assert r.recompute_time == pytest.approx(rec, rel=1e-12, abs=1e-12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), density=st.sampled_from([0.2, 0.5, 0.9]))
def test_overcommit_is_the_same_run_until_the_first_excess(seed: int, density: float) -> None:
    sim, actions = random_case(seed, density)
    hard, soft = sim.run(actions), sim.run(actions, overcommit=True)
    assert soft.feasible == hard.feasible and soft.infeasible == hard.infeasible
    if hard.feasible:
        assert soft.figures() == hard.figures()
        return
    total = sum(soft.stall.values())
    assert soft.makespan >= hard.makespan and soft.overhead >= hard.overhead * (1 - 1e-12)
    assert soft.makespan - soft.compute_time == pytest.approx(total, rel=1e-9, abs=1e-9)
    assert soft.overhead == pytest.approx(total / soft.compute_time, rel=1e-9, abs=1e-12)
    assert soft.bytes_h2d == soft.bytes_d2h  # every swapped tensor came back for its next use


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_no_actions_exact(seed: int) -> None:
    trace = random_trace(seed)
    sim = Simulator(trace, trace.peak_bytes + int(np.random.default_rng(seed).integers(0, 8)), profile())
    r = sim.run([])
    assert r.feasible and r.makespan == trace.compute_time and r.peak_bytes == trace.peak_bytes
    assert np.array_equal(sim.index.op_memory, trace.op_memory)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_more_memory_keeps_a_plan_feasible(seed: int) -> None:
    rng = np.random.default_rng(seed)
    trace = random_trace(seed)
    prof = random_profile(rng)
    lim = random_limit(trace, rng)
    actions = random_plan(Simulator(trace, lim, prof), rng, 0.6)
    r = Simulator(trace, lim, prof).run(actions)
    r2 = Simulator(trace, lim + int(rng.integers(1, 64)), prof).run(actions)
    assert r2.feasible or not r.feasible


def test_recorded_trace_random_plans(tiny_resnet_trace: Trace) -> None:
    """A recorded trace (meta device): valid random plans keep every invariant and match the reference."""
    trace = tiny_resnet_trace
    rng = np.random.default_rng(0)
    for i in range(6):
        limit = int(trace.peak_bytes * rng.uniform(0.6, 1.0))
        sim = Simulator(trace, limit)
        actions = random_plan(sim, rng, [0.1, 0.3, 0.6][i % 3])
        r = sim.run(actions, timeline=True)
        check_invariants(sim, actions, r)
        ref = reference_run(sim, actions)
        assert r.feasible == ref[0] and r.makespan == pytest.approx(ref[1], rel=1e-9)
        assert r.peak_bytes == ref[2]


def test_valid_actions_shape_and_rules(tiny_resnet_trace: Trace) -> None:
    trace = tiny_resnet_trace
    sim = Simulator(trace, trace.peak_bytes)
    va = sim.valid_actions()
    assert va.can_swap.shape == va.can_recompute.shape == (trace.n_events,)
    assert not np.any(va.can_recompute & ~va.can_swap)
    roles = trace.tensor_role[trace.event_tensor]
    assert np.all(np.isin(roles[va.can_swap], [Role.SAVED, Role.TEMPORARY, Role.INPUT]))
    assert np.all(trace.movable[trace.event_tensor[va.can_swap]])
    # a saved input may be swapped, never recomputed: nothing made it in the iteration
    assert not np.any(roles[va.can_recompute] == Role.INPUT)
    assert np.any(roles[va.can_swap] == Role.INPUT)
    kinds = trace.event_kind[va.can_swap]
    assert np.all(np.isin(kinds, [EventKind.READ, EventKind.WRITE]))
    assert np.all(sim.index.event_return_op[va.can_swap] > trace.event_op[va.can_swap])
    producers = trace.tensor_alloc_op[trace.event_tensor[va.can_recompute]]
    assert np.all(trace.op_phase[producers] == Phase.FORWARD)
    assert va.can_swap.any() and va.can_recompute.any()


def test_prefetch_order_is_next_use_and_head_blocks() -> None:
    """c (swapped second) is needed first: it heads the queue and a waits behind it.

    a (4 B) goes out 1-3, c (2 B) 3-4.  a's copy is done at 3 but c, the head,
    only at 4: c comes back 4-5, then a 5-7.  b3 (reads c) waits 4-5, b4 (reads a) 6-7.
    """
    b = TraceBuilder()
    a, c = b.tensor(4, Role.SAVED), b.tensor(2, Role.SAVED)
    b.op("f0", F, outputs=[a], duration=1)
    b.op("f1", F, outputs=[c], duration=1)
    b.op("f2", F, duration=2)
    b.op("b3", B, reads=[c], frees=[c], duration=1)
    b.op("b4", B, reads=[a], frees=[a], duration=1)
    trace = b.build()
    acts = [Action(event_of(trace, 0, a), a, SWAP), Action(event_of(trace, 1, c), c, SWAP)]
    r = Simulator(trace, 100, profile(bw=2.0)).run(acts, timeline=True)
    assert r.feasible and r.makespan == 8.0 and r.stall["prefetch"] == 2.0
    assert [mem_at(r, x) for x in (0.5, 1.5, 3.5, 4.5, 5.5, 7.5, 8.0)] == [4, 6, 2, 2, 6, 4, 0]


def test_a_measured_profile_travels_with_the_trace(tmp_path) -> None:
    """A trace recorded with a measured profile is planned with its figures on any machine."""
    from dqn_swap.agents import get_planner
    from dqn_swap.cost import profile_of

    trace, t = figure4_trace()
    measured = dataclasses.replace(profile(bw=2.0), name="measured")
    trace.meta.update(profile="measured", profile_params=measured.to_dict())
    trace.save(tmp_path / "m.trace")
    loaded = Trace.load(tmp_path / "m.trace")
    assert profile_of(loaded) == measured and profile_of(loaded, "measured") == measured
    assert profile_of(loaded, "v100-pcie3") == get_profile("v100-pcie3")
    x0 = Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)
    assert Simulator(loaded, 4).run([x0]).makespan == 8.5  # 1.5 s copies: the measured 2 B/s
    plan = get_planner("greedy").plan(loaded, 4)
    assert plan.profile == "measured" and simulate(loaded, plan).feasible == plan.figures["feasible"]


# --------------------------------------------------------------------------- scratch, validity, schedule
def test_kernel_scratch_delays_a_prefetch() -> None:
    """b5 needs 2 B of scratch beside X1: X0 (3 B) cannot come back while it runs under a 4 B
    limit, so its prefetch starts when b6 does (6.5) and arrives 0.5 s after bx was due."""
    trace, t = figure4_trace()
    trace = trace.replace(op_scratch=np.array([0, 0, 0, 0, 0, 2, 0, 0], dtype=np.int64))
    assert trace.op_memory.tolist() == [3, 4, 4, 7, 7, 6, 4, 3]
    r = Simulator(trace, 4, profile(bw=2.0)).run([Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)],
                                                 timeline=True)
    assert r.feasible and r.peak_bytes == 4
    assert r.schedule.prefetch == ((t["x0"], 6),)
    assert r.stall == {"swap_out": 0.5, "prefetch": 0.5, "recompute": 0.0} and r.makespan == 9.0
    times, values = r.timeline
    assert values.max() == 4  # the scratch shows in the memory curve


def test_scratch_can_make_a_plan_infeasible() -> None:
    trace, t = figure4_trace()
    trace = trace.replace(op_scratch=np.array([0, 0, 0, 1, 0, 0, 0, 0], dtype=np.int64))
    r = Simulator(trace, 4, profile(bw=2.0)).run([Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)])
    assert not r.feasible and r.infeasible.op == 3 and r.infeasible.needed == 4
    assert "scratch" in r.infeasible.reason


def test_a_plan_acts_only_after_the_last_forward_use() -> None:
    trace, t = figure4_trace()
    sim = Simulator(trace, 4, profile())
    early = Action(event_of(trace, 0, t["x0"]), t["x0"], SWAP)  # X0 is still read by f1
    assert "only after its last forward use" in sim.why_invalid(early)
    with pytest.raises(ValueError, match="last forward use"):
        sim.run([early])
    va = sim.valid_actions()
    assert not va.can_swap[event_of(trace, 0, t["x0"])] and va.can_swap[event_of(trace, 1, t["x0"])]


def test_the_schedule_records_what_the_simulator_decided() -> None:
    trace, t = figure4_trace()
    swap = [Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)]
    tight = Simulator(trace, 4, profile(bw=2.0)).run(swap)
    assert tight.schedule.prefetch == ((t["x0"], 5),)  # admitted once b4 (op 4) is done
    assert tight.schedule.max_inflight_d2h_bytes == 3
    roomy = Simulator(trace, 7, profile(bw=2.0)).run(swap)
    assert roomy.schedule.prefetch == ((t["x0"], 3),)  # as soon as its copy is done, while f3 runs
    rec = Simulator(trace, 4, profile()).run([Action(event_of(trace, 1, t["x0"]), t["x0"], REC)])
    last = trace.n_ops - 1
    assert rec.schedule.recompute == ((last, (RecomputeStep(0, (t["x0"],), ()),)),)
    assert rec.schedule.prefetch == ()


def test_instant_copy_memory_follows_the_schedule() -> None:
    """What a synchronous device holds: X0 away from f2 until its prefetch starts at b5."""
    trace, t = figure4_trace()
    swap = [Action(event_of(trace, 1, t["x0"]), t["x0"], SWAP)]
    sim = Simulator(trace, 4, profile(bw=2.0))
    r = sim.run(swap)
    mem = sim.instant_copy_memory(swap, r.schedule)
    assert mem.tolist() == [3, 4, 1, 4, 4, 4, 4, 3]
    assert mem.max() <= r.peak_bytes


def test_recompute_sequences_free_transient_inputs() -> None:
    """Removing a chain a -> b -> c where a is freed by the trace before b's reuse: the re-run of
    a before c's reuse is transient and released after the last re-run that reads it."""
    b = TraceBuilder()
    x = b.tensor(2, Role.INPUT, preexisting=True)
    a, bb, c = b.tensor(4, Role.SAVED), b.tensor(4, Role.SAVED), b.tensor(4, Role.SAVED)
    b.op("f0", F, reads=[x], outputs=[a], duration=1)
    b.op("f1", F, reads=[a], outputs=[bb], duration=1, frees=[a])
    b.op("f2", F, reads=[bb], outputs=[c], duration=1)
    b.op("b3", B, reads=[c], frees=[c], duration=1)
    b.op("b4", B, reads=[bb], frees=[bb], duration=1)
    trace = b.build()
    sim = Simulator(trace, 100, profile())
    acts = [Action(event_of(trace, 2, bb), bb, REC), Action(event_of(trace, 2, c), c, REC)]
    r = sim.run(acts)
    assert r.feasible
    sched = dict(r.schedule.recompute)
    # before b3: re-run f0 (a) and f1 (b) transiently, then f2 (c); a goes after f1, b after f2.
    assert sched[3] == (RecomputeStep(0, (a,), ()), RecomputeStep(1, (bb,), (a,)), RecomputeStep(2, (c,), (bb,)))
    # before b4: b's own turn, re-created again from a (the simulator keeps no transient for later).
    assert sched[4] == (RecomputeStep(0, (a,), ()), RecomputeStep(1, (bb,), (a,)))
