"""The planned-execution runtime on a CUDA GPU; skipped without one.

The exactness checks of ``test_runtime.py`` with traces recorded on the GPU, plus what only
CUDA has: side-stream copies into pinned pooled buffers, device memory released once the
copy completed, prefetch on its own stream, the in-flight bound, and the measured peak
allocated staying under the plan's limit.  Swap must be bit-identical (a copy round trip);
recompute within ``rtol=1e-5, atol=1e-6`` (cuDNN or cuBLAS may pick another algorithm for
a re-run, which reassociates sums), and the whole state and optimizer state are compared.

Unplanned CUDA training is not reproducible by default: cuDNN's convolution backward and other
kernels add with atomics, so two unplanned runs of a CNN differ in the last bits after a step.
The comparisons therefore run under deterministic algorithms (``torch.use_deterministic_algorithms``,
cuDNN deterministic, ``CUBLAS_WORKSPACE_CONFIG``), and the premise itself is a test: unplanned
training reproduces itself bit for bit.
"""

from __future__ import annotations

import os
from functools import lru_cache

# cuBLAS reads it when its first handle is made: set before any test touches the GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from dqn_swap.models import build_workload  # noqa: E402
from dqn_swap.plan import Plan  # noqa: E402
from dqn_swap.recorder import record_trace  # noqa: E402
from dqn_swap.planners import manual_plan, recomputable_activations, saved_activations  # noqa: E402
from dqn_swap.runtime import PlannedExecution  # noqa: E402
from dqn_swap.trace import Trace  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(autouse=True, scope="module")
def deterministic():  # noqa: ANN201
    """Deterministic kernels for this module's tests (``warn_only``: an op without a deterministic
    CUDA kernel warns, and the reproducibility test below shows whether it mattered)."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]
BATCH = {"resnet_tiny": 8, "gpt_tiny": 4, "lstm_short": 2, "resnet18": 16}
DEVICE = "cuda"


@lru_cache(maxsize=None)
def trace_of(name: str) -> Trace:
    w = build_workload(name, BATCH[name], DEVICE, seed=0)
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device=DEVICE, iterations=2)
    del w
    torch.cuda.empty_cache()
    return trace


def train(name: str, plan: Plan | None, steps: int = 3) -> tuple[list[torch.Tensor], dict, dict,
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
    state = {k: v.detach().clone() for k, v in w.model.state_dict().items()}
    return losses, state, opt.state_dict(), rt


@lru_cache(maxsize=None)
def reference(name: str):  # noqa: ANN201
    return train(name, None)


def compare(name: str, got, exact: bool) -> None:  # noqa: ANN001
    ref_losses, ref_state, ref_opt, _ = reference(name)
    losses, state, opt_state, _ = got
    check = (lambda a, b: torch.equal(a, b)) if exact else (
        lambda a, b: torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL))
    assert all(check(a, b) for a, b in zip(ref_losses, losses)), f"{name}: losses differ"
    for key in ref_state:
        a, b = ref_state[key], state[key]
        assert (torch.equal(a, b) if not a.is_floating_point() else check(a, b)), f"{name}: {key} differs"
    for pid, entry in ref_opt["state"].items():
        for k, v in entry.items():
            if isinstance(v, torch.Tensor):
                w = opt_state["state"][pid][k]
                assert (torch.equal(v, w) if not v.is_floating_point() else check(v, w)), f"{name}: opt {pid}/{k}"


@pytest.mark.parametrize("name", ["resnet_tiny", "gpt_tiny", "lstm_short"])
def test_unplanned_training_reproduces_itself_on_cuda(name: str) -> None:
    compare(name, train(name, None), exact=True)  # the premise of every comparison here


@pytest.mark.parametrize("name", ["resnet_tiny", "gpt_tiny", "lstm_short"])
def test_swap_is_bit_identical_on_cuda(name: str) -> None:
    trace = trace_of(name)
    got = train(name, manual_plan(trace, swap=saved_activations(trace)))
    compare(name, got, exact=True)
    rt = got[3]
    assert rt is not None and rt.stats is not None and rt.stats.swapped > 0
    assert rt.pool.reuses > 0  # pinned buffers pooled across iterations
    for buf, _ in (b for bufs in rt.pool._free.values() for b in bufs):
        # an empty buffer (cuDNN batch norm's empty reserve space, swapped by this swap-everything
        # plan) allocates nothing, so there is nothing to pin
        assert buf.is_pinned() or buf.numel() == 0


@pytest.mark.parametrize("name,mixed", [("resnet_tiny", False), ("gpt_tiny", False), ("gpt_tiny", True),
                                        ("lstm_short", True)])
def test_recompute_and_mixed_match_on_cuda(name: str, mixed: bool) -> None:
    trace = trace_of(name)
    rec = recomputable_activations(trace)
    swap = [t for t in saved_activations(trace) if t not in rec[1::2]] if mixed else ()
    plan = manual_plan(trace, swap=swap, recompute=rec[1::2])
    compare(name, train(name, plan), exact=False)


def test_swapped_memory_is_released_after_the_copy() -> None:
    trace = trace_of("resnet_tiny")
    # activations made in the forward pass (a swapped input's storage stays the caller's: emptied, not freed)
    acts = [t for t in saved_activations(trace) if trace.tensor_alloc_op[t] >= 0]
    w = build_workload("resnet_tiny", BATCH["resnet_tiny"], DEVICE, seed=0)
    rt = PlannedExecution(w.model, manual_plan(trace, swap=acts), trace, prefetch=False, track_storages=True,
                          max_inflight_bytes=10**12)
    with rt:
        loss = w.loss_fn(w.model(*w.example_inputs))
        it = rt._it
        assert it is not None
        torch.cuda.synchronize()  # test only: let every copy complete, then poll
        rt.swapper.poll()
        assert rt.swapper.held_bytes == 0
        assert all(r.expired() for r in it.stats.source_refs)
        loss.backward()
    assert rt.stats is not None and rt.stats.on_demand_fetches == len(acts)


def test_copies_in_flight_are_bounded_on_cuda() -> None:
    trace = trace_of("resnet_tiny")
    plan = manual_plan(trace, swap=saved_activations(trace))
    w = build_workload("resnet_tiny", BATCH["resnet_tiny"], DEVICE, seed=0)
    largest = max(int(trace.tensor_nbytes[a.tensor]) for a in plan.actions)
    rt = PlannedExecution(w.model, plan, trace, max_inflight_bytes=largest)
    with rt:
        w.loss_fn(w.model(*w.example_inputs)).backward()
    assert rt.swapper.max_inflight_seen <= largest


def test_expandable_segments_are_on() -> None:
    trace = trace_of("resnet_tiny")
    rt = PlannedExecution(None, manual_plan(trace), trace, device=DEVICE)
    assert rt.expandable_segments


def test_peak_allocated_stays_under_the_limit() -> None:
    from dqn_swap.agents import get_planner
    from dqn_swap.cost import measure_profile
    from dqn_swap.simulator import simulate

    name = "resnet18"
    w = build_workload(name, BATCH[name], DEVICE, seed=0)
    # recorded with the measured profile: the trace carries its figures, so the plan can be simulated
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device=DEVICE, iterations=2,
                         profile=measure_profile())
    del w
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    # the tightest of these limits greedy meets: what the test measures is the runtime, not the planner
    for fraction in (0.6, 0.7, 0.8, 0.9):
        limit = int(fraction * trace.peak_bytes)
        plan = get_planner("greedy").plan(trace, limit)
        if simulate(trace, plan).feasible and plan.actions:
            break
    else:
        raise AssertionError("greedy found no plan with actions from 60% to 90% of the peak")
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


def test_a_device_limit_holds_the_measured_peak_with_the_workspaces_beside_it() -> None:
    """A limit in bytes is the device's: cuBLAS's workspaces and whatever else the device held as the
    iteration was recorded (``Trace.outside_bytes``) come off it before planning, and the peak the
    allocator measures, which counts them, stays under it."""
    from dqn_swap.integrations.experiment import _profile, record, run_planned_training

    device = torch.device("cuda")
    trace = record("gpt_tiny", 8, device, _profile(None, device), 0)
    assert trace.outside_bytes > 0  # cuBLAS's workspaces at least
    assert trace.meta["outside_blocks"] and min(trace.meta["outside_blocks"]) > 0  # what they are, by size
    limit = trace.outside_bytes + (trace.minimum_memory + trace.peak_bytes) // 2  # halfway, in device bytes
    report = run_planned_training("gpt_tiny", 8, limit, "greedy", 3, device, trace=trace,
                                  methods=("unplanned", "planned"))
    assert report["memory_limit"] == limit
    assert report["plan"]["memory_limit"] == limit - trace.outside_bytes
    assert report["comparison"]["planned_peak_within_limit"], report["comparison"]
