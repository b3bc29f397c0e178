"""Memory equals the plan on models and a loop dqn-swap did not write.

The foreign workloads of :mod:`tests.user_models` -- Hugging Face T5 and DistilBERT, PyTorch
Geometric GCN and GIN, a squeeze-excitation CNN with stochastic depth and in-place ReLU, an
EfficientNet-style MBConv CNN with in-place SiLU -- in fp32 and in bf16 autocast, trained by the loop
users write: gradient accumulation over two micro-batches, ``clip_grad_norm_``, AdamW with two
parameter groups and an LR scheduler (:func:`tests.user_models.train_iteration`; its module
docstring says how the trace, the loop's last micro-step, corresponds to the measured iteration).

Property, for every (model, precision, planner, limit) case with a feasible, non-empty plan: the
peak of planned training measured with the CPU allocator's timeline is at most the limit and
within [0.95, 1.00] of the simulator's prediction (the plan's memory when copies take no time),
and the whole state training leaves -- ``state_dict``, optimizer and scheduler state, losses -- is
bit-identical to unplanned training of the same loop from the same seeds.

The fast subset runs every foreign model in both precisions under two of the four planners at one of
the two limits, rotating so that each precision meets every planner at both limits
(:func:`fast_subset`); the rest of the grid is ``slow``.
``benchmarks/bench_runtime.py memory`` runs the wider grid, the zoo's models included.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
import torch

from dqn_swap.runtime import PlannedExecution
from dqn_swap.simulator import instant_copy_peak, simulate
from dqn_swap.trace import Trace, resolve_memory_limit

from .. import user_models as um

PRECISIONS = ("fp32", "bf16")
PLANNERS = ("greedy", "lru", "sqrt-n", "dqn")
LIMITS = ("70%", "40%")
VARIANTS = tuple(f"{m}@{p}" if p != "fp32" else m for m in um.USER_MODELS for p in PRECISIONS)


@lru_cache(maxsize=None)
def trace_of(name: str) -> Trace:
    """The trace of the loop's last micro-step, recorded on a separate build (recording trains it)."""
    return um.record(um.build(name))


@lru_cache(maxsize=None)
def plan_for(name: str, planner: str, limit: str) -> Any:
    from dqn_swap.agents import get_planner

    trace = trace_of(name)
    return get_planner(planner).plan(trace, resolve_memory_limit(trace, limit))


def run(name: str, plan: Any) -> tuple[int, dict[str, Any]]:
    """Measured peak and final state of three iterations of the loop, planned (``plan``) or not."""
    trace = trace_of(name)
    loop = um.start(um.build(name))
    runtime = PlannedExecution(loop.w.model, plan, trace) if plan is not None else None
    return um.measured_loop_peak(loop, runtime, trace.initial_bytes), um.state_of(loop)


@lru_cache(maxsize=None)
def reference(name: str) -> tuple[int, dict[str, Any]]:
    return run(name, None)


def fast_subset(i: int, j: int) -> tuple[tuple[str, ...], str]:
    """The planners and the limit of the fast subset for model ``i`` in precision ``j``: two planners at
    one limit, rotating so that each precision meets all four planners at both limits."""
    return PLANNERS[2 * ((i + j) % 2):2 * ((i + j) % 2) + 2], LIMITS[(i // 2) % 2]


#: Cases known to fail, and why (found, not yet fixed); none now.
KNOWN: dict[tuple[str, str, str], str] = {
}


def cases() -> list[Any]:
    out = []
    for i, model in enumerate(um.USER_MODELS):
        for j, precision in enumerate(PRECISIONS):
            name = f"{model}@{precision}" if precision != "fp32" else model
            fast_planners, fast_limit = fast_subset(i, j)
            for limit in LIMITS:
                for planner in PLANNERS:
                    marks = () if planner in fast_planners and limit == fast_limit else (pytest.mark.slow,)
                    if (name, planner, limit) in KNOWN:
                        marks += (pytest.mark.xfail(reason=KNOWN[(name, planner, limit)]),)
                    out.append(pytest.param(name, planner, limit, marks=marks, id=f"{name}-{planner}-{limit}"))
    return out


#: Every (variant, planner, limit), nothing recorded or planned at collection (a run of a few tests,
#: ``-k``, records and plans only theirs); a case whose plan is empty or infeasible skips.
CASES = cases()


def _planned(name: str, planner: str, limit: str) -> Any:
    plan = plan_for(name, planner, limit)
    if not plan.actions or not plan.figures.get("feasible"):
        pytest.skip(f"{planner} at {limit} makes {'no feasible' if plan.actions else 'an empty'} plan of {name}")
    return plan


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _fast() -> list[tuple[str, str, str]]:
    """The fast cases whose plan is not empty and feasible."""
    fast = [tuple(c.values) for c in CASES if not any(m.name == "slow" for m in c.marks)]
    return [c for c in fast if plan_for(*c).actions and plan_for(*c).figures.get("feasible")]  # type: ignore[misc]


def test_enough_cases() -> None:
    fast = _fast()
    assert len(fast) >= 18
    assert {um.split_precision(n)[0] for n, _, _ in fast} == set(um.USER_MODELS)
    for precision in PRECISIONS:
        mine = [c for c in fast if um.split_precision(c[0])[1] == precision]
        assert {p for _, p, _ in mine} == set(PLANNERS), precision
        assert {lim for _, _, lim in mine} == set(LIMITS), precision


@pytest.mark.parametrize("name", VARIANTS)
def test_the_unplanned_loop_peaks_at_the_traces_peak(name: str) -> None:
    """Control: without a plan the loop's measured peak is the recorded micro-step's."""
    measured, _ = reference(name)
    trace = trace_of(name)
    # Never above the trace (a few bytes: numbers autograd keeps, see KNOWN); below it by at most 5 %:
    # the cpu kernels' scratch measured while recording depends on what the process ran before (a
    # fresh clone's run measured gin's trace 18 KB and mbconv's 4 KB above their loops, 1.7 % and 0.01 %).
    assert 0.95 * trace.peak_bytes <= measured <= trace.peak_bytes + 1024, (measured, trace.peak_bytes)


@pytest.mark.parametrize("name,planner,limit", CASES)
def test_planned_loop_under_the_limit_as_predicted_and_bit_identical(name: str, planner: str, limit: str) -> None:
    trace = trace_of(name)
    plan = _planned(name, planner, limit)
    result = simulate(trace, plan)
    predicted = instant_copy_peak(trace, plan, result)
    assert predicted <= result.peak_bytes <= plan.memory_limit
    measured, state = run(name, plan)
    _, ref_state = reference(name)
    figures = (f"{name} {planner} {limit}: measured {measured}, predicted {predicted}, limit {plan.memory_limit}: "
               f"measured/limit {measured / plan.memory_limit:.4f}, measured/predicted {measured / predicted:.4f}")
    assert measured <= plan.memory_limit, f"above the limit: {figures}"
    assert 0.95 * predicted <= measured <= predicted, f"not as predicted: {figures}"
    diffs = um.differences(ref_state, state)
    assert not diffs, f"{name} {planner} {limit}: not bit-identical to unplanned training: {diffs[:5]}"


@pytest.mark.parametrize("name,planner,limit", [("gin", "layrub", "30%"), ("gin", "sqrt-n", "70%"),
                                                ("distilbert@bf16", "window", "70%")])
def test_reported_cases_are_as_predicted(name: str, planner: str, limit: str) -> None:
    """GIN measured 49152 B (one [192, 64] fp32 tensor) below every planned prediction (0.94-0.948): its
    peak moved to ``index_select``'s backward, which the recorder saw out of place (a dispatch mode makes
    tensors "subclass-like"; :meth:`dqn_swap.recorder.mode._Recorder.fill_in_place`).  DistilBERT in bf16 under
    the window planner measured 16384 B above (1.0068): a prefetch scheduled at the op after the loss began
    at the loss's output pack, while its 128 KiB fp32 logits were still alive (a pack inside an op, before
    its frees: ``Trace.saved_in_op`` and :attr:`dqn_swap.trace.Trace.pack_progress_op`)."""
    test_planned_loop_under_the_limit_as_predicted_and_bit_identical(name, planner, limit)
