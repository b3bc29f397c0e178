"""Tests of the planned-execution runtime (``dqn_swap.runtime``) on the CPU.

Exactness: after 3 optimizer steps the parameters and losses of planned training equal
those of unplanned training.  Swap plans must be bit-identical (a copy round trip is
exact).  Recompute re-runs the same kernels on the same inputs with the same RNG state,
which is bit-identical on the CPU as well; the stated tolerance for recompute is
``rtol=1e-5, atol=1e-6`` (floating-point reassociation, e.g. a different CUDA kernel
choice), and the CPU tests check both.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import pytest
import torch

from dqn_swap.models import build_workload
from dqn_swap.plan import Action, ActionKind, Plan, PlanError
from dqn_swap.recorder import record_trace
from dqn_swap.runtime import (PlannedExecution, PlannedOutOfMemoryError, TraceMismatchError, build_index,
                              make_plan, saved_activations)
from dqn_swap.trace import Role, Trace

RECOMPUTE_RTOL, RECOMPUTE_ATOL = 1e-5, 1e-6
STEPS = 3
BATCH = {"mlp_tiny": 4, "resnet_tiny": 2, "gpt_tiny": 2, "lstm": 1}

Result = tuple[list[torch.Tensor], list[torch.Tensor], "PlannedExecution | None"]


@lru_cache(maxsize=None)
def trace_of(name: str) -> Trace:
    """The trace of ``name`` recorded on a separate model instance (recording trains it)."""
    w = build_workload(name, BATCH[name], "cpu", seed=0)
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="cpu")


def train(name: str, plan: Plan | None = None, trace: Trace | None = None, steps: int = STEPS,
          **runtime_kwargs: object) -> Result:
    w = build_workload(name, BATCH[name], "cpu", seed=0)
    opt = w.make_optimizer(w.model.parameters())
    rt = PlannedExecution(w.model, plan, trace or trace_of(name), **runtime_kwargs) if plan is not None else None
    torch.manual_seed(1234)  # dropout draws the same masks in every run
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if rt is None:
            loss = w.loss_fn(w.model(*w.example_inputs))
            loss.backward()
        else:
            with rt:
                loss = w.loss_fn(w.model(*w.example_inputs))
                loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return [p.detach().clone() for p in w.model.parameters()], losses, rt


@lru_cache(maxsize=None)
def reference(name: str) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    params, losses, _ = train(name)
    return tuple(params), tuple(losses)


def assert_bit_identical(name: str, params: list[torch.Tensor], losses: list[torch.Tensor]) -> None:
    ref_params, ref_losses = reference(name)
    for a, b in zip(ref_losses, losses):
        assert torch.equal(a, b), f"{name}: loss {b.item()} != unplanned {a.item()}"
    for i, (a, b) in enumerate(zip(ref_params, params)):
        assert torch.equal(a, b), f"{name}: parameter {i} differs by {(a - b).abs().max().item()}"


def assert_close(name: str, params: list[torch.Tensor], losses: list[torch.Tensor]) -> None:
    ref_params, ref_losses = reference(name)
    torch.testing.assert_close(list(losses), list(ref_losses), rtol=RECOMPUTE_RTOL, atol=RECOMPUTE_ATOL)
    torch.testing.assert_close(list(params), list(ref_params), rtol=RECOMPUTE_RTOL, atol=RECOMPUTE_ATOL)


def every(k: int, offset: int = 0) -> Callable[[Trace], list[int]]:
    return lambda trace: saved_activations(trace)[offset::k]


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "gpt_tiny", "lstm"])
def test_swap_only_is_bit_identical(name: str) -> None:
    trace = trace_of(name)
    acts = saved_activations(trace)
    params, losses, rt = train(name, make_plan(trace, swap=acts))
    assert rt is not None and rt.stats is not None
    assert rt.stats.swapped == len(acts) and rt.stats.packed == len(trace.saved)
    assert rt.stats.prefetches + rt.stats.on_demand_fetches >= len(acts) - 1
    assert rt.stats.held_bytes == 0  # everything handed back after backward
    assert_bit_identical(name, params, losses)


# Removing every other activation keeps recomputation chains short (the simulator's transient
# re-creation of removed inputs is quadratic in the chain length); recompute-all is below.
@pytest.mark.parametrize("name,pick", [("mlp_tiny", every(1)), ("resnet_tiny", every(2)), ("gpt_tiny", every(2)),
                                       ("lstm", every(4))])
def test_recompute_only_matches(name: str, pick: Callable[[Trace], list[int]]) -> None:
    trace = trace_of(name)
    targets = pick(trace)
    params, losses, rt = train(name, make_plan(trace, recompute=targets))
    assert rt is not None and rt.stats is not None
    assert rt.stats.recompute_removed == len(targets) and rt.stats.recomputed >= 1 and rt.stats.replayed_ops >= 1
    assert_close(name, params, losses)
    assert_bit_identical(name, params, losses)  # same kernels, same inputs, same RNG state on the CPU


@pytest.mark.parametrize("name", ["resnet_tiny", "gpt_tiny", "lstm"])
def test_mixed_plan_matches(name: str) -> None:
    trace = trace_of(name)
    k = 6 if name == "lstm" else 2
    swap, recompute = every(k, 0)(trace), every(k, 1)(trace)
    params, losses, rt = train(name, make_plan(trace, swap=swap, recompute=recompute))
    assert rt is not None and rt.stats is not None
    assert rt.stats.swapped == len(swap) and rt.stats.recompute_removed == len(recompute)
    assert_close(name, params, losses)
    assert_bit_identical(name, params, losses)


def test_gpt_dropout_is_recomputed_with_the_forward_masks() -> None:
    """Recompute the dropout outputs themselves: a new RNG draw would change the loss at once."""
    trace = trace_of("gpt_tiny")
    random_ops = {"aten.native_dropout", "aten.bernoulli_", "aten.bernoulli"}  # CUDA fuses, the CPU decomposes
    writes = trace.event_kind == 1  # EventKind.WRITE
    written_by_random = {int(t) for t, op in zip(trace.event_tensor[writes], trace.event_op[writes])
                         if trace.op_names[trace.op_name[op]] in random_ops}
    dropout = [t for t in saved_activations(trace) if t in written_by_random]
    assert dropout, "gpt_tiny trains with dropout"
    params, losses, rt = train("gpt_tiny", make_plan(trace, recompute=dropout))
    assert rt is not None and rt.stats is not None and rt.stats.recomputed >= len(dropout)
    assert_bit_identical("gpt_tiny", params, losses)


def test_recompute_all_with_kept_inputs_matches_and_replays_less() -> None:
    trace = trace_of("gpt_tiny")
    plan = make_plan(trace, recompute=saved_activations(trace))
    params, losses, kept = train("gpt_tiny", plan, keep_recomputed_inputs=True)
    assert_bit_identical("gpt_tiny", params, losses)
    _, _, transient = train("gpt_tiny", plan, steps=1)
    assert kept is not None and transient is not None
    assert kept.stats is not None and transient.stats is not None
    assert kept.stats.replayed_ops < transient.stats.replayed_ops


def test_baseline_planner_plan_runs_exactly() -> None:
    baselines = pytest.importorskip("agents.baselines")
    from dqn_swap.cost import get_profile

    trace = trace_of("resnet_tiny")
    plan = baselines.get_planner("lru").plan(trace, int(trace.peak_bytes * 0.6), get_profile("v100-pcie3"))
    assert plan.n_swap + plan.n_recompute > 0
    params, losses, _ = train("resnet_tiny", plan)
    assert_close("resnet_tiny", params, losses)


# --------------------------------------------------------------------------- memory
@pytest.mark.parametrize("kind", ["swap", "recompute"])
def test_removed_activations_are_released_after_forward(kind: str) -> None:
    trace = trace_of("resnet_tiny")
    acts = saved_activations(trace)
    plan = make_plan(trace, **{kind: acts})
    w = build_workload("resnet_tiny", BATCH["resnet_tiny"], "cpu", seed=0)
    rt = PlannedExecution(w.model, plan, trace, track_storages=True)
    with rt:
        loss = w.loss_fn(w.model(*w.example_inputs))
        it = rt._it
        assert it is not None
        refs = it.stats.source_refs
        assert len(refs) == len(acts)
        alive = [r for r in refs if not r.expired()]
        assert not alive, f"{len(alive)} of {len(refs)} removed activations are still allocated after forward"
        # The runtime holds only what it already prefetched for the start of backward.
        prefetched = sum(g.nbytes for t, _ in it.stats.prefetch_log for g in it.groups_by_tid[t])
        assert it.stats.held_bytes == prefetched
        loss.backward()
    removed = rt.stats.swapped_bytes if kind == "swap" else rt.stats.recompute_removed_bytes
    assert removed == sum(int(trace.tensor_nbytes[t]) for t in acts)


def test_kept_activations_stay_allocated_until_backward() -> None:
    """Control for the test above: without a plan autograd keeps them."""
    trace = trace_of("resnet_tiny")
    empty = make_plan(trace)
    w = build_workload("resnet_tiny", BATCH["resnet_tiny"], "cpu", seed=0)
    from torch.multiprocessing.reductions import StorageWeakRef

    refs: list[StorageWeakRef] = []
    rt = PlannedExecution(w.model, empty, trace)
    with rt, torch.autograd.graph.saved_tensors_hooks(lambda t: refs.append(StorageWeakRef(t.untyped_storage()))
                                                      or t, lambda t: t):
        loss = w.loss_fn(w.model(*w.example_inputs))
        assert refs and all(not r.expired() for r in refs)
        loss.backward()


def test_host_buffers_are_pooled_across_iterations() -> None:
    trace = trace_of("resnet_tiny")
    acts = saved_activations(trace)
    _, _, rt = train("resnet_tiny", make_plan(trace, swap=acts))
    assert rt is not None
    assert rt.pool.allocations == len(acts)  # the first iteration allocates, later ones reuse
    assert rt.pool.reuses == (STEPS - 1) * len(acts)


def test_prefetches_are_issued_earliest_reused_first() -> None:
    trace = trace_of("gpt_tiny")
    acts = saved_activations(trace)
    plan = make_plan(trace, swap=acts)
    _, _, rt = train("gpt_tiny", plan, steps=1)
    assert rt is not None and rt.stats is not None
    index = rt.index
    tids = [t for t, _ in rt.stats.prefetch_log]
    uses = [int(index.first_backward_read[t]) for t in tids]
    assert uses == sorted(uses)
    for t, at in rt.stats.prefetch_log:  # issued at or after its scheduled op, never after its reuse
        assert index.prefetch_op[t] <= at <= index.first_backward_read[t]
    assert rt.stats.prefetches == len(tids) and len(tids) >= len(acts) - 1


def test_prefetch_schedule_respects_the_limit_when_it_can() -> None:
    trace = trace_of("resnet_tiny")
    acts = saved_activations(trace)
    loose = build_index(trace, make_plan(trace, swap=acts, memory_limit=trace.peak_bytes * 10))
    tight = build_index(trace, make_plan(trace, swap=acts, memory_limit=int(trace.peak_bytes * 0.5)))
    b0 = loose.first_backward_op
    assert all(loose.prefetch_op[t] == b0 for t in loose.prefetch_order)  # memory allows it at once
    def total(index: object) -> int:
        return sum(index.prefetch_op[t] for t in index.prefetch_order)  # type: ignore[attr-defined]

    assert total(tight) > total(loose)  # a tight limit delays prefetches
    for t in tight.prefetch_order:
        assert b0 <= tight.prefetch_op[t] <= tight.first_backward_read[t]


# --------------------------------------------------------------------------- errors
def test_changed_batch_size_raises_a_clear_error() -> None:
    trace = trace_of("resnet_tiny")
    plan = make_plan(trace, swap=saved_activations(trace))
    w = build_workload("resnet_tiny", 3, "cpu", seed=0)  # recorded at batch 2
    rt = PlannedExecution(w.model, plan, trace)
    with pytest.raises(TraceMismatchError, match="record the trace again"):
        with rt:
            w.loss_fn(w.model(*w.example_inputs)).backward()
    with pytest.raises(TraceMismatchError, match="saved tensor #0"):
        with rt:
            w.loss_fn(w.model(*w.example_inputs)).backward()


def test_other_model_raises_a_clear_error() -> None:
    trace = trace_of("mlp_tiny")
    plan = make_plan(trace, recompute=saved_activations(trace))
    w = build_workload("resnet_tiny", 2, "cpu", seed=0)
    rt = PlannedExecution(w.model, plan, trace)
    with pytest.raises(TraceMismatchError, match="trace"):
        with rt:
            w.loss_fn(w.model(*w.example_inputs)).backward()


def test_fewer_saved_tensors_than_recorded_raises_at_exit() -> None:
    trace = trace_of("mlp_tiny")
    plan = make_plan(trace, swap=saved_activations(trace))
    w = build_workload("mlp_tiny", BATCH["mlp_tiny"], "cpu", seed=0)
    rt = PlannedExecution(w.model, plan, trace)
    with pytest.raises(TraceMismatchError, match=r"saved \d tensors in this iteration, the trace recorded 6"):
        with rt:
            x = w.example_inputs[0]
            w.model[1](w.model[0](x)).sum().backward()  # half the model: fewer saves


def test_plan_for_another_trace_is_refused() -> None:
    plan = make_plan(trace_of("mlp_tiny"))
    with pytest.raises(PlanError, match="made for trace"):
        PlannedExecution(None, plan, trace_of("resnet_tiny"))


def test_out_of_memory_error_names_op_plan_and_memory() -> None:
    trace = trace_of("mlp_tiny")
    plan = make_plan(trace, swap=saved_activations(trace), planner="hand")
    w = build_workload("mlp_tiny", BATCH["mlp_tiny"], "cpu", seed=0)
    rt = PlannedExecution(w.model, plan, trace)
    with pytest.raises(PlannedOutOfMemoryError) as info:
        with rt:
            loss = w.loss_fn(w.model(*w.example_inputs))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    msg = str(info.value)
    assert "planner 'hand'" in msg and "saved tensor #5" in msg and "Tried to allocate" in msg
    assert "runtime holds" in msg
    assert isinstance(info.value, torch.OutOfMemoryError)
    del loss


def test_actions_the_runtime_cannot_follow_are_reported() -> None:
    trace = trace_of("mlp_tiny")
    never_saved = next(t for t in range(trace.n_tensors)
                       if trace.tensor_saved_index[t] < 0 and trace.tensor_alloc_op[t] >= 0
                       and trace.tensor_role[t] == Role.TEMPORARY)
    ev = int(np.flatnonzero(trace.event_tensor == never_saved)[0])
    plan = Plan(actions=(Action(ev, never_saved, ActionKind.SWAP),), memory_limit=trace.peak_bytes,
                trace_fingerprint=trace.fingerprint, profile="", planner="hand")
    with pytest.warns(RuntimeWarning, match="cannot carry them out"):
        rt = PlannedExecution(None, plan, trace)
    assert len(rt.index.unsupported) == 1


def test_wrap_and_backward_outside_the_block() -> None:
    trace = trace_of("mlp_tiny")
    plan = make_plan(trace, swap=saved_activations(trace)[:1], recompute=saved_activations(trace)[1:])
    w = build_workload("mlp_tiny", BATCH["mlp_tiny"], "cpu", seed=0)
    rt = PlannedExecution(w.model, plan, trace)
    forward = rt.wrap(lambda: w.loss_fn(w.model(*w.example_inputs)))
    loss = forward()
    loss.backward()  # saved-tensor handles work after the block too
    grads = [p.grad.clone() for p in w.model.parameters()]
    w2 = build_workload("mlp_tiny", BATCH["mlp_tiny"], "cpu", seed=0)
    w2.loss_fn(w2.model(*w2.example_inputs)).backward()
    for a, b in zip(grads, (p.grad for p in w2.model.parameters())):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="already active"):
        with rt, rt:
            pass


# --------------------------------------------------------------------------- training script
def test_run_planned_training_on_cpu(tmp_path: object) -> None:
    from dqn_swap.runtime.training import run_planned_training

    report = run_planned_training("mlp_tiny", 4, 0.5, "swap-all", steps=2, device="cpu")
    methods = report["methods"]
    assert {m: r["status"] for m, r in methods.items()} == {
        "unplanned": "ok", "planned": "ok", "checkpoint": "ok", "save_on_cpu": "ok"}
    assert methods["planned"]["losses"] == methods["unplanned"]["losses"]
    assert methods["save_on_cpu"]["losses"] == methods["unplanned"]["losses"]
    assert methods["planned"]["runtime"]["swap_tensors"] == 2
    assert report["memory_limit"] == int(0.5 * report["unplanned_peak_bytes"])
    assert "throughput_vs_unplanned" in report["comparison"]
    json.dumps(report, default=str)


def test_largest_batch_is_predicted_without_a_gpu() -> None:
    from dqn_swap.runtime.training import largest_batch

    trace = trace_of("mlp_tiny")
    per_sample = trace.peak_bytes  # a budget a little above batch 4's peak
    r = largest_batch("mlp_tiny", per_sample, "unplanned", torch.device("cpu"), cap=64)
    assert r["how"] == "predicted" and r["batch_size"] is not None and r["batch_size"] >= 4
    assert largest_batch("mlp_tiny", per_sample, "checkpoint", torch.device("cpu"))["batch_size"] is None


def test_script_writes_json(tmp_path: object) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "run_planned_training.py"
    spec = importlib.util.spec_from_file_location("run_planned_training_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = Path(str(tmp_path)) / "report.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert module.main(["mlp_tiny", "--batch-size", "4", "--limit", "50%", "--planner", "swap-all",
                            "--steps", "1", "--device", "cpu", "--methods", "unplanned,planned",
                            "--out", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert data["methods"]["planned"]["status"] == "ok"
