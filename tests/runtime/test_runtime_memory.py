"""Memory equals the plan: the peak of planned training, measured on the CPU, against the limit
and the simulator's prediction.

The CPU's allocator timeline (``torch.profiler`` with ``profile_memory=True``) gives the
bytes allocated at every instant of an iteration, exactly.  On the CPU copies are
synchronous, so the prediction is the memory the plan's schedule holds when copies take
no time (:meth:`dqn_swap.simulator.Simulator.instant_copy_memory`); it is at most the
simulator's own peak, which the plan keeps under its limit.

Property, over (model, planner, limit) cases with a feasible, non-empty plan: the
measured peak is never above the limit, and within 5 % of the predicted peak.
``benchmarks/bench_runtime.py memory`` records the largest ratios.

The harness (:func:`dqn_swap.integrations.experiment.measured_cpu_peak`) holds its batch and
labels through the iteration, as training loops do; the runtime never empties an input
the loop can still read (``HeldInputWarning``), so a plan that swaps an input frees
nothing there.  Those plans are measured apart: the prediction plus at most the bytes of
the inputs they swap.
"""

from __future__ import annotations

import dataclasses
import warnings
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dqn_swap.integrations.experiment import measured_cpu_peak
from dqn_swap.plan import Plan
from dqn_swap.planners import manual_plan, saved_activations
from dqn_swap.recorder import record_trace
from dqn_swap.runtime import PlannedExecution
from dqn_swap.runtime.execution import HeldInputWarning
from dqn_swap.simulator import instant_copy_peak, simulate
from dqn_swap.trace import resolve_memory_limit

from ..runtime_support import MODELS, released_trace_of, trace_of

CASE_MODELS = ("resnet_tiny", "gpt_tiny", "bn_inplace", "views_residual", "dropout", "scaled_buffer")
CASE_PLANNERS = ("greedy", "vdnn", "lru", "sqrt-n", "window", "dqn")
CASE_LIMITS = ("70%", "40%")


@lru_cache(maxsize=None)
def plan_for(name: str, planner: str, limit: str):  # noqa: ANN201
    from dqn_swap.agents import get_planner

    trace = trace_of(name)
    return get_planner(planner).plan(trace, resolve_memory_limit(trace, limit))


#: Every (model, planner, limit); a case with an empty or infeasible plan skips.  Nothing is
#: recorded or planned at collection: a run of a few tests (``-k``) records and plans only theirs.
CASES = [(n, p, lim) for n in CASE_MODELS for p in CASE_PLANNERS for lim in CASE_LIMITS]


def _planned(name: str, planner: str, limit: str) -> Plan:
    plan = plan_for(name, planner, limit)
    if not plan.actions or not plan.figures.get("feasible"):
        pytest.skip(f"{planner} at {limit} makes {'no feasible' if plan.actions else 'an empty'} plan of {name}")
    return plan


def test_enough_cases() -> None:
    made = [c for c in CASES if plan_for(*c).actions and plan_for(*c).figures.get("feasible")]
    assert len(made) >= 30
    assert {p for _, p, _ in made} >= {"greedy", "lru", "sqrt-n", "dqn"}


@pytest.mark.parametrize("name,planner,limit", CASES)
def test_measured_peak_is_under_the_limit_and_as_predicted(name: str, planner: str, limit: str) -> None:
    trace = trace_of(name)
    plan = _planned(name, planner, limit)
    result = simulate(trace, plan)
    predicted = instant_copy_peak(trace, plan, result)
    assert predicted <= result.peak_bytes <= plan.memory_limit
    w = MODELS[name]()
    opt = w.make_optimizer(w.model.parameters())
    runtime = PlannedExecution(w.model, plan, trace)
    measured = measured_cpu_peak(w.model, w.inputs, w.loss_fn, opt, runtime, trace.initial_bytes)
    assert measured <= plan.memory_limit, (
        f"measured peak {measured} above the limit {plan.memory_limit} (predicted {predicted})")
    assert abs(measured - predicted) <= 0.05 * predicted, (
        f"measured {measured}, predicted {predicted}, limit {plan.memory_limit}")


@pytest.mark.parametrize("name", CASE_MODELS)
def test_a_plan_swapping_a_held_input_is_carried_out_without_it(name: str) -> None:
    """The loop holds its batch: the runtime keeps the input (at most one warning) and carries out the
    rest of the plan: the measured peak is the prediction plus at most the inputs' bytes.  The plan
    swaps the saved inputs of a trace recorded as from a loop that hands its batch over (the
    planners leave inputs alone otherwise), and every other saved activation."""
    trace = released_trace_of(name)
    moved = saved_activations(trace)
    assert any(trace.tensor_alloc_op[t] < 0 for t in moved), "no saved input to swap"
    plan = manual_plan(trace, swap=moved)
    result = simulate(trace, plan)
    predicted = instant_copy_peak(trace, plan, result)
    inputs = sum(int(trace.tensor_nbytes[a.tensor]) for a in plan.actions if trace.tensor_alloc_op[a.tensor] < 0)
    w = MODELS[name]()
    opt = w.make_optimizer(w.model.parameters())
    runtime = PlannedExecution(w.model, plan, trace)
    with warnings.catch_warnings():
        # warned where the runtime gave up on the input at backward's start; one the schedule
        # prefetches back within the forward pass was never to leave for long (nothing to report)
        warnings.simplefilter("ignore", HeldInputWarning)
        measured = measured_cpu_peak(w.model, w.inputs, w.loss_fn, opt, runtime, trace.initial_bytes)
    assert runtime.stats.emptied_inputs == 0
    # every other action as planned; the inputs stay: at most their bytes above the prediction
    assert 0.95 * predicted <= measured <= 1.05 * predicted + inputs, (
        f"measured {measured}, predicted {predicted}, inputs kept {inputs}")


def test_the_unplanned_peak_is_the_traces() -> None:
    """Control: without a plan the measured peak is the trace's (kernel scratch included)."""
    for name in ("resnet_tiny", "bn_inplace"):
        trace = trace_of(name)
        w = MODELS[name]()
        opt = w.make_optimizer(w.model.parameters())
        measured = measured_cpu_peak(w.model, w.inputs, w.loss_fn, opt, None, trace.initial_bytes)
        assert abs(measured - trace.peak_bytes) <= 1024  # kernels may ask a few bytes more or less per run


class _HeldBody(nn.Module):
    """Holds its first activation ``h0`` until it returns, after its layer norm: as a Hugging Face
    model holds its embedding output until its final norm has run."""

    def __init__(self) -> None:
        super().__init__()
        self.lin0 = nn.Linear(32, 1024).requires_grad_(False)
        self.lin1 = nn.Linear(1024, 128)
        self.wide = nn.Linear(128, 512)
        self.norm = nn.LayerNorm(512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = self.lin0(x)
        return self.norm(self.wide(torch.tanh(self.lin1(h0))))


class _HeldNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _HeldBody()
        self.head = nn.Linear(512, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _held_workload() -> tuple[nn.Module, tuple[torch.Tensor], Any, Any]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 32, generator=gen)
    y = torch.randint(0, 4, (1024,), generator=gen)
    return (_HeldNet(), (x,), lambda out: F.cross_entropy(out, y),
            lambda p: torch.optim.SGD(p, lr=0.05, foreach=False))


def test_a_prefetch_waits_for_the_caller_to_let_go_of_a_removed_tensor() -> None:
    """The simulator frees a removed tensor the model's code holds at the end of the op after which
    the code lets go (``Trace.held_op``); the layer norm's node saves its outputs before that, at a
    pack the trace counts at the next op.  A prefetch the schedule starts at that op must not start
    at that pack, beside the tensor still held: measured, the peak is the prediction."""
    model, inputs, loss_fn, make_optimizer = _held_workload()
    trace = record_trace(model, inputs, loss_fn, make_optimizer, device="cpu", meta={"model": "held"})
    h0 = int(np.flatnonzero(trace.tensor_alloc_op == 0)[0])  # lin0's output
    norm = int(np.flatnonzero([trace.op_names[trace.op_name[i]] == "aten.native_layer_norm"
                               for i in range(trace.n_ops)])[0])
    assert trace.held_op[h0] == norm  # the body holds it until the norm has run
    tanh = int(np.flatnonzero(trace.tensor_alloc_op == 2)[0])
    plan = manual_plan(trace, swap=[tanh], recompute=[h0])
    # the tanh output's prefetch at the op after the norm (the head's), where the simulator has h0 gone
    schedule = dataclasses.replace(plan.schedule, prefetch=tuple(
        (tid, norm + 1 if tid == tanh else op) for tid, op in plan.schedule.prefetch))
    plan = dataclasses.replace(plan, schedule=schedule)
    predicted = instant_copy_peak(trace, plan)
    model, inputs, loss_fn, make_optimizer = _held_workload()
    runtime = PlannedExecution(model, plan, trace, check_plan=False)  # a schedule written by hand
    measured = measured_cpu_peak(model, inputs, loss_fn, make_optimizer(model.parameters()), runtime,
                                 trace.initial_bytes)
    # (a kernel may ask a few bytes more or less per run; started beside h0 it would hold 512 KiB more)
    assert abs(measured - predicted) <= 1024, f"measured {measured}, predicted {predicted}"
    assert runtime.stats.deferred_prefetches >= 1
    assert runtime.stats.prefetches == 1
