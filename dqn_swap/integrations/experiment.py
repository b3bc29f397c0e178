"""The experiment harness: planned training of a model-zoo workload, measured beside the alternatives.

A library for ``dqn-swap run``, the benchmarks (``benchmarks/bench_runtime.py``) and the tests,
with the integrations above the agents and the runtime: it plans (any registered planner, :func:`dqn_swap.agents.get_planner`) and schedules the plan
(:func:`dqn_swap.simulator.schedule_plan`), while the runtime it drives only applies plans.

:func:`run_planned_training` records the trace on the device, plans, trains
``steps`` optimizer steps with :class:`~dqn_swap.runtime.PlannedExecution` and
measures peak allocated memory (CUDA: the caching allocator's statistics, also
reserved memory; CPU: the allocator's timeline, :mod:`dqn_swap.meter`), step
time and throughput beside

* ``unplanned`` -- plain training (when it fits),
* ``torch-checkpoint`` -- full activation checkpointing: ``torch.utils.checkpoint``
  (non-reentrant) on every block, the children with parameters of the model's
  longest ``Sequential`` / ``ModuleList``,
* ``save_on_cpu`` -- ``torch.autograd.graph.save_on_cpu(pin_memory=True)``:
  every saved tensor goes to host memory,

and the simulator's prediction for the same plan (on the CPU, where copies
are synchronous, the memory the plan's schedule holds with copies that take no
time, :meth:`~dqn_swap.simulator.Simulator.instant_copy_memory`).
:func:`largest_batch` finds the largest batch size that trains under a memory
budget with each method.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..cost import DEFAULT_PROFILE, DeviceProfile, get_profile
from ..limits import LimitSpec, MemoryLimit, resolve_limit
from ..meter import AllocatorTimeline, collector_still
from ..plan import Plan
from ..runtime import PlannedExecution, enable_expandable_segments
from ..trace import Trace

METHODS = ("unplanned", "planned", "torch-checkpoint", "save_on_cpu")
#: Methods that were renamed: old name -> new name (an old name is refused with one line saying so).
RENAMED_METHODS = {"checkpoint": "torch-checkpoint"}


# --------------------------------------------------------------------------- planning
def make_planned(trace: Trace, limit: int, planner: Any, profile: DeviceProfile, agent: str | None = None) -> Plan:
    """The plan of ``planner`` (a registered name, built with the agent file ``agent``, or a planner
    object) for ``trace`` under ``limit`` bytes, with its schedule: what the runtime follows."""
    from ..simulator import schedule_plan

    if isinstance(planner, str):
        from dqn_swap.agents import get_planner

        planner = get_planner(planner, agent=agent)
    return schedule_plan(trace, planner.plan(trace, limit, profile))


def simulate_plan(trace: Trace, plan: Plan) -> dict[str, Any]:
    """The simulator's figures for ``plan``, with the peak of its schedule under instant copies."""
    from ..simulator import simulate

    from ..simulator import Simulator

    res = simulate(trace, plan)
    instant = Simulator(trace, plan.memory_limit).instant_copy_memory(plan.actions, res.schedule)
    return {"feasible": bool(res.feasible), "makespan": float(res.makespan),
            "compute_time": float(res.compute_time),
            "overhead": float(res.overhead) if res.feasible and res.overhead != float("inf") else None,
            "peak_bytes": int(res.peak_bytes),
            # what a synchronous device (the CPU) holds following the plan's schedule
            "instant_copy_peak_bytes": int(instant.max()) if len(instant) else int(trace.initial_bytes),
            "figures": res.figures()}


# --------------------------------------------------------------------------- methods
def block_modules(model: nn.Module) -> list[nn.Module]:
    """The blocks full checkpointing wraps: the children with parameters of the longest container."""
    best: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            kids = [c for c in m.children() if any(True for _ in c.parameters())]
            if len(kids) > len(best):
                best = kids
    if not best:
        best = [model]
    return best


def checkpoint_blocks(model: nn.Module) -> int:
    """Wrap every block's forward in non-reentrant ``torch.utils.checkpoint``; returns how many."""
    blocks = block_modules(model)
    for b in blocks:
        b.forward = functools.partial(checkpoint, b.forward, use_reentrant=False)  # type: ignore[method-assign]
    return len(blocks)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host timing of asynchronous kernels


@contextmanager
def _memory_cap(device: torch.device, budget: int | None) -> Iterator[None]:
    """On CUDA, make allocations beyond ``budget`` fail (the per-process memory fraction)."""
    if budget is None or device.type != "cuda":
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def _method(method: str, model: nn.Module, plan: Plan | None, trace: Trace | None, device: torch.device,
            expandable_segments: bool) -> tuple[PlannedExecution | None, Callable[[], Any]]:
    """``method`` applied to ``model``: the runtime of a planned one (else None) and the context each
    step's forward and backward run in."""
    runtime: PlannedExecution | None = None
    if method == "planned":
        if plan is None or trace is None:
            raise ValueError("method 'planned' needs a plan and its trace")
        runtime = PlannedExecution(model, plan, trace, device=device, expandable_segments=expandable_segments)
    elif method == "torch-checkpoint":
        checkpoint_blocks(model)
    elif method in RENAMED_METHODS:
        raise ValueError(f"the method {method!r} is now called {RENAMED_METHODS[method]!r}")
    elif method not in ("unplanned", "save_on_cpu"):
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")

    def context() -> Any:
        if runtime is not None:
            return runtime
        if method == "save_on_cpu":
            return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
        return nullcontext()

    return runtime, context


def train_steps(model_name: str, batch_size: int, method: str, steps: int, device: torch.device, *,
                plan: Plan | None = None, trace: Trace | None = None, seed: int = 0, warmup: int = 1,
                budget: int | None = None, expandable_segments: bool = True,
                cpu_baseline: int | None = None) -> dict[str, Any]:
    """Train ``steps`` steps of a fresh workload with ``method``; measure time and memory.

    Returns ``status`` ("ok" or "oom"), the losses, the median ``step_time_s``
    over the steps after ``warmup``, ``throughput`` (samples per second) and
    ``peak_allocated``: on CUDA the allocator's peak over all steps (and
    ``peak_reserved``); on the CPU, given ``cpu_baseline`` (the bytes alive when
    an iteration starts, ``trace.initial_bytes``), the baseline plus the most
    the allocator's timeline shows allocated during one more, untimed step
    (profiling slows a step down; ``save_on_cpu`` is not measured there, its
    "host" is the same memory).
    """
    from ..user_code import load_workload

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    w = load_workload(model_name, batch_size, device, seed)
    if w.loss_fn is None or w.make_optimizer is None:
        raise ValueError(f"{model_name} has no backward pass to plan")
    model, inputs, loss_fn = w.model, w.example_inputs, w.loss_fn
    opt = w.make_optimizer(model.parameters())
    runtime, context = _method(method, model, plan, trace, device, expandable_segments)
    torch.manual_seed(seed + 1)
    losses: list[float] = []
    times: list[float] = []
    result: dict[str, Any] = {"method": method, "batch_size": batch_size}
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
    meter_cpu = device.type == "cpu" and cpu_baseline is not None and method != "save_on_cpu"
    cpu_peak = 0
    try:
        with _memory_cap(device, budget):
            for i in range(steps + warmup + 2 * int(meter_cpu)):
                # The last step is measured; the one before it runs under the profiler too, untimed:
                # the CPU allocator reports a free's size only for blocks allocated while profiling.
                profiled = meter_cpu and i >= steps + warmup
                measured = meter_cpu and i == steps + warmup + 1
                _sync(device)
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                timeline = AllocatorTimeline() if profiled else nullcontext()
                with timeline:
                    with context():
                        loss = loss_fn(model(*inputs))
                        loss.backward()
                    opt.step()
                _sync(device)
                if measured:
                    cpu_peak = timeline.peak  # type: ignore[union-attr]
                elif i >= warmup and not profiled:
                    times.append(time.perf_counter() - t0)
                losses.append(float(loss.detach()))
                del loss
    except torch.OutOfMemoryError as e:
        result.update(status="oom", error=str(e).splitlines()[0] if str(e) else "out of memory")
        del model, opt, runtime
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return result
    step = statistics.median(times) if times else float("nan")
    result.update(status="ok", losses=losses, step_time_s=step, throughput=batch_size / step if times else None)
    if device.type == "cuda":
        result["peak_allocated"] = int(torch.cuda.max_memory_allocated(device))
        result["peak_reserved"] = int(torch.cuda.max_memory_reserved(device))
        result["memory_measured_by"] = "the CUDA caching allocator's peak statistics"
    elif meter_cpu:
        assert cpu_baseline is not None
        result["peak_allocated"] = int(cpu_baseline) + int(cpu_peak)
        result["memory_measured_by"] = "the CPU allocator's timeline (torch.profiler, profile_memory=True)"
    if runtime is not None:
        result["runtime"] = runtime.summary()
    return result


# --------------------------------------------------------------------------- the run
def _resolve_limit(memory_limit: LimitSpec, trace: Trace, unplanned_peak: int, *,
                   check_minimum: bool = True) -> int:
    """``memory_limit`` in bytes (:mod:`dqn_swap.limits`); a multiple is of ``unplanned_peak``."""
    return MemoryLimit.parse(memory_limit).resolve(trace, unplanned_peak=unplanned_peak,
                                                   check_minimum=check_minimum)


def _profile(profile: str | DeviceProfile | None, device: torch.device) -> DeviceProfile:
    if isinstance(profile, DeviceProfile):
        return profile
    if profile == "measured" or (profile is None and device.type == "cuda"):
        from ..cost import measure_profile

        return measure_profile(str(device))
    return get_profile(profile or DEFAULT_PROFILE)


def record(model_name: str, batch_size: int, device: torch.device, profile: DeviceProfile,
           seed: int = 0) -> Trace:
    """Record the workload's trace on ``device`` (a separate model instance: weights are not shared)."""
    from ..recorder import record_trace
    from ..user_code import load_workload

    w = load_workload(model_name, batch_size, device, seed)
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device=device, profile=profile,
                         meta={"model": model_name, "batch_size": batch_size, "seed": seed})
    del w
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return trace


def run_planned_training(model_name: str, batch_size: int, memory_limit: LimitSpec = "0.5x",
                         planner: str = "greedy-swap", steps: int = 10, device: str | torch.device | None = None,
                         *, profile: str | DeviceProfile | None = None,
                         methods: tuple[str, ...] | list[str] = METHODS, warmup: int = 1, seed: int = 0,
                         expandable_segments: bool = True, plan: Plan | None = None, trace: Trace | None = None,
                         budget: LimitSpec | None = None, max_batch_methods: tuple[str, ...] | list[str] = (),
                         agent: str | None = None, progress: Callable[[str], None] | None = None,
                         plan_source: str = "plan") -> dict[str, Any]:
    """Record, plan and train ``model_name`` with the runtime; compare with the other methods.

    Args:
        model_name, batch_size: the workload: a name of :func:`dqn_swap.models.build_workload` (the zoo,
            ``hf:NAME``, ``gen:FAMILY:SEED``) or ``package.module:function`` (as ``dqn-swap record``).
        memory_limit: any form of :mod:`dqn_swap.limits`: bytes, a size ("8GiB"), a percentage
            ("50%": halfway from the recorded trace's minimum memory, 0%, to its unplanned peak,
            100%), or a multiple of the unplanned peak ("0.5x": the peak measured by the unplanned
            run on CUDA, else the trace's).
        planner: a registered planner's name (:func:`dqn_swap.planners.planner_names`).
        steps: measured optimizer steps per method, after ``warmup`` steps.
        device: "cuda" or "cpu"; default CUDA when available.
        profile: device profile for planning; default measured on CUDA.
        methods: which of :data:`METHODS` to run.
        expandable_segments: turn on the CUDA allocator's expandable segments (default).
        plan, trace: use these instead of recording and planning (a plan without a schedule, from a
            version 1 file, is scheduled by the simulator).  A ``plan`` without its ``trace``
            must have been made for the trace recorded here (the same model, batch size, seed and
            profile, recorded on this device); :class:`~dqn_swap.plan.PlanError` otherwise, before
            any training.  ``plan_source`` names the plan in that message (its file).
        budget: with ``max_batch_methods``, the memory budget of the largest-batch search
            (same forms as ``memory_limit``; default ``memory_limit``).
        agent: the agent file of the ``dqn`` / ``dqn-search`` planners (default: the shipped agent).

    Returns:
        A JSON-ready dict: the workload, device, limit, plan summary, the simulator's
        prediction, per-method measurements, and the comparison figures.
    """
    say = progress or (lambda _msg: None)
    dev = _device(device, expandable_segments)
    prof = _profile(profile, dev)
    report: dict[str, Any] = {"model": model_name, "batch_size": batch_size, "device": str(dev),
                              "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                              "torch": torch.__version__, "steps": steps, "profile": prof.name,
                              "expandable_segments": bool(dev.type == "cuda" and expandable_segments)}
    if trace is None:
        say(f"recording {model_name} at batch {batch_size} on {dev}")
        trace = record(model_name, batch_size, dev, prof, seed)
    if plan is not None:  # a saved plan, for this trace, with the simulator's schedule
        plan.check_trace(trace, plan_source)
        plan = _schedule_plan(trace, plan)
    report["trace"] = _trace_figures(trace)
    results: dict[str, Any] = {}
    if "unplanned" in methods:
        say("training unplanned")
        results["unplanned"] = train_steps(model_name, batch_size, "unplanned", steps, dev, seed=seed, warmup=warmup,
                                           cpu_baseline=trace.initial_bytes)
    base = results.get("unplanned", {})
    unplanned_peak = int(base.get("peak_allocated") or trace.meta.get("max_memory_allocated") or trace.peak_bytes)
    report["unplanned_peak_bytes"] = unplanned_peak
    report["unplanned_peak_source"] = "measured" if base.get("peak_allocated") else "trace"
    limit = _plan_limit(report, plan, memory_limit, trace, unplanned_peak, say)
    plan = _planned(report, plan, trace, limit, planner, prof, agent, say)
    predicted = simulate_plan(trace, plan)
    report["simulator"] = predicted
    for method in (m for m in methods if m != "unplanned"):
        say(f"training {method}")
        results[method] = train_steps(model_name, batch_size, method, steps, dev, plan=plan, trace=trace, seed=seed,
                                      warmup=warmup, expandable_segments=expandable_segments,
                                      cpu_baseline=trace.initial_bytes)
    report["methods"] = results
    report["comparison"] = compare(results, predicted, limit, trace, timed=dev.type == "cuda")
    if max_batch_methods:
        # device bytes, as the probes measure them
        budget_b = _resolve_limit(budget if budget is not None else report["memory_limit"], trace, unplanned_peak,
                                  check_minimum=False) + trace.outside_bytes
        report["largest_batch"] = {"budget": budget_b}
        for method in max_batch_methods:
            say(f"largest batch under {budget_b} bytes with {method}")
            report["largest_batch"][method] = largest_batch(model_name, budget_b, method, dev, planner=planner,
                                                            profile=prof, seed=seed, agent=agent)
    return report


def _schedule_plan(trace: Trace, plan: Plan) -> Plan:
    """A saved plan with the simulator's schedule (a version 1 file, or one made by hand, has none)."""
    from ..simulator import schedule_plan

    return schedule_plan(trace, plan)


def _planned(report: dict[str, Any], plan: Plan | None, trace: Trace, limit: int, planner: str, prof: DeviceProfile,
             agent: str | None, say: Callable[[str], None]) -> Plan:
    """``plan``, or one made now by ``planner`` (its seconds in ``report``); what it is, in ``report``."""
    if plan is None:
        say(f"planning with {planner} for {limit} bytes")
        t0 = time.perf_counter()
        plan = make_planned(trace, limit, planner, prof, agent)
        report["plan_seconds"] = time.perf_counter() - t0
    report["plan"] = {"planner": plan.planner, "swaps": plan.n_swap, "recomputes": plan.n_recompute,
                      "memory_limit": plan.memory_limit, "figures": plan.figures}
    return plan


def _plan_limit(report: dict[str, Any], plan: Plan | None, memory_limit: LimitSpec, trace: Trace,
                unplanned_peak: int, say: Callable[[str], None]) -> int:
    """The plan's own bytes, and in ``report`` the device's limit the measured peaks are held to (those
    bytes and what the device held outside the recorded iteration, :attr:`Trace.outside_bytes`)."""
    # a saved plan's bytes are resolved already (its memory_limit): resolving them again as a size of
    # the device would take the device's outside bytes off a second time
    limit = int(plan.memory_limit) if plan is not None else _resolve_limit(memory_limit, trace, unplanned_peak)
    report["memory_limit"] = limit + trace.outside_bytes
    report["memory_limit_spec"] = str(memory_limit)
    if limit < trace.minimum_memory:
        say(f"the limit, {limit} bytes, is below the least memory any plan needs for this trace "
            f"({trace.minimum_memory} bytes): the plan cannot fit it")
    return limit


def _device(device: str | torch.device | None, expandable_segments: bool) -> torch.device:
    """The run's device (CUDA where there is one, by default), with the allocator's expandable
    segments turned on before its first allocation where asked."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but no CUDA GPU is available")
    if dev.type == "cuda" and expandable_segments:
        enable_expandable_segments()
    return dev


def _trace_figures(trace: Trace) -> dict[str, Any]:
    """What the report says of the recorded trace."""
    return {"fingerprint": trace.fingerprint, "peak_bytes": trace.peak_bytes, "ops": trace.n_ops,
            "minimum_memory": trace.minimum_memory, "saved_activation_bytes": trace.saved_bytes,
            "outside_bytes": trace.outside_bytes,
            **({"outside_blocks": trace.meta["outside_blocks"]} if trace.meta.get("outside_blocks") else {}),
            **({"max_memory_allocated": int(trace.meta["max_memory_allocated"])}
               if "max_memory_allocated" in trace.meta else {})}


def compare(results: dict[str, Any], predicted: dict[str, Any] | None, limit: int, trace: Trace,
            timed: bool = True) -> dict[str, Any]:
    """Whether planned training's losses are unplanned training's bit for bit, whether its peak stayed
    under the limit, and with ``timed`` (a GPU) the throughput ratios and the simulator's step-time error.

    Without ``timed`` (the CPU) no time is compared: the simulator's times are a GPU's (the trace's
    profile) and a CPU's copies are moves within host memory, so a ratio of CPU step times says nothing
    of the plan's cost on a GPU.

    ``limit``: the plan's own bytes (:meth:`MemoryLimit.resolve`); the allocator's peak also counts
    what the device held outside the recorded iteration, so both the limit and the prediction it is
    held to are the plan's bytes plus :attr:`Trace.outside_bytes`."""
    outside = trace.outside_bytes
    out: dict[str, Any] = {}
    planned = results.get("planned", {})
    if planned.get("status") != "ok":
        return out
    t_plan = planned["step_time_s"]
    base = results.get("unplanned", {})
    if base.get("status") == "ok" and base.get("losses") and planned.get("losses"):
        out["planned_losses_identical_to_unplanned"] = planned["losses"] == base["losses"]
    for other in ("unplanned", "torch-checkpoint", "save_on_cpu") if timed else ():
        r = results.get(other, {})
        if r.get("status") == "ok":
            out[f"throughput_vs_{other}"] = r["step_time_s"] / t_plan
    if "peak_allocated" in planned:
        measured_peak = int(planned["peak_allocated"])
        out["planned_peak_allocated"] = measured_peak
        out["planned_peak_within_limit"] = measured_peak <= limit + outside
        out["planned_peak_over_limit"] = measured_peak / (limit + outside)
        if predicted:
            # The CPU copies synchronously: its prediction is the schedule with copies that take no time.
            key = "peak_bytes" if str(planned.get("runtime", {}).get("device", "")).startswith("cuda") \
                else "instant_copy_peak_bytes"
            out["predicted_peak_bytes"] = int(predicted[key]) + outside
            out["planned_peak_over_predicted"] = measured_peak / max(int(predicted[key]) + outside, 1)
    reference = base["step_time_s"] if base.get("status") == "ok" and timed else None
    if reference:
        out["measured_overhead"] = t_plan / reference - 1.0
    if predicted and predicted.get("feasible") and predicted.get("makespan") and reference:
        # Both as a fraction of the unplanned step; the simulator's base is the trace's compute time.
        pred_over = predicted.get("overhead")
        if pred_over is None:
            pred_over = predicted["makespan"] / trace.compute_time - 1.0
        out["predicted_overhead"] = pred_over
        measured_step = t_plan
        predicted_step = reference * (1.0 + pred_over)
        out["predicted_step_time_s"] = predicted_step
        out["simulator_step_time_error"] = abs(predicted_step - measured_step) / measured_step
    return out


# --------------------------------------------------------------------------- largest batch
def largest_batch(model_name: str, budget: int, method: str, device: torch.device, *, planner: str = "greedy-swap",
                  profile: DeviceProfile | None = None, seed: int = 0, start: int = 1, cap: int = 4096,
                  steps: int = 2, agent: str | None = None) -> dict[str, Any]:
    """The largest batch size that trains under ``budget`` bytes with ``method``.

    On CUDA each probe trains ``steps`` steps with allocations beyond the
    budget made to fail (``set_per_process_memory_fraction``) and also checks
    the measured peak allocated.  Elsewhere only ``unplanned`` and ``planned``
    are predicted, from traces recorded on the ``meta`` device (the unplanned
    peak, and the simulator's planned peak).  Doubling from ``start``, then bisection.  ``planner`` and ``agent`` as in
    :func:`make_planned`.
    """
    prof = profile or get_profile(DEFAULT_PROFILE)
    measured = device.type == "cuda"
    if not measured and method not in ("unplanned", "planned"):
        return {"batch_size": None, "how": f"needs a GPU to measure {method}"}
    planner_obj = None
    if method == "planned":  # built once: an agent file loads once
        from dqn_swap.agents import get_planner

        planner_obj = get_planner(planner, agent=agent)

    def fits(batch: int) -> bool:
        if not measured:
            trace = record(model_name, batch, torch.device("meta"), prof, seed)
            if method == "unplanned":
                return trace.peak_bytes <= budget
            plan = make_planned(trace, budget, planner_obj, prof)
            sim = simulate_plan(trace, plan)
            return bool(sim["feasible"]) and sim["peak_bytes"] <= budget
        plan = trace = None
        try:
            if method == "planned":
                trace = record(model_name, batch, device, prof, seed)
                # the plan's own bytes: the budget less what the device holds outside the iteration
                plan = make_planned(trace, resolve_limit(trace, budget, check_minimum=False), planner_obj, prof)
            r = train_steps(model_name, batch, method, steps, device, plan=plan, trace=trace, seed=seed,
                            warmup=0, budget=budget)
        except torch.OutOfMemoryError:
            return False
        return r["status"] == "ok" and r.get("peak_allocated", 0) <= budget

    best, probes = 0, 0
    batch = start
    while batch <= cap:
        probes += 1
        if not fits(batch):
            break
        best, batch = batch, batch * 2
    lo, hi = best, min(batch, cap + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probes += 1
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return {"batch_size": lo or None, "probes": probes, "how": "measured" if measured else "predicted"}


__all__ = ["METHODS", "RENAMED_METHODS", "block_modules", "checkpoint_blocks", "compare",
           "largest_batch", "make_planned", "measured_cpu_peak", "record",
           "run_planned_training", "simulate_plan", "train_steps"]


# --------------------------------------------------------------------------- measured CPU peak
def measured_cpu_peak(model: nn.Module, inputs: tuple, loss_fn: Callable[[Any], torch.Tensor],
                      optimizer: torch.optim.Optimizer, runtime: PlannedExecution | None, baseline: int,
                      iterations: int = 3) -> int:
    """The peak bytes of a steady-state training iteration on the CPU, measured.

    Runs ``iterations`` iterations (``with runtime`` when given) and measures
    the last with the allocator's timeline (:class:`dqn_swap.meter.AllocatorTimeline`):
    ``baseline`` (the bytes alive when an iteration starts, ``trace.initial_bytes``)
    plus the most allocated at once during it.  Earlier iterations fill the
    runtime's pool of host buffers, which on the CPU are the same memory, and
    warm the kernels' caches (oneDNN makes a convolution's primitive once).
    Every iteration runs under the profiler: the CPU allocator reports a
    block's size at its free only if it was allocated while profiling, and a
    swapped input's storage is refilled in one iteration and emptied in the next.
    A free counts only if its block was allocated in one of these iterations:
    the free of a block some earlier code allocated under another profiler
    session (a test run before, the timeline's own probe) is not the
    iteration's, and counted it would lower the peak by its size.
    """
    peak = 0
    ours: frozenset[int] = frozenset()
    for i in range(iterations):
        optimizer.zero_grad(set_to_none=True)
        timeline = AllocatorTimeline(own_blocks=True, also_own=ours)
        with collector_still(), timeline:
            with runtime if runtime is not None else nullcontext():
                out = model(*inputs)
                loss = loss_fn(out)
                loss.backward()
            optimizer.step()
            del out, loss
        ours = timeline.alive_blocks
        if i == iterations - 1:
            peak = timeline.peak  # type: ignore[union-attr]
    return int(baseline) + int(peak)
