#!/usr/bin/env python
"""Benchmark the planned-execution runtime.

Three measurements, each a subcommand:

``gpu`` (the default; needs a CUDA GPU)
    ResNet-50 and GPT at 50 % of the unplanned peak: planned training beside
    unplanned training, full activation checkpointing and ``save_on_cpu``;
    measured peak allocated vs the limit; throughput ratios; simulated vs
    measured overhead.  Writes ``results/runtime_<gpu>.{json,md}``.  Without a
    CUDA GPU it prints one line saying so and exits with status 2.

``overhead`` (CPU)
    Step time of an empty plan and of the shipped agent's plan against
    unplanned training of the same model, the methods interleaved step by
    step in one run so that they compare as ratios on a shared machine.

``clock`` (CPU)
    The same cases through the real runtime on the virtual clock
    (:mod:`dqn_swap.runtime.clock`): the step's virtual time against the
    simulator's makespan for the plan.

``host`` (CPU)
    The runtime's own cost per saved tensor: a chain of tiny ops, each saving one tensor, under
    an empty plan, a swap plan and a recompute plan, against unplanned training.

``memory`` (CPU)
    The peak of planned training measured with the allocator's timeline, for
    every (model, planner, limit) case with a feasible plan, against the limit
    and against the simulator's prediction, and whether training's whole state
    is bit-identical to unplanned training; the zoo's models and foreign ones
    (``tests/user_models.py``: T5, DistilBERT, GCN, GIN, SE-CNN, MBConv), fp32
    and bf16 autocast, in a loop with gradient accumulation, clipping and an LR
    scheduler (see :func:`memory`).  ``--late-copies SECONDS`` runs the same cases on the stand-in
    device whose copies each take that long, against the simulated peak.

    python benchmarks/bench_runtime.py [gpu] [--steps 10] [--planner dqn] [--max-batch]
    python benchmarks/bench_runtime.py overhead --json benchmarks/results/runtime_overhead_cpu.json
    python benchmarks/bench_runtime.py host --json benchmarks/results/runtime_host_cpu.json
    python benchmarks/bench_runtime.py memory --threads 1 --json benchmarks/results/runtime_memory_cpu.json
    python benchmarks/bench_runtime.py memory --models t5,gcn@bf16,resnet_tiny:8 --planners greedy,dqn --limits 50%
    python benchmarks/bench_runtime.py memory --threads 1 --late-copies 0.005 --json benchmarks/results/runtime_memory_late_copies.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from dqn_swap.models import split_model_spec
from dqn_swap.files import write_text

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))


# --------------------------------------------------------------------------- gpu
def markdown(gpu: str, reports: list[dict[str, Any]], result: dict[str, Any] | None = None) -> str:
    lines = [f"# Planned-execution runtime on {gpu}", ""]
    if result is not None:
        lines += [f"`{result['command']}`  ", f"commit {result['commit']}"
                  + (f" (modified: {', '.join(result['modified'])})" if result.get("modified") else "") + "  ",
                  f"{result['machine']}, {result['date']}", ""]
        if result.get("note"):
            lines += [result["note"], ""]
    lines += ["| model | batch | limit | method | status | step ms | samples/s | peak allocated | peak reserved |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        for name, m in r["methods"].items():
            if m.get("status") != "ok":
                lines.append(f"| {r['model']} | {r['batch_size']} | {r['memory_limit'] / 2**30:.2f} GiB | {name} | "
                             f"{m.get('status')} | | | | |")
                continue
            lines.append(f"| {r['model']} | {r['batch_size']} | {r['memory_limit'] / 2**30:.2f} GiB | {name} | ok | "
                         f"{m['step_time_s'] * 1e3:.1f} | {m['throughput']:.1f} | "
                         f"{m.get('peak_allocated', 0) / 2**30:.2f} GiB | "
                         f"{m.get('peak_reserved', 0) / 2**30:.2f} GiB |")
    lines += ["", "| model | plan | within limit | vs unplanned | vs torch-checkpoint | vs save_on_cpu | "
                  "measured overhead | predicted overhead | step-time error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        if "error" in r:
            lines.append(f"| {r['model']} | not planned at {r['memory_limit']}: {r['error']} | | | | | | | |")
            continue
        c = r.get("comparison", {})

        def f(key: str, fmt: str = "{:.3f}") -> str:
            v = c.get(key)
            return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v or "")

        lines.append(f"| {r['model']} | {r['plan']['planner']}: {r['plan']['swaps']} swaps, "
                     f"{r['plan']['recomputes']} recomputes | {c.get('planned_peak_within_limit')} | "
                     f"{f('throughput_vs_unplanned')} | {f('throughput_vs_torch-checkpoint')} | "
                     f"{f('throughput_vs_save_on_cpu')} | {f('measured_overhead')} | {f('predicted_overhead')} | "
                     f"{f('simulator_step_time_error')} |")
    held = [r for r in reports if r.get("trace", {}).get("outside_bytes")]
    if held:
        lines.append("")
        lines += [f"{r['model']}: the device held {r['trace']['outside_bytes'] / 2**20:.1f} MiB outside the recorded "
                  "iteration (cuBLAS's workspaces, whatever else the process held); the plan's own bytes were held "
                  "to the limit less these."
                  + (" Its largest blocks: " + ", ".join(f"{b / 2**20:.1f}" for b in r["trace"]["outside_blocks"])
                     + " MiB." if r["trace"].get("outside_blocks") else "")
                  for r in held]
    return "\n".join(lines) + "\n"


def gpu(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench_runtime: needs a CUDA GPU (none available); nothing measured", file=sys.stderr)
        return 2
    from dqn_swap.integrations.experiment import METHODS, run_planned_training

    from common import provenance
    from machine import relative_paths

    from dqn_swap.limits import MemoryLimitError

    name_gpu = torch.cuda.get_device_name()
    out = Path(args.out) if args.out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "_", name_gpu.lower()).strip("_")
    reports: list[dict[str, Any]] = []
    for item in args.models.split(","):
        name, batch = split_model_spec(item)
        print(f"[bench] {name} batch {batch}", file=sys.stderr, flush=True)
        try:
            reports.append(run_planned_training(
                name, int(batch or 32), args.limit, args.planner, args.steps, "cuda",
                max_batch_methods=METHODS if args.max_batch else (),
                progress=lambda m: print(f"[bench]   {m}", file=sys.stderr, flush=True)))
        except MemoryLimitError as e:  # this model cannot be planned at this limit: say so, go on
            print(f"[bench]   {e}", file=sys.stderr, flush=True)
            reports.append({"model": name, "batch_size": int(batch or 32), "memory_limit": args.limit,
                            "error": str(e), "methods": {}})
        # written after every model, so that a run cut short keeps what it measured
        result = relative_paths({**provenance(), "gpu": name_gpu, "reports": reports})
        write_text(out / f"runtime_{slug}.json", json.dumps(result, indent=1, default=str) + "\n", overwrite=True)
        write_text(out / f"runtime_{slug}.md", markdown(name_gpu, reports, result), overwrite=True)
    print(markdown(name_gpu, reports))
    return 0


# --------------------------------------------------------------------------- cpu helpers
def workload(name: str, batch: int):  # noqa: ANN201
    """A zoo workload, or ``mlp12``: 12 Linear(1024)-ReLU layers, a deep MLP where recomputing everything pays."""
    from dqn_swap.models import Workload, build_workload

    if name != "mlp12":
        return build_workload(name, batch, "cpu", seed=0)
    import torch

    torch.manual_seed(0)
    layers = [m for _ in range(12) for m in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 1024, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    return Workload("mlp12", model, (x,), lambda out: torch.nn.functional.cross_entropy(out, y),
                    lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, foreach=False))


def record(name: str, batch: int):  # noqa: ANN201
    from dqn_swap.recorder import record_trace

    w = workload(name, batch)
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="cpu",
                        meta={"model": name, "batch_size": batch})


def write(args: argparse.Namespace, result: dict[str, Any], md: str) -> None:
    from common import provenance
    from machine import relative_paths

    print(md)
    result = {**provenance(), **result}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text(Path(args.json), json.dumps(relative_paths(result), indent=1) + "\n", overwrite=True)
        write_text(Path(args.json).with_suffix(".md"), md, overwrite=True)


# --------------------------------------------------------------------------- overhead
def overhead(args: argparse.Namespace) -> int:
    import torch

    from dqn_swap.agents import get_planner
    from dqn_swap.planners import manual_plan
    from dqn_swap.runtime import PlannedExecution
    from dqn_swap.trace import resolve_memory_limit
    from machine import machine

    torch.set_num_threads(args.threads)
    rows = []
    for item in args.models.split(","):
        name, batch = split_model_spec(item)
        trace = record(name, int(batch))
        limit = resolve_memory_limit(trace, args.limit)
        plans = {"empty plan": manual_plan(trace, planner="empty")}
        for planner in args.planners.split(","):  # the shipped agent's, then others for comparison
            plans[f"{planner} plan ({args.limit})"] = get_planner(planner).plan(trace, limit)
        runs: dict[str, Any] = {}
        checks: dict[str, str] = {}
        for label in ["unplanned", *plans]:
            for check in (args.checks.split(",") if label in plans else [""]):
                w = workload(name, int(batch))
                opt = w.make_optimizer(w.model.parameters())
                rt = PlannedExecution(w.model, plans[label], trace, check=check) if label in plans else None
                key = f"{label}|{check}"
                runs[key] = (w, opt, rt, [], [])
                checks[key] = check
        for step in range(args.steps + args.warmup):  # interleaved: the methods share the machine's moods
            for label, (w, opt, rt, times, replays) in runs.items():
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                with rt if rt is not None else nullcontext():
                    loss = w.loss_fn(w.model(*w.example_inputs))
                    loss.backward()
                opt.step()
                if step >= args.warmup:
                    times.append(time.perf_counter() - t0)
                    replays.append(rt.stats.replay_seconds if rt is not None else 0.0)
        base = statistics.median(runs["unplanned|"][3])
        for key, (_, _, rt, times, replays) in runs.items():
            label = key.split("|")[0]
            med = statistics.median(times)
            plan = plans.get(label)
            rows.append({"model": name, "batch_size": int(batch), "method": label, "check": checks[key] or None,
                         "median_step_ms": med * 1e3,
                         "ratio_to_unplanned": med / base, "median_replay_ms": statistics.median(replays) * 1e3,
                         "swaps": plan.n_swap if plan else 0, "recomputes": plan.n_recompute if plan else 0,
                         "recorded_ops": len(rt.index.record_ops) if rt else 0})
            print(f"[bench] {name} {label} {checks[key]}: {med * 1e3:.2f} ms, x{med / base:.3f}", file=sys.stderr,
                  flush=True)
    result = {"machine": machine(), "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
              "command": " ".join(["python", "benchmarks/bench_runtime.py", *sys.argv[1:]]), "rows": rows}
    md = ["Live check `ops`: every forward op's name against the trace (the default); `packs`: the saved tensors "
          "alone (a plan without actions checks its first pack only).", "",
          "| model | batch | method | live check | swaps | recomputes | median step (ms) | / unplanned | "
          "of which re-runs (ms) |",
          "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['batch_size']} | {r['method']} | {r.get('check') or '-'} | {r['swaps']} | "
           f"{r['recomputes']} | {r['median_step_ms']:.2f} | {r['ratio_to_unplanned']:.3f} | "
           f"{r['median_replay_ms']:.2f} |" for r in rows]
    write(args, result, "\n".join(md) + "\n")
    return 0


# --------------------------------------------------------------------------- memory
DEFAULT_MEMORY_MODELS = ",".join([
    # foreign workloads (tests/user_models.py), fp32 and bf16 autocast
    *(f"{n}{p}" for n in ("t5", "distilbert", "gcn", "gin", "se_cnn", "mbconv") for p in ("", "@bf16")),
    # dqn-swap's zoo and the deep MLP, in the same loop
    "resnet_tiny:8", "resnet_tiny:8@bf16", "gpt_tiny:4", "gpt_tiny:4@bf16", "lstm_short:2", "mlp12:256",
    "hf:llama:4", "hf:vit:4@bf16"])


class _Subject:
    """One model of the ``memory`` benchmark in one loop: its trace, and a fresh run of the loop
    (planned or not) giving the measured peak and the state training left."""

    def __init__(self, spec: str, loop: str) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests import user_models as um

        self.um, self.spec, self.loop = um, spec, loop
        base, precision = um.split_precision(spec)
        self.precision = precision
        self.foreign = base in um.USER_MODELS
        if self.foreign:
            self.name, self.batch = base, None
        else:
            self.name, batch = split_model_spec(base)
            self.batch = int(batch or 2)
        if loop == "accumulate":
            self.trace = um.record(self.build())
        else:
            from dqn_swap.recorder import record_trace

            w = self.build()
            w.feed(0)
            self.trace = record_trace(w.model, w.inputs, w.loss_fn, w.make_optimizer, device="cpu",
                                      meta={"model": spec})

    def build(self):  # noqa: ANN201
        um = self.um
        if self.foreign:
            return um.build(self.spec)
        w = workload(self.name, self.batch)
        return um.from_zoo(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, self.spec,
                           bf16=self.precision == "bf16")

    def run(self, plan: Any, backend: Any = None) -> tuple[int, dict[str, Any]]:
        import torch

        from dqn_swap.integrations.experiment import measured_cpu_peak
        from dqn_swap.runtime import PlannedExecution

        um = self.um
        if self.loop == "accumulate":
            loop = um.start(self.build())
            rt = PlannedExecution(loop.w.model, plan, self.trace, backend=backend) if plan is not None else None
            return um.measured_loop_peak(loop, rt, self.trace.initial_bytes), um.state_of(loop)
        w = self.build()
        w.feed(0)
        opt = w.make_optimizer(w.model.parameters())
        rt = PlannedExecution(w.model, plan, self.trace, backend=backend) if plan is not None else None
        torch.manual_seed(um.LOOP_SEED)
        measured = measured_cpu_peak(w.model, w.inputs, w.loss_fn, opt, rt, self.trace.initial_bytes)
        return measured, um.state_of(um.Loop(w, opt, None))


def memory(args: argparse.Namespace) -> int:
    """The ``memory`` subcommand.

    Every (model, planner, limit) case with a feasible, non-empty plan: the peak of planned training
    measured with the CPU allocator's timeline, against the limit and the simulator's prediction
    (the plan's memory when copies take no time, as on the CPU), and whether the whole state that
    training leaves (``state_dict``, optimizer state, scheduler state, losses) is bit-identical to
    unplanned training of the same loop from the same seeds.

    Models: dqn-swap's zoo (``resnet_tiny:8``, ``hf:llama:4``, ``mlp12:256`` ...) and the foreign
    workloads of ``tests/user_models.py`` (``t5``, ``distilbert``, ``gcn``, ``gin``, ``se_cnn``,
    ``mbconv``: their own batch), any of them with ``@bf16`` for bf16 autocast.

    Loops (``--loop``):

    ``accumulate`` (the default)
        The loop of ``tests/user_models.py`` (``train_iteration``): ``zero_grad(set_to_none=True)``,
        then two micro-batches, each copied into the static input tensors and run forward and
        backward under the plan (``with runtime``) with the loss halved, gradients accumulating;
        after the second, ``clip_grad_norm_(params, 1.0)``, the optimizer's step (AdamW with two
        parameter groups for the foreign models, the zoo's own optimizer otherwise) and the LR
        scheduler's step; each micro-step's output and loss die at its end.  The trace is the
        loop's last micro-step (``user_models.record``): the recorder's "optimizer" keeps the
        gradients of the first micro-step (declared as state alive before the iteration, so
        ``trace.initial_bytes`` counts them), and its step clips, steps and schedules.  So the
        recorded iteration is forward, backward accumulating into the gradients, clipping, AdamW,
        scheduler: the measured micro-step 1.  Micro-step 0 runs the same plan with at most as
        much memory at every op (its gradients appear during its backward, ``zero_grad`` having
        freed the previous ones), so the iteration's peak is micro-step 1's.  It is measured as
        ``measured_cpu_peak`` does: three iterations, each under the allocator's timeline, the
        last one's peak above its start (when the previous iteration's gradients are alive, as
        in the trace) plus ``trace.initial_bytes``.
    ``plain``
        ``measured_cpu_peak`` itself: zero_grad, forward, backward, step, one batch.

    The unplanned row of each model is the same loop without a runtime: its measured peak is the
    trace's (the control).
    """
    import torch

    from dqn_swap.agents import get_planner
    from dqn_swap.simulator import instant_copy_peak, simulate
    from dqn_swap.trace import resolve_memory_limit
    from machine import commit, machine

    from dqn_swap.runtime.standin import StandInBackend

    torch.set_num_threads(args.threads)
    late = float(args.late_copies or 0.0)
    t_start = time.perf_counter()
    rows = []
    for spec in args.models.split(","):
        t0 = time.perf_counter()
        subject = _Subject(spec, args.loop)
        trace = subject.trace
        unplanned, ref_state = subject.run(None)
        base = {"model": spec, "name": subject.name, "foreign": subject.foreign, "precision": subject.precision,
                "batch_size": subject.batch}
        rows.append({**base, "planner": "unplanned", "limit": "100%", "limit_bytes": trace.peak_bytes,
                     "measured": unplanned, "predicted": trace.peak_bytes, "simulated_peak": trace.peak_bytes,
                     "initial_bytes": trace.initial_bytes, "identical": True})
        print(f"[bench] {spec}: recorded, unplanned measured/trace peak {unplanned / trace.peak_bytes:.4f} "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        for planner in args.planners.split(","):
            for pct in args.limits.split(","):
                limit = resolve_memory_limit(trace, pct)
                agent = {"agent": args.agent} if args.agent and planner in ("dqn", "dqn-search") else {}
                if args.members is not None and planner == "dqn":
                    agent |= {"members": True, "more_agents": args.members}
                plan = get_planner(planner, **agent).plan(trace, limit)
                result = simulate(trace, plan)
                if not plan.actions or not result.feasible:
                    continue
                # Copies that take no time (the CPU) hold the plan's schedule with instant copies; late ones
                # (the stand-in) hold the simulation's memory, the host waiting where the plan frees bytes.
                predicted = int(result.peak_bytes) if late else instant_copy_peak(trace, plan, result)
                row = {**base, "planner": planner, "limit": pct, "limit_bytes": limit, "predicted": predicted,
                       "simulated_peak": int(result.peak_bytes), "swaps": plan.n_swap,
                       "recomputes": plan.n_recompute}
                backend = StandInBackend(delay=late) if late else None
                try:
                    measured, state = subject.run(plan, backend)
                except Exception as e:  # noqa: BLE001 -- a failing case is a row, not the end of the run
                    row.update(measured=None, identical=False, error=f"{type(e).__name__}: {str(e)[:300]}")
                    rows.append(row)
                    print(f"[bench] {spec} {planner} {pct}: {row['error']}", file=sys.stderr, flush=True)
                    continue
                finally:
                    if backend is not None:
                        backend.close()
                        row["copy_violations"] = len(backend.violations)
                diffs = subject.um.differences(ref_state, state)
                row.update(measured=measured, identical=not diffs, differences=diffs[:5])
                rows.append(row)
                print(f"[bench] {spec} {planner} {pct}: measured/limit {measured / limit:.4f}, "
                      f"measured/predicted {measured / predicted:.4f}, identical {not diffs}",
                      file=sys.stderr, flush=True)
    planned = [r for r in rows if r["planner"] != "unplanned"]
    ok = [r for r in planned if r.get("measured") is not None]
    for r in ok:
        r["measured_over_limit"] = r["measured"] / r["limit_bytes"]
        r["measured_over_predicted"] = r["measured"] / r["predicted"]
        r["holds"] = (r["measured"] <= r["limit_bytes"] and 0.95 <= r["measured_over_predicted"] <= 1.0
                      and r["identical"] and not r.get("copy_violations"))

    def case(r: dict[str, Any]) -> str:
        return f"{r['model']} {r['planner']} {r['limit']}"

    worst_limit = max(ok, key=lambda r: r["measured_over_limit"], default=None)
    summary = {
        "cases": len(planned),
        "models": len({r["name"] for r in planned}),
        "foreign_models": len({r["name"] for r in planned if r["foreign"]}),
        "model_variants": len({r["model"] for r in planned}),
        "planners": sorted({r["planner"] for r in planned}),
        "limits": sorted({r["limit"] for r in planned}),
        "precisions": sorted({r["precision"] for r in planned}),
        "errors": len(planned) - len(ok),
        "over_limit": sum(r["measured"] > r["limit_bytes"] for r in ok),
        "max_measured_over_limit": worst_limit["measured_over_limit"] if worst_limit else None,
        "max_measured_over_limit_case": case(worst_limit) if worst_limit else None,
        "min_measured_over_predicted": min((r["measured_over_predicted"] for r in ok), default=None),
        "max_measured_over_predicted": max((r["measured_over_predicted"] for r in ok), default=None),
        "outside_0.95_1.00": sum(not 0.95 <= r["measured_over_predicted"] <= 1.0 for r in ok),
        "bit_identical": sum(bool(r.get("identical")) for r in planned),
        "property_holds": sum(bool(r.get("holds")) for r in ok),
        "unplanned_measured_over_trace_peak": {r["model"]: r["measured"] / r["limit_bytes"]
                                               for r in rows if r["planner"] == "unplanned"},
        "seconds": time.perf_counter() - t_start,
    }
    if late:
        summary["copy_violations"] = sum(r.get("copy_violations", 0) for r in planned)
    result = {"machine": machine(), **commit(), "threads": args.threads, "loop": args.loop, "late_copies": late,
              "command": " ".join(["python", "benchmarks/bench_runtime.py", *sys.argv[1:]]),
              "summary": summary, "rows": rows}
    write(args, result, memory_markdown(result))
    return 0 if summary["property_holds"] == len(planned) else 1


def host(args: argparse.Namespace) -> int:
    """The ``host`` subcommand: the runtime's own cost per saved tensor, on the CPU.

    A chain of ``--ops`` ``tanh`` on a 16-element tensor (each saves its output: one saved tensor
    per op, next to no compute), trained unplanned and under an empty plan, a plan swapping every
    saved activation and one recomputing every other one (each re-run is one op), each with the op
    check and with the saves alone; the methods' steps interleaved, CPU seconds of the thread.  The cost per saved tensor
    is (planned step - unplanned step) / saved tensors."""
    import torch

    from dqn_swap.planners import manual_plan, recomputable_activations, saved_activations
    from dqn_swap.recorder import record_trace
    from dqn_swap.runtime import PlannedExecution
    from machine import commit, machine

    torch.set_num_threads(1)

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x * self.w
            for _ in range(args.ops):
                x = torch.tanh(x)
            return x

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return out.sum()

    x = torch.randn(16)
    trace = record_trace(Chain(), (x,), loss_fn, lambda p: torch.optim.SGD(p, lr=0.01), device="cpu")
    acts = saved_activations(trace)
    # Every other activation recomputed: each re-run is one op (removing them all would re-run the
    # chain from its input for each, quadratic work that is the plan's, not the runtime's).
    plans = {"empty": manual_plan(trace, planner="empty"), "swap every activation": manual_plan(trace, swap=acts),
             "recompute every other activation": manual_plan(trace, recompute=recomputable_activations(trace)[1::2])}
    runs: dict[str, Any] = {}
    for label in ["unplanned", *plans]:
        for check in (args.checks.split(",") if label in plans else [""]):
            model = Chain()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            rt = PlannedExecution(model, plans[label], trace, check=check) if label in plans else None
            runs[f"{label}|{check}"] = (model, opt, rt, [])
    for step in range(args.steps + args.warmup):
        for key, (model, opt, rt, times) in runs.items():
            t0 = time.thread_time()
            opt.zero_grad(set_to_none=True)
            with rt if rt is not None else nullcontext():
                loss_fn(model(x)).backward()
            opt.step()
            if step >= args.warmup:
                times.append(time.thread_time() - t0)
    base = statistics.median(runs["unplanned|"][3])
    n_saved = len(trace.saved)
    rows = []
    for key, (_, _, rt, times) in runs.items():
        label, check = key.split("|")
        med = statistics.median(times)
        plan = plans.get(label)
        rows.append({"method": label, "check": check or None, "saved_tensors": n_saved,
                     "swaps": plan.n_swap if plan else 0, "recomputes": plan.n_recompute if plan else 0,
                     "median_step_us": med * 1e6, "us_per_saved_tensor": (med - base) * 1e6 / n_saved})
        print(f"[bench] {label} {check}: {med * 1e6:.0f} us, {(med - base) * 1e6 / n_saved:.1f} us per saved tensor",
              file=sys.stderr, flush=True)
    result = {"machine": machine(), **commit(), "ops": args.ops, "steps": args.steps,
              "command": " ".join(["python", "benchmarks/bench_runtime.py", *sys.argv[1:]]), "rows": rows}
    md = [f"A chain of {args.ops} `tanh` on 16 elements ({n_saved} saved tensors, next to no compute), one "
          "thread; median CPU time of the thread per step, the methods interleaved. Live check `ops`: every "
          "forward op's name (the default); `packs`: the saves alone.", "",
          "| method | live check | swaps | recomputes | step (us) | runtime's cost per saved tensor (us) |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['method']} | {r['check'] or '-'} | {r['swaps']} | {r['recomputes']} | {r['median_step_us']:.0f} | "
           f"{r['us_per_saved_tensor']:.1f} |" for r in rows]
    write(args, result, "\n".join(md) + "\n")
    return 0


def clock(args: argparse.Namespace) -> int:
    """The ``clock`` subcommand: planned training through the real runtime on the virtual clock
    (:class:`dqn_swap.runtime.clock.VirtualClockBackend`) against the simulator.

    Every (model, planner, limit) case with a feasible, non-empty plan of the ``memory`` benchmark's
    models, in its plain loop (one batch: forward and backward under the plan, the optimizer's
    step): the step's virtual time (the second step; the first fills the pool of host buffers)
    beside the simulator's makespan for the same plan and profile, and the time the host waited
    for copies.  The unplanned row of each model is its virtual step against the trace's summed
    op times (the control: the clock's op times are the trace's)."""
    import torch

    from dqn_swap.agents import get_planner
    from dqn_swap.cost import get_profile
    from dqn_swap.runtime import PlannedExecution
    from dqn_swap.runtime.clock import VirtualClockBackend
    from dqn_swap.simulator import schedule_plan, simulate
    from dqn_swap.trace import resolve_memory_limit
    from machine import commit, machine

    torch.set_num_threads(args.threads)
    profile = get_profile(args.profile)
    rows = []
    t_start = time.perf_counter()
    for spec in args.models.split(","):
        subject = _Subject(spec, "plain")
        trace = subject.trace.with_durations(profile.compute_time(subject.trace.op_flops, subject.trace.op_bytes,
                                                                  subject.trace.op_flops > 0))

        def step(plan: Any) -> tuple[float, VirtualClockBackend]:
            w = subject.build()
            w.feed(0)
            opt = w.make_optimizer(w.model.parameters())
            backend = VirtualClockBackend(profile)
            rt = PlannedExecution(w.model, plan, trace, backend=backend) if plan is not None else None
            torch.manual_seed(subject.um.LOOP_SEED)
            seconds = 0.0
            for _ in range(2):
                opt.zero_grad(set_to_none=True)
                backend.waited_seconds = backend.compute_seconds = 0.0
                with backend.ops():
                    start = backend.now
                    with rt if rt is not None else contextlib.nullcontext():
                        out = w.model(*w.inputs)
                        w.loss_fn(out).backward()
                    opt.step()
                    seconds = backend.now - start
                    del out
            return seconds, backend

        base, _ = step(None)
        total = float(trace.op_duration.sum())
        rows.append({"model": spec, "planner": "unplanned", "limit": "100%", "virtual_s": base, "simulated_s": total,
                     "ratio": base / total})
        print(f"[clock] {spec}: unplanned virtual/trace {base / total:.4f}", file=sys.stderr, flush=True)
        for planner in args.planners.split(","):
            for pct in args.limits.split(","):
                plan = get_planner(planner).plan(trace, resolve_memory_limit(trace, pct))
                result = simulate(trace, plan)
                if not plan.actions or not result.feasible:
                    continue
                plan = schedule_plan(trace, plan)
                try:
                    seconds, backend = step(plan)
                except Exception as e:  # noqa: BLE001 -- a failing case is a row
                    rows.append({"model": spec, "planner": planner, "limit": pct, "error": f"{type(e).__name__}: {e}"[:300]})
                    continue
                row = {"model": spec, "planner": planner, "limit": pct, "swaps": plan.n_swap,
                       "recomputes": plan.n_recompute, "virtual_s": seconds, "simulated_s": float(result.makespan),
                       "ratio": seconds / float(result.makespan), "waited_s": backend.waited_seconds,
                       "compute_s": backend.compute_seconds, "unplanned_s": base}
                rows.append(row)
                print(f"[clock] {spec} {planner} {pct}: virtual/simulated {row['ratio']:.4f} ({plan.n_swap} swaps, "
                      f"{plan.n_recompute} recomputes, waited {1e3 * backend.waited_seconds:.3f} ms)",
                      file=sys.stderr, flush=True)
    planned = [r for r in rows if r["planner"] != "unplanned"]
    ok = [r for r in planned if "ratio" in r]
    summary = {"cases": len(planned), "errors": len(planned) - len(ok),
               "within_2pct": sum(abs(r["ratio"] - 1) <= 0.02 for r in ok),
               "min_ratio": min((r["ratio"] for r in ok), default=None),
               "max_ratio": max((r["ratio"] for r in ok), default=None),
               "unplanned_ratio": {r["model"]: r["ratio"] for r in rows if r["planner"] == "unplanned"},
               "seconds": time.perf_counter() - t_start}
    result = {"machine": machine(), **commit(), "profile": profile.name,
              "command": " ".join(["python", "benchmarks/bench_runtime.py", *sys.argv[1:]]), "summary": summary,
              "rows": rows}
    lines = [f"# The runtime on the virtual clock against the simulator ({profile.name})", "",
             f"{summary['within_2pct']} of {summary['cases']} planned cases within 2 % of the simulated makespan "
             f"(virtual/simulated {summary['min_ratio']:.4f} to {summary['max_ratio']:.4f}); errors: "
             f"{summary['errors']}.", "",
             "| model | planner | limit | swaps | recomputes | virtual ms | simulated ms | ratio | host waited ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ratio" not in r:
            lines.append(f"| {r['model']} | {r['planner']} | {r['limit']} | error: {r['error']} |||||")
            continue
        lines.append(f"| {r['model']} | {r['planner']} | {r['limit']} | {r.get('swaps', '')} | {r.get('recomputes', '')} "
                     f"| {1e3 * r['virtual_s']:.3f} | {1e3 * r['simulated_s']:.3f} | {r['ratio']:.4f} | "
                     f"{1e3 * r.get('waited_s', 0.0):.3f} |")
    write(args, result, "\n".join(lines) + "\n")
    return 0


def memory_markdown(result: dict[str, Any]) -> str:
    s = result["summary"]

    def f(v: Any, fmt: str = "{:.4f}") -> str:
        return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"

    loop = ("gradient accumulation over 2 micro-batches, clip_grad_norm_, LR scheduler"
            if result["loop"] == "accumulate" else "one batch per step (measured_cpu_peak)")
    lines = [f"# Planned training's measured CPU peak ({result['loop']} loop)", "",
             f"`{result['command']}`  ", f"commit {result['commit']}"
             + (f" (modified: {', '.join(result['modified'])})" if result["modified"] else "") + "  ",
             f"{result['machine']}, {result['threads']} thread(s); loop: {loop}", ""]
    if result.get("late_copies"):
        lines += [f"On the stand-in device whose copies each take {result['late_copies'] * 1e3:g} ms (far behind the "
                  "host, as a GPU's copies are behind a host that queues kernels): the prediction is the simulated "
                  f"peak, and {s['copy_violations']} uses of a buffer a pending copy touched were found.", ""]
    lines += [
             f"**{s['cases']} planned cases** over {s['models']} models ({s['foreign_models']} foreign; "
             f"{s['model_variants']} model/precision variants: {', '.join(s['precisions'])}), planners "
             f"{', '.join(s['planners'])}, limits {', '.join(s['limits'])}: **{s['over_limit']} above their "
             f"limit** (largest measured/limit {f(s['max_measured_over_limit'])}, {s['max_measured_over_limit_case']}); "
             f"measured/predicted {f(s['min_measured_over_predicted'])} to {f(s['max_measured_over_predicted'])} "
             f"({s['outside_0.95_1.00']} outside [0.95, 1.00]); **{s['bit_identical']} bit-identical** to "
             f"unplanned training; {s['errors']} errors; the property (under the limit, within [0.95, 1.00] of the "
             f"prediction, bit-identical) holds in {s['property_holds']} of {s['cases']} cases. "
             f"{s['seconds']:.0f} s.", ""]
    failing = [r for r in result["rows"] if r["planner"] != "unplanned" and not r.get("holds")]
    header = ("| model | precision | planner | limit | swaps | recomputes | limit (B) | predicted (B) | measured (B) "
              "| measured/limit | measured/predicted | bit-identical |")
    rule = "|---|---|---|---|---|---|---|---|---|---|---|---|"

    def row(r: dict[str, Any]) -> str:
        m = r.get("measured")
        ident = "yes" if r.get("identical") else ("error: " + r["error"][:80] if r.get("error") else
                                                  "no: " + "; ".join(r.get("differences", []))[:80])
        return (f"| {r['model']} | {r['precision']} | {r['planner']} | {r['limit']} | {r.get('swaps', 0)} | "
                f"{r.get('recomputes', 0)} | {r['limit_bytes']} | {r['predicted']} | {m if m is not None else '-'} | "
                f"{f(m / r['limit_bytes'] if m is not None else None)} | "
                f"{f(m / r['predicted'] if m is not None else None)} | {ident} |")

    lines += [f"## Failing cases ({len(failing)})", "",
              "Measured above the limit, outside [0.95, 1.00] of the prediction, not bit-identical, or raised.", ""]
    lines += [header, rule, *(row(r) for r in failing)] if failing else ["none"]
    lines += ["", "## All cases", "", header, rule, *(row(r) for r in result["rows"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("gpu", "overhead", "memory", "clock", "host"):
        argv = ["gpu", *argv]
    p = argparse.ArgumentParser(description="benchmark the planned-execution runtime")
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gpu", help="planned training on a CUDA GPU beside the alternatives")
    g.add_argument("--models", default="resnet50:64,gpt:8", help="name:batch pairs, comma-separated")
    g.add_argument("--limit", default="0.5x",
                   help="memory limit (default 0.5x: half the unplanned peak; a model whose minimum is above it is "
                        "reported as such; 50%%: halfway from the trace's minimum to its peak, always plannable)")
    g.add_argument("--out", help="folder of the result files (default benchmarks/results)")
    g.add_argument("--planner", default="greedy")
    g.add_argument("--steps", type=int, default=10)
    g.add_argument("--max-batch", action="store_true", help="also search the largest batch under the limit")
    g.set_defaults(func=gpu)
    o = sub.add_parser("overhead", help="CPU step time of an empty and of the agent's plan against unplanned")
    o.add_argument("--models", default="resnet_tiny:8,gpt_tiny:4")
    o.add_argument("--limit", default="50%", help="limit of the planners' plans (default 50%%)")
    o.add_argument("--planners", default="dqn,sqrt-n,lru",
                   help="planners whose plans are timed (default: the shipped agent, and the recompute-only and "
                        "mixed baselines, which exercise the dispatch mode)")
    o.add_argument("--checks", default="ops,packs",
                   help="live checks to time each plan with (default ops,packs: every forward op's name, and the "
                        "saved tensors alone)")
    o.add_argument("--steps", type=int, default=40)
    o.add_argument("--warmup", type=int, default=3)
    o.add_argument("--threads", type=int, default=1)
    o.add_argument("--json", help="write the figures here (and a .md beside)")
    o.set_defaults(func=overhead)
    m = sub.add_parser("memory", help="CPU measured peak against the limit and the prediction, and bit-identity")
    m.add_argument("--models", default=DEFAULT_MEMORY_MODELS,
                   help="comma-separated: zoo name:batch pairs (resnet_tiny:8, hf:llama:4, mlp12:256), the foreign "
                        "workloads of tests/user_models.py (t5, distilbert, gcn, gin, se_cnn, mbconv), any with "
                        "@bf16 for bf16 autocast")
    m.add_argument("--loop", choices=("accumulate", "plain"), default="accumulate",
                   help="accumulate (default): 2 micro-batches, clip_grad_norm_, LR scheduler; plain: "
                        "measured_cpu_peak's one-batch loop")
    m.add_argument("--planners", default="greedy,vdnn,lru,sqrt-n,window,tflms,layrub,dqn",
                   help="planners of dqn-swap run (the baselines, dqn, swap-all, recompute-all)")
    m.add_argument("--agent", help="agent file of the dqn planners (default: the shipped agent, checkpoints/default.pt)")
    m.add_argument("--members", nargs="*", metavar="AGENT_FILE",
                   help="the dqn planner decodes --agent (an ensemble) by members, with these agent files too")
    m.add_argument("--limits", default="70%,50%,30%")
    m.add_argument("--threads", type=int, default=1)
    m.add_argument("--late-copies", type=float, default=0.0, metavar="SECONDS",
                   help="run on the stand-in device whose copies each take SECONDS (0: the CPU, copies at once); "
                        "the prediction is then the simulated peak, and copy-use violations are counted")
    m.add_argument("--json", help="write the figures here (and a .md beside)")
    m.set_defaults(func=memory)
    h = sub.add_parser("host", help="the runtime's own CPU cost per saved tensor, on a chain of tiny ops")
    h.add_argument("--ops", type=int, default=256)
    h.add_argument("--checks", default="ops,packs")
    h.add_argument("--steps", type=int, default=200)
    h.add_argument("--warmup", type=int, default=5)
    h.add_argument("--json", help="write the figures here (and a .md beside)")
    h.set_defaults(func=host)
    c = sub.add_parser("clock", help="the runtime's step time on the virtual clock against the simulated makespan")
    c.add_argument("--models", default=DEFAULT_MEMORY_MODELS, help="as for memory (plain loop)")
    c.add_argument("--planners", default="greedy,vdnn,lru,sqrt-n,window,tflms,layrub,dqn")
    c.add_argument("--limits", default="70%,50%,30%")
    c.add_argument("--profile", default="v100-pcie3", help="device profile of the clock and the simulator")
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--json", help="write the figures here (and a .md beside)")
    c.set_defaults(func=clock)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
