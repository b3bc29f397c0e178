"""Planning time and plan quality of every baseline planner.

Records a ``meta`` trace of a model zoo workload (default ResNet-50, batch
64, profile ``v100-pcie3``: no GPU needed), then plans it with each baseline
of :mod:`agents.baselines` at memory limits placed between the trace's
``minimum_memory`` (0%) and its unplanned ``peak_bytes`` (100%), as the
offloading paper's section 6.3 scales its plots.  For every (limit,
planner) it reports the wall-clock planning time, the number of simulations
the planner ran, and the simulated figures of its plan: feasible, overhead
(``(makespan - compute) / compute``), makespan over the lower bound, and
the number of swap and recompute actions.

Prints a table (or JSON with ``--json``); writes nothing unless ``-o``.

Example::

    python benchmarks/bench_planners.py --model resnet50 --batch-size 64 --fractions 0.9,0.7,0.5,0.3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from dqn_swap.agents.baselines import PLANNERS, get_planner
from machine import machine, relative_paths
from dqn_swap.cost import get_profile
from dqn_swap.trace import Trace
from dqn_swap.units import format_bytes
from dqn_swap.files import write_text


def record(model: str, batch_size: int, profile: str) -> tuple[Trace, float]:
    """A meta-device trace of ``model`` and the seconds recording took."""
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    t0 = time.perf_counter()
    w = build_workload(model, batch_size, device="meta")
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta", inputs="released",
                         profile=profile, meta={"model": model, "batch_size": batch_size})
    return trace, time.perf_counter() - t0


def run(trace: Trace, profile_name: str, fractions: list[float], planners: list[str]) -> list[dict[str, Any]]:
    """Plan ``trace`` with each planner at each limit; one row per (limit, planner)."""
    profile = get_profile(profile_name)
    low, high = trace.minimum_memory, trace.peak_bytes
    rows = []
    for fraction in fractions:
        limit = int(low + fraction * (high - low))
        for name in planners:
            t0 = time.perf_counter()
            plan = get_planner(name).plan(trace, limit, profile)
            seconds = time.perf_counter() - t0
            f = plan.figures
            rows.append({"fraction": fraction, "limit_bytes": limit, "planner": name,
                         "planning_s": seconds, "simulations": plan.settings.get("simulations"),
                         "feasible": f["feasible"], "overhead": f["overhead"],
                         "makespan_s": f["makespan"], "makespan_over_lower_bound": f["makespan_over_lower_bound"],
                         "peak_bytes": f["peak_bytes"], "n_swap": plan.n_swap, "n_recompute": plan.n_recompute})
            print(f"  {fraction:.0%} {name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Rows as a fixed-width text table."""
    head = f"{'limit':>16} {'planner':<11} {'plan s':>7} {'sims':>5} {'feasible':>8} {'overhead':>9} " \
           f"{'mk/LB':>6} {'swap':>5} {'recomp':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        overhead = f"{100 * r['overhead']:.1f}%" if r["feasible"] else "-"
        ratio = f"{r['makespan_over_lower_bound']:.2f}" if r["feasible"] else "-"
        limit = f"{r['fraction']:.0%} {format_bytes(r['limit_bytes'])}"
        lines.append(f"{limit:>16} {r['planner']:<11} {r['planning_s']:>7.2f} {r['simulations']:>5} "
                     f"{str(r['feasible']):>8} {overhead:>9} {ratio:>6} {r['n_swap']:>5} {r['n_recompute']:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", help="model zoo workload to record (default resnet50)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--trace", help="plan this trace file instead of recording --model")
    parser.add_argument("--profile", default="v100-pcie3", help="device profile (default v100-pcie3)")
    parser.add_argument("--fractions", default="0.9,0.7,0.5,0.3",
                        help="limits as fractions between minimum memory (0) and peak (1); default 0.9,0.7,0.5,0.3")
    parser.add_argument("--planners", default=",".join(PLANNERS),
                        help=f"comma-separated baselines (default all: {','.join(PLANNERS)})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("-o", "--output", help="also write the JSON results to this file")
    parser.add_argument("--force", action="store_true", help="replace an existing --output file")
    args = parser.parse_args(argv)

    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    unknown = [p for p in planners if p not in PLANNERS]
    if unknown:
        parser.error(f"unknown planner {unknown[0]!r}; choose from {', '.join(PLANNERS)}")
    try:
        fractions = [float(x) for x in args.fractions.split(",")]
    except ValueError:
        parser.error(f"--fractions must be numbers separated by commas, not {args.fractions!r}")
    if args.output and Path(args.output).exists() and not args.force:
        parser.error(f"{args.output} already exists (pass --force to replace it)")

    if args.trace:
        trace, record_s = Trace.load(args.trace), 0.0
        source = args.trace
    else:
        trace, record_s = record(args.model, args.batch_size, args.profile)
        source = f"{args.model} batch {args.batch_size} (meta)"
    rows = run(trace, args.profile, fractions, planners)
    result = {"trace": source, "fingerprint": trace.fingerprint, "profile": args.profile,
              "record_s": record_s, "ops": trace.n_ops, "events": trace.n_events,
              "minimum_memory_bytes": trace.minimum_memory, "peak_bytes": trace.peak_bytes,
              "compute_time_s": trace.compute_time, "machine": machine(), "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{source}: {trace.n_ops} ops, {trace.n_events} events, compute {trace.compute_time * 1e3:.1f} ms, "
              f"minimum {format_bytes(trace.minimum_memory)}, peak {format_bytes(trace.peak_bytes)}, "
              f"profile {args.profile}")
        print(table(rows))
    if args.output:
        write_text(Path(args.output), json.dumps(relative_paths(result), indent=1) + "\n", overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
