#!/usr/bin/env python
"""Benchmark the planned-execution runtime on a GPU.

For ResNet-50 and GPT at 50% of the unplanned peak: planned training beside
unplanned training, full activation checkpointing and ``save_on_cpu``; measured
peak allocated vs the limit; throughput ratios; simulator-predicted overhead vs
measured.  Writes ``benchmarks/results/runtime_<gpu>.json`` and ``.md``.

Without a CUDA GPU it prints one line saying so and exits with status 2.

    python benchmarks/bench_runtime.py [--steps 10] [--planner greedy] [--models resnet50:64,gpt:8]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="benchmark the planned-execution runtime (needs a CUDA GPU)")
    p.add_argument("--models", default="resnet50:64,gpt:8", help="name:batch pairs, comma-separated")
    p.add_argument("--limit", default="0.5", help="fraction of the unplanned peak, or bytes")
    p.add_argument("--planner", default="greedy")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--max-batch", action="store_true", help="also search the largest batch under the limit")
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_runtime: needs a CUDA GPU (none available); nothing measured", file=sys.stderr)
        return 2
    from dqn_swap.cli.experiment import METHODS, run_planned_training

    gpu = torch.cuda.get_device_name()
    limit: float | int = float(args.limit) if float(args.limit) <= 1 else int(float(args.limit))
    reports = []
    for item in args.models.split(","):
        name, _, batch = item.partition(":")
        print(f"[bench] {name} batch {batch}", file=sys.stderr, flush=True)
        reports.append(run_planned_training(
            name, int(batch or 32), limit, args.planner, args.steps, "cuda",
            max_batch_methods=METHODS if args.max_batch else (),
            progress=lambda m: print(f"[bench]   {m}", file=sys.stderr, flush=True)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
    (RESULTS / f"runtime_{slug}.json").write_text(json.dumps({"gpu": gpu, "reports": reports}, indent=1,
                                                             default=str) + "\n")
    (RESULTS / f"runtime_{slug}.md").write_text(markdown(gpu, reports))
    print(markdown(gpu, reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
