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

``memory`` (CPU)
    The peak of planned training measured with the allocator's timeline, for
    every (model, planner, limit) case with a feasible plan, against the limit
    and against the simulator's prediction; reports the largest ratios.

    python benchmarks/bench_runtime.py [gpu] [--steps 10] [--planner dqn] [--max-batch]
    python benchmarks/bench_runtime.py overhead --json benchmarks/results/runtime_overhead_cpu.json
    python benchmarks/bench_runtime.py memory --json benchmarks/results/runtime_memory_cpu.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from dqn_swap.models import split_model_spec

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))


# --------------------------------------------------------------------------- gpu
def markdown(gpu: str, reports: list[dict[str, Any]]) -> str:
    lines = [f"# Planned-execution runtime on {gpu}", "",
             "| model | batch | limit | method | status | step ms | samples/s | peak allocated | peak reserved |",
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
    lines += ["", "| model | plan | within limit | vs unplanned | vs checkpoint | vs save_on_cpu | "
                  "measured overhead | predicted overhead | step-time error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        c = r.get("comparison", {})

        def f(key: str, fmt: str = "{:.3f}") -> str:
            v = c.get(key)
            return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v or "")

        lines.append(f"| {r['model']} | {r['plan']['planner']}: {r['plan']['swaps']} swaps, "
                     f"{r['plan']['recomputes']} recomputes | {c.get('planned_peak_within_limit')} | "
                     f"{f('throughput_vs_unplanned')} | {f('throughput_vs_checkpoint')} | "
                     f"{f('throughput_vs_save_on_cpu')} | {f('measured_overhead')} | {f('predicted_overhead')} | "
                     f"{f('simulator_step_time_error')} |")
    return "\n".join(lines) + "\n"


def gpu(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench_runtime: needs a CUDA GPU (none available); nothing measured", file=sys.stderr)
        return 2
    from dqn_swap.cli.experiment import METHODS, run_planned_training

    name_gpu = torch.cuda.get_device_name()
    limit = args.limit
    reports = []
    for item in args.models.split(","):
        name, batch = split_model_spec(item)
        print(f"[bench] {name} batch {batch}", file=sys.stderr, flush=True)
        reports.append(run_planned_training(
            name, int(batch or 32), limit, args.planner, args.steps, "cuda",
            max_batch_methods=METHODS if args.max_batch else (),
            progress=lambda m: print(f"[bench]   {m}", file=sys.stderr, flush=True)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "_", name_gpu.lower()).strip("_")
    (RESULTS / f"runtime_{slug}.json").write_text(json.dumps({"gpu": name_gpu, "reports": reports}, indent=1,
                                                             default=str) + "\n")
    (RESULTS / f"runtime_{slug}.md").write_text(markdown(name_gpu, reports))
    print(markdown(name_gpu, reports))
    return 0


# --------------------------------------------------------------------------- cpu helpers
def workload(name: str, batch: int):  # noqa: ANN201
    """A zoo workload, or ``mlp12``: 12 Linear(1024)-ReLU layers, the issue's recompute-all example."""
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
    print(md)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.json).with_suffix(".md").write_text(md)


# --------------------------------------------------------------------------- overhead
def overhead(args: argparse.Namespace) -> int:
    import torch

    from dqn_swap.agents import get_planner
    from dqn_swap.runtime import PlannedExecution, make_plan
    from dqn_swap.trace import resolve_memory_limit
    from machine import machine

    torch.set_num_threads(args.threads)
    rows = []
    for item in args.models.split(","):
        name, batch = split_model_spec(item)
        trace = record(name, int(batch))
        limit = resolve_memory_limit(trace, args.limit)
        plans = {"empty plan": make_plan(trace, planner="empty")}
        for planner in args.planners.split(","):  # the shipped agent's, then others for comparison
            plans[f"{planner} plan ({args.limit})"] = get_planner(planner).plan(trace, limit)
        runs: dict[str, Any] = {}
        for label in ["unplanned", *plans]:
            w = workload(name, int(batch))
            opt = w.make_optimizer(w.model.parameters())
            rt = PlannedExecution(w.model, plans[label], trace) if label in plans else None
            runs[label] = (w, opt, rt, [], [])
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
        base = statistics.median(runs["unplanned"][3])
        for label, (_, _, rt, times, replays) in runs.items():
            med = statistics.median(times)
            plan = plans.get(label)
            rows.append({"model": name, "batch_size": int(batch), "method": label, "median_step_ms": med * 1e3,
                         "ratio_to_unplanned": med / base, "median_replay_ms": statistics.median(replays) * 1e3,
                         "swaps": plan.n_swap if plan else 0, "recomputes": plan.n_recompute if plan else 0,
                         "recorded_ops": len(rt.index.record_ops) if rt else 0})
            print(f"[bench] {name} {label}: {med * 1e3:.2f} ms, x{med / base:.3f}", file=sys.stderr, flush=True)
    result = {"machine": machine(), "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
              "command": " ".join(["python", "benchmarks/bench_runtime.py", *sys.argv[1:]]), "rows": rows}
    md = ["| model | batch | method | swaps | recomputes | median step (ms) | / unplanned | of which re-runs (ms) |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['batch_size']} | {r['method']} | {r['swaps']} | {r['recomputes']} | "
           f"{r['median_step_ms']:.2f} | {r['ratio_to_unplanned']:.3f} | {r['median_replay_ms']:.2f} |" for r in rows]
    write(args, result, "\n".join(md) + "\n")
    return 0


# --------------------------------------------------------------------------- memory
def memory(args: argparse.Namespace) -> int:
    import torch

    from dqn_swap.cli.experiment import get_run_planner, measured_cpu_peak
    from dqn_swap.runtime import PlannedExecution
    from dqn_swap.simulator import Simulator, simulate
    from dqn_swap.trace import resolve_memory_limit
    from machine import machine

    torch.set_num_threads(args.threads)
    rows = []
    for item in args.models.split(","):
        name, batch = split_model_spec(item)
        trace = record(name, int(batch))
        w = workload(name, int(batch))
        unplanned = measured_cpu_peak(w.model, w.example_inputs, w.loss_fn, w.make_optimizer(w.model.parameters()),
                                      None, trace.initial_bytes)
        rows.append({"model": name, "batch_size": int(batch), "planner": "unplanned", "limit": "100%",
                     "limit_bytes": trace.peak_bytes, "measured": unplanned, "predicted": trace.peak_bytes,
                     "simulated_peak": trace.peak_bytes})
        for planner in args.planners.split(","):
            for pct in args.limits.split(","):
                limit = resolve_memory_limit(trace, pct)
                plan = get_run_planner(planner).plan(trace, limit)
                result = simulate(trace, plan)
                if not plan.actions or not result.feasible:
                    continue
                predicted = int(Simulator(trace, limit).instant_copy_memory(plan.actions, result.schedule).max())
                w = workload(name, int(batch))
                opt = w.make_optimizer(w.model.parameters())
                measured = measured_cpu_peak(w.model, w.example_inputs, w.loss_fn, opt,
                                             PlannedExecution(w.model, plan, trace), trace.initial_bytes)
                rows.append({"model": name, "batch_size": int(batch), "planner": planner, "limit": pct,
                             "limit_bytes": limit, "measured": measured, "predicted": predicted,
                             "simulated_peak": int(result.peak_bytes), "swaps": plan.n_swap,
                             "recomputes": plan.n_recompute})
                print(f"[bench] {name} {planner} {pct}: measured/limit {measured / limit:.4f}, "
                      f"measured/predicted {measured / predicted:.4f}", file=sys.stderr, flush=True)
    planned = [r for r in rows if r["planner"] != "unplanned"]
    worst_limit = max(planned, key=lambda r: r["measured"] / r["limit_bytes"])
    worst_pred = max(planned, key=lambda r: abs(r["measured"] / r["predicted"] - 1))
    summary = {"cases": len(planned), "over_limit": sum(r["measured"] > r["limit_bytes"] for r in planned),
               "max_measured_over_limit": worst_limit["measured"] / worst_limit["limit_bytes"],
               "max_measured_over_limit_case": f"{worst_limit['model']} {worst_limit['planner']} {worst_limit['limit']}",
               "max_abs_measured_over_predicted_minus_1": abs(worst_pred["measured"] / worst_pred["predicted"] - 1),
               "max_measured_over_predicted": max(r["measured"] / r["predicted"] for r in planned),
               "min_measured_over_predicted": min(r["measured"] / r["predicted"] for r in planned)}
    result = {"machine": machine(), "command": " ".join(["python", "benchmarks/bench_runtime.py", *sys.argv[1:]]),
              "summary": summary, "rows": rows}
    md = [f"{summary['cases']} planned cases, {summary['over_limit']} above their limit; largest measured/limit "
          f"{summary['max_measured_over_limit']:.4f} ({summary['max_measured_over_limit_case']}); measured/predicted "
          f"{summary['min_measured_over_predicted']:.4f} to {summary['max_measured_over_predicted']:.4f}", "",
          "| model | planner | limit | swaps | recomputes | limit (B) | predicted (B) | measured (B) | measured/limit "
          "| measured/predicted |", "|---|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['model']} b{r['batch_size']} | {r['planner']} | {r['limit']} | {r.get('swaps', 0)} | "
           f"{r.get('recomputes', 0)} | {r['limit_bytes']} | {r['predicted']} | {r['measured']} | "
           f"{r['measured'] / r['limit_bytes']:.4f} | {r['measured'] / r['predicted']:.4f} |" for r in rows]
    write(args, result, "\n".join(md) + "\n")
    return 0 if summary["over_limit"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("gpu", "overhead", "memory"):
        argv = ["gpu", *argv]
    p = argparse.ArgumentParser(description="benchmark the planned-execution runtime")
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gpu", help="planned training on a CUDA GPU beside the alternatives")
    g.add_argument("--models", default="resnet50:64,gpt:8", help="name:batch pairs, comma-separated")
    g.add_argument("--limit", default="0.5x", help="memory limit (default 0.5x: half the unplanned peak)")
    g.add_argument("--planner", default="greedy")
    g.add_argument("--steps", type=int, default=10)
    g.add_argument("--max-batch", action="store_true", help="also search the largest batch under the limit")
    g.set_defaults(func=gpu)
    o = sub.add_parser("overhead", help="CPU step time of an empty and of the agent's plan against unplanned")
    o.add_argument("--models", default="resnet_tiny:8,gpt_tiny:4")
    o.add_argument("--limit", default="50%", help="limit of the planners' plans (default 50%%)")
    o.add_argument("--planners", default="dqn,checkpoint,lru",
                   help="planners whose plans are timed (default: the shipped agent, and the recompute-only and "
                        "mixed baselines, which exercise the dispatch mode)")
    o.add_argument("--steps", type=int, default=40)
    o.add_argument("--warmup", type=int, default=3)
    o.add_argument("--threads", type=int, default=1)
    o.add_argument("--json", help="write the figures here (and a .md beside)")
    o.set_defaults(func=overhead)
    m = sub.add_parser("memory", help="CPU measured peak against the limit and the prediction")
    m.add_argument("--models", default="resnet_tiny:8,gpt_tiny:4,mlp12:2048,resnet18:2",
                   help="name:batch pairs: zoo networks, or mlp12 (12 Linear(1024)-ReLU layers)")
    m.add_argument("--planners", default="greedy,vdnn,lru,checkpoint,window,tflms,layrub,dqn,recompute-all",
                   help="planners of dqn-swap run (the baselines, dqn, swap-all, recompute-all)")
    m.add_argument("--limits", default="90%,70%,50%,30%")
    m.add_argument("--threads", type=int, default=1)
    m.add_argument("--json", help="write the figures here (and a .md beside)")
    m.set_defaults(func=memory)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
