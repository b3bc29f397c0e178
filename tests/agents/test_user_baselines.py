"""The baselines users would pick instead of dqn-swap: per-block checkpointing, torchtune's offloading
(alone and with per-block checkpointing), and torch.compile's memory-budget knapsack."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from dqn_swap.agents.baselines.base import Evaluator, TraceFacts
from dqn_swap.agents.baselines.knapsack import (KnapsackPlanner, dp_in_bytes, dp_knapsack, greedy_knapsack, held_at,
                                                quantise)
from dqn_swap.agents.baselines.offload_all import OffloadAllPerBlockPlanner, OffloadAllPlanner
from dqn_swap.agents.baselines.per_block import PerBlockPlanner, block_paths
from dqn_swap.cost import get_profile
from dqn_swap.plan import ActionKind, Plan
from dqn_swap.recorder import record_trace
from dqn_swap.simulator import Simulator, simulate
from dqn_swap.trace import EventKind, Phase, Role, Trace, TraceBuilder

PROFILE = get_profile("v100-pcie3")
PLANNERS = (PerBlockPlanner, OffloadAllPlanner, OffloadAllPerBlockPlanner, KnapsackPlanner)


def between(trace: Trace, fraction: float) -> int:
    return int(trace.minimum_memory + fraction * (trace.peak_bytes - trace.minimum_memory))


def record_zoo(model: str, batch: int) -> Trace:
    from dqn_swap.models import build_workload

    w = build_workload(model, batch, "meta")
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta", inputs="released",
                        meta={"model": model, "batch_size": batch})


@pytest.fixture(scope="module")
def gpt_trace() -> Trace:
    return record_zoo("gpt_tiny", 2)


def module_of(trace: Trace, op: int) -> str:
    return trace.module_names[trace.op_module[op]]


def forward_reads(trace: Trace, t: int) -> list[int]:
    ev = np.flatnonzero((trace.event_tensor == t) & (trace.event_kind == EventKind.READ))
    ops = trace.event_op[ev]
    return sorted(set(ops[trace.op_phase[ops] == Phase.FORWARD].tolist()))


def used_after_forward(trace: Trace, t: int) -> bool:
    """Whether ``t`` is read or written by an op after its last forward use (what offloading brings back)."""
    ev = np.flatnonzero((trace.event_tensor == t) & (trace.event_kind != EventKind.FREE))
    ops = trace.event_op[ev]
    fwd = ops[trace.op_phase[ops] == Phase.FORWARD]
    return len(fwd) > 0 and bool((ops > fwd.max()).any())


# ----------------------------------------------------------------------------- every new planner
@pytest.mark.parametrize("cls", PLANNERS, ids=lambda c: c.name)
@pytest.mark.parametrize("fraction", [0.9, 0.5, -0.5])
def test_plans_are_valid_honest_and_deterministic(tiny_resnet_trace: Trace, cls: type, fraction: float) -> None:
    """Figures are a fresh simulation of the plan (which checks validity, one action per tensor); a limit
    far below the minimum memory comes back infeasible; planning twice gives the same plan."""
    trace = tiny_resnet_trace
    limit = between(trace, fraction)
    plan = cls().plan(trace, limit, PROFILE)
    assert plan.planner == cls.name and plan.memory_limit == limit and plan.trace_fingerprint == trace.fingerprint
    assert plan.figures == simulate(trace, plan).figures()
    assert plan.actions == cls().plan(trace, limit, PROFILE).actions
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))).actions == plan.actions
    if fraction < 0:
        assert plan.figures["feasible"] is False and plan.settings["limitation"] == cls.limitation
    if fraction == 0.9:
        assert plan.figures["feasible"] is True


def test_feasible_halfway_on_a_transformer(gpt_trace: Trace) -> None:
    limit = between(gpt_trace, 0.5)
    for cls in PLANNERS:
        plan = cls().plan(gpt_trace, limit, PROFILE)
        assert plan.figures["feasible"], cls.name
        assert plan.figures == simulate(gpt_trace, plan).figures()


def test_bad_settings_say_so() -> None:
    with pytest.raises(ValueError, match="min_offload_bytes must be a non-negative"):
        OffloadAllPlanner(min_offload_bytes=-1)
    with pytest.raises(ValueError, match="min_offload_bytes"):
        OffloadAllPerBlockPlanner(min_offload_bytes="1k")
    with pytest.raises(ValueError, match="solver must be one of dp, greedy"):
        KnapsackPlanner(solver="ilp")
    with pytest.raises(ValueError, match="resolution"):
        KnapsackPlanner(resolution=0)
    with pytest.raises(TypeError, match="no setting"):
        PerBlockPlanner(blocks=3)


# ----------------------------------------------------------------------------- per-block
def expected_in_block(trace: Trace, blocks: list[str]) -> set[int]:
    """Saved activations made by an op of a block and read in forward only by that block's ops, by names."""
    def block(op: int) -> str | None:
        if trace.op_phase[op] != Phase.FORWARD:
            return None
        m = module_of(trace, op)
        return next((b for b in blocks if m == b or m.startswith(b + ".")), None)

    out = set()
    for t in np.flatnonzero(trace.movable).tolist():
        alloc = int(trace.tensor_alloc_op[t])
        if alloc < 0 or block(alloc) is None or not used_after_forward(trace, t):
            continue
        if all(block(op) == block(alloc) for op in forward_reads(trace, t)):
            out.add(t)
    return out


@pytest.mark.parametrize("model,blocks", [("gpt_tiny", ["blocks.0", "blocks.1"]),
                                          ("resnet_tiny", [f"blocks.{i}" for i in range(6)])])
def test_per_block_recomputes_exactly_the_in_block_activations(gpt_trace: Trace, tiny_resnet_trace: Trace,
                                                               model: str, blocks: list[str]) -> None:
    trace = gpt_trace if model == "gpt_tiny" else tiny_resnet_trace
    assert block_paths(trace) == blocks
    plan = PerBlockPlanner().plan(trace, trace.peak_bytes, PROFILE)
    assert all(a.kind == ActionKind.RECOMPUTE for a in plan.actions)
    recomputed = {a.tensor for a in plan.actions}
    inside = expected_in_block(trace, blocks)
    sim = Simulator(trace, trace.peak_bytes, PROFILE)
    facts = TraceFacts(trace)
    event = dict(zip(facts.act_tensor.tolist(), facts.act_event.tolist()))
    can = sim.valid_actions().can_recompute
    assert recomputed == {t for t in inside if can[event[t]]}  # all of them, whatever the limit
    assert plan.settings["not_recomputable"] == len(inside - recomputed) and recomputed
    # each action acts at the activation's last forward use
    for a in plan.actions:
        assert a.event == event[a.tensor]
    # a block's output (read by the next block or the head) is its successor's input: kept
    for b in blocks:
        outputs = [t for t in np.flatnonzero(trace.movable).tolist() if trace.tensor_alloc_op[t] >= 0
                   and module_of(trace, int(trace.tensor_alloc_op[t])) == b
                   and any(not module_of(trace, op).startswith(b) for op in forward_reads(trace, t))]
        assert outputs and not set(outputs) & recomputed, b
    # nothing made outside the blocks is touched
    for t in recomputed:
        assert any(module_of(trace, int(trace.tensor_alloc_op[t])).startswith(b) for b in blocks)
    # the same plan at a tighter limit: per-block does not adapt to the limit
    assert PerBlockPlanner().plan(trace, between(trace, 0.5), PROFILE).actions == plan.actions


def test_per_block_is_infeasible_where_its_switch_would_run_out_of_memory(tiny_resnet_trace: Trace) -> None:
    """At 30 % of the way from minimum to peak, keeping every block input and what cannot be
    recomputed does not fit ResNet-14: the plan says so, and the offloading combination fits."""
    trace = tiny_resnet_trace
    limit = between(trace, 0.3)
    plan = PerBlockPlanner().plan(trace, limit, PROFILE)
    assert not plan.figures["feasible"] and plan.settings["limitation"] == PerBlockPlanner.limitation
    assert "not_applicable" not in plan.settings
    both = OffloadAllPerBlockPlanner().plan(trace, limit, PROFILE)
    assert both.figures["feasible"]


def chain_without_modules(n: int = 4) -> Trace:
    b = TraceBuilder()
    w = b.tensor(1000, Role.PARAMETER, preexisting=True)
    x = [b.tensor(4096, Role.INPUT, preexisting=True)]
    for _ in range(n):
        out = b.tensor(4096, Role.SAVED)
        b.op("aten.linear", Phase.FORWARD, reads=[x[-1], w], outputs=[out], duration=1e-3)
        b.mark_saved(out)
        x.append(out)
    g = b.tensor(1000, Role.TEMPORARY)
    b.op("aten.loss_backward", Phase.BACKWARD, reads=[x[-1]], outputs=[g], frees=[x[-1]], duration=1e-3)
    for i in range(n - 1, -1, -1):
        g2 = b.tensor(1000, Role.TEMPORARY)
        b.op("aten.linear_backward", Phase.BACKWARD, reads=[g, x[i], w], outputs=[g2],
             frees=[g] + ([x[i]] if i > 0 else []), duration=1e-3)
        g = g2
    b.free(g)
    return b.build()


def test_per_block_is_not_applicable_without_blocks(mlp_trace: Trace) -> None:
    """No module paths, or no repeated block (a two-layer MLP has leaves fc1, act, fc2 only): the empty plan,
    and why; the combination with offloading says the same."""
    bare = chain_without_modules()
    for trace, why in ((bare, "records no module paths"), (mlp_trace, "no repeated blocks")):
        for cls in (PerBlockPlanner, OffloadAllPerBlockPlanner):
            plan = cls().plan(trace, trace.peak_bytes - 1, PROFILE)  # a limit that needs a plan
            assert plan.actions == () and not plan.figures["feasible"] and why in plan.settings["not_applicable"]
            assert plan.settings["not_applicable"].startswith("not applicable: ")
            assert plan.settings["limitation"] == plan.settings["not_applicable"]


@pytest.mark.slow
def test_per_block_finds_hugging_face_decoder_layers() -> None:
    """A Llama from transformers: its decoder layers ``model.model.layers.i`` are the blocks; the rotary
    tables made outside them and each layer's output stay."""
    pytest.importorskip("transformers")
    trace = record_zoo("hf:llama", 2)
    assert block_paths(trace) == ["model.model.layers.0", "model.model.layers.1"]
    plan = PerBlockPlanner().plan(trace, between(trace, 0.5), PROFILE)
    assert plan.figures["feasible"] and plan.settings["containers"] == ["model.model.layers"]
    recomputed = {a.tensor for a in plan.actions}
    assert recomputed and all(module_of(trace, int(trace.tensor_alloc_op[t])).startswith("model.model.layers.")
                              for t in recomputed)
    rotary = [t for t in np.flatnonzero(trace.movable).tolist() if trace.tensor_alloc_op[t] >= 0
              and module_of(trace, int(trace.tensor_alloc_op[t])) == "model.model.rotary_emb"]
    assert rotary and not set(rotary) & recomputed


# ----------------------------------------------------------------------------- offload-all
@pytest.mark.parametrize("min_bytes", [0, 1024, 100_000])
def test_offload_all_swaps_every_movable_saved_tensor(tiny_resnet_trace: Trace, min_bytes: int) -> None:
    """Every tensor autograd saved that backward uses again, of at least ``min_offload_bytes``, is swapped
    once, at its last forward use; nothing else is."""
    trace = tiny_resnet_trace
    plan = OffloadAllPlanner(min_offload_bytes=min_bytes).plan(trace, between(trace, 0.5), PROFILE)
    expected = {t for t in np.flatnonzero(trace.movable).tolist()
                if trace.tensor_nbytes[t] >= min_bytes and used_after_forward(trace, t)}
    assert {a.tensor for a in plan.actions} == expected and len(plan.actions) == len(expected)
    assert all(a.kind == ActionKind.SWAP for a in plan.actions)
    for a in plan.actions:
        ops = trace.event_op[(trace.event_tensor == a.tensor) & (trace.event_kind != EventKind.FREE)]
        assert trace.event_op[a.event] == ops[trace.op_phase[ops] == Phase.FORWARD].max()
    if min_bytes == 0:  # the batch is among them: autograd saves it for the first convolution
        assert any(trace.tensor_role[t] == Role.INPUT for t in expected)
    if min_bytes == 100_000:
        assert 0 < len(expected) < plan.settings["offloaded"] + plan.settings["kept"]


def test_offload_all_plus_per_block_recomputes_inside_and_swaps_the_rest(gpt_trace: Trace) -> None:
    trace = gpt_trace
    limit = between(trace, 0.5)
    per_block = PerBlockPlanner().plan(trace, limit, PROFILE)
    alone = OffloadAllPlanner().plan(trace, limit, PROFILE)
    both = OffloadAllPerBlockPlanner().plan(trace, limit, PROFILE)
    recomputed = {a.tensor for a in both.actions if a.kind == ActionKind.RECOMPUTE}
    swapped = {a.tensor for a in both.actions if a.kind == ActionKind.SWAP}
    assert recomputed == {a.tensor for a in per_block.actions}
    assert swapped == {a.tensor for a in alone.actions} - recomputed and swapped
    assert both.settings["offloaded"] == len(swapped) and both.settings["recomputed"] == len(recomputed)
    # the kept block inputs go to the host: each block's output is swapped
    kept_outputs = [t for t in swapped if module_of(trace, int(trace.tensor_alloc_op[t])) in ("blocks.0", "blocks.1")]
    assert kept_outputs


# ----------------------------------------------------------------------------- knapsack
def brute_force(weights: list[int], values: list[float], capacity: int) -> float:
    best = 0.0
    for r in range(len(weights) + 1):
        for subset in itertools.combinations(range(len(weights)), r):
            if sum(weights[i] for i in subset) <= capacity:
                best = max(best, sum(values[i] for i in subset))
    return best


def test_dp_knapsack_is_the_optimum_of_the_0_1_knapsack() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 8)
        weights = [rng.randint(0, 12) for _ in range(n)]
        values = [rng.choice([0.0, 0.5, 1.0, 2.0, 3.5]) for _ in range(n)]
        capacity = rng.randint(0, 30)
        taken = dp_knapsack(weights, values, capacity)
        assert sum(w for w, t in zip(weights, taken) if t) <= capacity
        assert sum(v for v, t in zip(values, taken) if t) == pytest.approx(brute_force(weights, values, capacity))


def test_solvers_agree_with_torch_compile() -> None:
    """Same choice as torch's greedy, same optimum as torch's dp (weights whole numbers, so no rounding)."""
    from torch._functorch._activation_checkpointing import knapsack as torch_knapsack

    rng = random.Random(1)
    for _ in range(50):
        n = rng.randint(1, 7)
        weights = [rng.randint(1, 5) for _ in range(n)]
        values = [float(rng.randint(1, 9)) for _ in range(n)]
        capacity = rng.randint(0, 12)
        _, saved, _ = torch_knapsack.greedy_knapsack([float(w) for w in weights], values, float(capacity))
        assert sorted(np.flatnonzero(greedy_knapsack(weights, values, capacity)).tolist()) == sorted(saved)
        best, _, _ = torch_knapsack.dp_knapsack([float(w) for w in weights], values, float(capacity))
        taken = dp_knapsack(weights, values, capacity)
        assert sum(v for v, t in zip(values, taken) if t) == pytest.approx(best)


def test_quantised_knapsack_stays_within_the_budget_in_bytes() -> None:
    """Sizes rounded to 100 steps: the saved set never exceeds the budget in bytes, and where every
    item fits, every item is saved (rounding must not drop one)."""
    rng = random.Random(2)
    for _ in range(100):
        n = rng.randint(1, 9)
        weights = np.array([rng.randint(1, 5_000_000) for _ in range(n)])
        values = np.array([rng.uniform(0.1, 3.0) for _ in range(n)])
        budget = rng.randint(0, int(weights.sum()) + 10)
        taken = dp_in_bytes(weights, values, budget, 100)
        assert weights[taken].sum() <= budget
        if weights.sum() <= budget:
            assert taken.all()
    steps, unit = quantise(np.array([149, 150, 151, 0]), 4)
    assert unit == 113 and steps.tolist() == [1, 1, 1, 0]


def small_chain(sizes: list[int], fwd: list[float]) -> Trace:
    """A chain ``x_{i+1} = f_i(x_i)`` with small tensors (whole-byte knapsack), backward in reverse."""
    n = len(fwd)
    b = TraceBuilder()
    w = b.tensor(64, Role.PARAMETER, preexisting=True)
    x = [b.tensor(sizes[0], Role.INPUT, preexisting=True)]
    for i in range(n):
        out = b.tensor(sizes[i + 1], Role.SAVED)
        b.op("aten.linear", Phase.FORWARD, reads=[x[-1], w], outputs=[out], duration=fwd[i])
        b.mark_saved(out)
        x.append(out)
    g = b.tensor(8, Role.TEMPORARY)
    b.op("aten.loss_backward", Phase.BACKWARD, reads=[x[n]], outputs=[g], frees=[x[n]], duration=1e-3)
    for i in range(n - 1, -1, -1):
        g2 = b.tensor(8, Role.TEMPORARY)
        b.op("aten.linear_backward", Phase.BACKWARD, reads=[g, x[i], w], outputs=[g2],
             frees=[g] + ([x[i]] if i > 0 else []), duration=1e-3)
        g = g2
    b.free(g)
    return b.build()


@pytest.mark.parametrize("fraction", [0.8, 0.5, 0.2])
def test_knapsack_planner_saves_the_optimal_set_under_its_budget(fraction: float) -> None:
    """On a tiny chain the recompute set is the complement of the brute-force optimum: the saved
    activations held across the peak maximise their producers' time within the budget in bytes."""
    trace = small_chain([96, 160, 224, 96, 320, 128, 64], [1e-3, 5e-3, 2e-3, 7e-3, 1e-3, 3e-3])
    limit = between(trace, fraction)
    planner = KnapsackPlanner(budget_search=False)
    plan = planner.plan(trace, limit, PROFILE)
    facts = TraceFacts(trace)
    can = Evaluator(trace, limit, PROFILE).can_recompute[facts.act_event]
    held = held_at(facts, trace.peak_op)
    items = np.flatnonzero(held & can)
    assert plan.settings["items"] == len(items) >= 4
    weights = facts.act_bytes[items].tolist()
    values = trace.op_duration[facts.act_alloc_op[items]].tolist()
    budget = plan.settings["item_budget_bytes"]
    assert budget == limit - (int(trace.op_memory[trace.peak_op]) - int(facts.act_bytes[held].sum())) \
        - int(facts.act_bytes[held & ~can].sum())
    recomputed = {a.tensor for a in plan.actions}
    assert all(a.kind == ActionKind.RECOMPUTE for a in plan.actions)
    saved = [k for k, i in enumerate(items) if int(facts.act_tensor[i]) not in recomputed]
    assert recomputed <= set(facts.act_tensor[items].tolist())
    assert sum(weights[k] for k in saved) <= budget
    assert sum(values[k] for k in saved) == pytest.approx(brute_force(weights, values, budget))
    assert plan.figures == simulate(trace, plan).figures()


def test_knapsack_recomputes_more_as_the_limit_falls(gpt_trace: Trace) -> None:
    counts = [KnapsackPlanner().plan(gpt_trace, between(gpt_trace, f), PROFILE).n_recompute
              for f in (1.0, 0.7, 0.4, 0.1)]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] > counts[1]


def test_knapsack_lowers_the_budget_until_the_step_fits(tiny_resnet_trace: Trace) -> None:
    """At 70 % the full budget's plan does not fit (the re-runs move the peak); a lower one does."""
    trace = tiny_resnet_trace
    limit = between(trace, 0.7)
    once = KnapsackPlanner(budget_search=False).plan(trace, limit, PROFILE)
    searched = KnapsackPlanner().plan(trace, limit, PROFILE)
    assert not once.figures["feasible"] and once.settings["budget_fraction"] == 1.0
    assert searched.figures["feasible"] and searched.settings["budget_fraction"] < 1.0
    assert searched.n_recompute > once.n_recompute


def test_knapsack_greedy_solver_plans_too(gpt_trace: Trace) -> None:
    plan = KnapsackPlanner(solver="greedy").plan(gpt_trace, between(gpt_trace, 0.5), PROFILE)
    assert plan.figures["feasible"] and plan.n_recompute and plan.settings["solver"] == "greedy"

