#!/usr/bin/env python
"""Record, plan and train a model-zoo workload with the planned-execution runtime.

Measures peak allocated / reserved memory (CUDA), step time and throughput of
planned training beside unplanned training, full activation checkpointing and
``save_on_cpu``, and the simulator's prediction for the same plan; optionally
finds the largest batch size that trains under a memory budget with each
method.  Writes a JSON report (``--out``) and prints a table.

Examples::

    python scripts/run_planned_training.py resnet50 --batch-size 64 --limit 50% --planner greedy
    python scripts/run_planned_training.py gpt --batch-size 8 --limit 0.5 --max-batch planned,checkpoint
    python scripts/run_planned_training.py mlp_tiny --device cpu --planner swap-all --steps 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dqn_swap.runtime.training import BUILTIN_PLANNERS, METHODS, run_planned_training
from dqn_swap.trace import format_bytes


def _limit(text: str) -> int | float | str:
    try:
        value = float(text)
    except ValueError:
        return text  # "50%", "8GiB"
    return value if value <= 1.0 else int(value)


def _csv(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in METHODS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    return items


def table(report: dict[str, Any]) -> str:
    lines = [f"{report['model']} batch {report['batch_size']} on {report['gpu'] or report['device']}, "
             f"limit {format_bytes(report['memory_limit'])} "
             f"(unplanned peak {format_bytes(report['unplanned_peak_bytes'])}), plan: {report['plan']['planner']} "
             f"{report['plan']['swaps']} swaps / {report['plan']['recomputes']} recomputes",
             f"{'method':<12} {'status':<7} {'step ms':>9} {'samples/s':>10} {'peak alloc':>12} {'peak reserved':>14}"]
    for name, r in report["methods"].items():
        if r.get("status") != "ok":
            lines.append(f"{name:<12} {r.get('status', '?'):<7}")
            continue
        alloc = format_bytes(r["peak_allocated"]) if "peak_allocated" in r else "-"
        reserved = format_bytes(r["peak_reserved"]) if "peak_reserved" in r else "-"
        lines.append(f"{name:<12} {'ok':<7} {r['step_time_s'] * 1e3:>9.2f} {r['throughput']:>10.1f} "
                     f"{alloc:>12} {reserved:>14}")
    sim = report.get("simulator")
    if sim:
        lines.append(f"simulator: feasible {sim['feasible']}, overhead {sim['overhead']}, "
                     f"peak {format_bytes(sim['peak_bytes'])}")
    for key, value in report.get("comparison", {}).items():
        lines.append(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
    for method, r in report.get("largest_batch", {}).items():
        if isinstance(r, dict):
            lines.append(f"largest batch under {format_bytes(report['largest_batch']['budget'])} with {method}: "
                         f"{r['batch_size']} ({r['how']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="workload name (dqn_swap.models)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--limit", type=_limit, default=0.5,
                   help="memory limit: bytes, 8GiB, 50%% or a fraction <= 1 of the unplanned peak (default 0.5)")
    p.add_argument("--planner", default="greedy",
                   help=f"a baseline of agents.baselines or a built-in planner ({', '.join(BUILTIN_PLANNERS)})")
    p.add_argument("--steps", type=int, default=10, help="measured steps per method (after one warm-up step)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--profile", default=None, help="device profile for planning (default: measured on CUDA)")
    p.add_argument("--methods", type=_csv, default=list(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument("--max-batch", type=_csv, default=[], help="methods whose largest batch under --budget is found")
    p.add_argument("--budget", type=_limit, default=None, help="memory budget of --max-batch (default: --limit)")
    p.add_argument("--no-expandable-segments", action="store_true", help="keep the default CUDA allocator settings")
    p.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    say = (lambda _m: None) if args.quiet else (lambda m: print(f"[run] {m}", file=sys.stderr, flush=True))
    try:
        report = run_planned_training(args.model, args.batch_size, args.limit, args.planner, args.steps, args.device,
                                      profile=args.profile, methods=args.methods,
                                      expandable_segments=not args.no_expandable_segments,
                                      budget=args.budget, max_batch_methods=args.max_batch, progress=say)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    if not args.quiet:
        print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
