"""The planned-execution runtime on a CUDA GPU; skipped without one.

Same exactness checks as ``test_runtime.py`` with traces recorded on the GPU, plus the
CUDA-only parts: side-stream copies into pinned pooled buffers, device memory released
once the copy completed, prefetch on its own stream, and the measured peak allocated
staying at or below the plan's limit.  Swap must be bit-identical; recompute within
``rtol=1e-5, atol=1e-6`` (cuDNN/cuBLAS may pick another kernel for a re-run).
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from dqn_swap.models import build_workload  # noqa: E402
from dqn_swap.plan import Plan  # noqa: E402
from dqn_swap.recorder import record_trace  # noqa: E402
from dqn_swap.runtime import PlannedExecution, make_plan, saved_activations  # noqa: E402
from dqn_swap.trace import Trace  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
BATCH = {"resnet_tiny": 8, "gpt_tiny": 4, "lstm": 2, "resnet18": 16}
DEVICE = "cuda"


@lru_cache(maxsize=None)
def trace_of(name: str) -> Trace:
    w = build_workload(name, BATCH[name], DEVICE, seed=0)
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device=DEVICE, iterations=2)
    del w
    torch.cuda.empty_cache()
    return trace


def train(name: str, plan: Plan | None, steps: int = 3) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                                                   PlannedExecution | None]:
    w = build_workload(name, BATCH[name], DEVICE, seed=0)
    opt = w.make_optimizer(w.model.parameters())
    rt = PlannedExecution(w.model, plan, trace_of(name)) if plan is not None else None
    torch.manual_seed(1234)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with (rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)):
            loss = w.loss_fn(w.model(*w.example_inputs))
            loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    torch.cuda.synchronize()
    return [p.detach().clone() for p in w.model.parameters()], losses, rt


@lru_cache(maxsize=None)
def reference(name: str) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    params, losses, _ = train(name, None)
    return tuple(params), tuple(losses)


@pytest.mark.parametrize("name", ["resnet_tiny", "gpt_tiny", "lstm"])
def test_swap_is_bit_identical_on_cuda(name: str) -> None:
    trace = trace_of(name)
    params, losses, rt = train(name, make_plan(trace, swap=saved_activations(trace)))
    ref_params, ref_losses = reference(name)
    assert all(torch.equal(a, b) for a, b in zip(ref_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(ref_params, params))
    assert rt is not None and rt.stats is not None and rt.stats.swapped > 0
    assert rt.pool.reuses > 0  # pinned buffers pooled across iterations
    for buf, _ in (b for bufs in rt.pool._free.values() for b in bufs):
        assert buf.is_pinned()


@pytest.mark.parametrize("name,mixed", [("resnet_tiny", False), ("gpt_tiny", False), ("gpt_tiny", True),
                                        ("lstm", True)])
def test_recompute_and_mixed_match_on_cuda(name: str, mixed: bool) -> None:
    trace = trace_of(name)
    acts = saved_activations(trace)
    k = 4 if name == "lstm" else 2
    plan = make_plan(trace, swap=acts[0::k] if mixed else (), recompute=acts[1::k])
    params, losses, _ = train(name, plan)
    ref_params, ref_losses = reference(name)
    torch.testing.assert_close(list(losses), list(ref_losses), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(list(params), list(ref_params), rtol=RTOL, atol=ATOL)


def test_swapped_memory_is_released_after_the_copy() -> None:
    trace = trace_of("resnet_tiny")
    acts = saved_activations(trace)
    w = build_workload("resnet_tiny", BATCH["resnet_tiny"], DEVICE, seed=0)
    rt = PlannedExecution(w.model, make_plan(trace, swap=acts), trace, prefetch=False, track_storages=True)
    with rt:
        loss = w.loss_fn(w.model(*w.example_inputs))
        it = rt._it
        assert it is not None
        torch.cuda.synchronize()  # test only: let every copy complete, then poll
        it.poll()
        assert it.stats.held_bytes == 0 and it.stats.released_after_copy == len(acts)
        assert all(r.expired() for r in it.stats.source_refs)
        loss.backward()
    assert rt.stats is not None and rt.stats.on_demand_fetches == len(acts)


def test_expandable_segments_are_on() -> None:
    trace = trace_of("resnet_tiny")
    rt = PlannedExecution(None, make_plan(trace), trace, device=DEVICE)
    assert rt.expandable_segments


def test_peak_allocated_stays_under_the_limit() -> None:
    baselines = pytest.importorskip("agents.baselines")
    from dqn_swap.cost import measure_profile
    from dqn_swap.simulator import simulate

    name = "resnet18"
    w = build_workload(name, BATCH[name], DEVICE, seed=0)
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device=DEVICE, iterations=2)
    del w
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    limit = int(0.6 * trace.peak_bytes)
    plan = baselines.get_planner("greedy").plan(trace, limit, measure_profile())
    if not simulate(trace, plan).feasible:
        pytest.skip("the planner found no feasible plan at 60%")
    w = build_workload(name, BATCH[name], DEVICE, seed=0)
    opt = w.make_optimizer(w.model.parameters())
    rt = PlannedExecution(w.model, plan, trace)
    for i in range(3):
        if i == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        with rt:
            w.loss_fn(w.model(*w.example_inputs)).backward()
        opt.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= limit * 1.02 + 2 * 1024**2, f"peak {peak} above limit {limit}"
