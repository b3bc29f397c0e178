"""Planning time and plan quality of every baseline planner, and of ``dqn`` and ``dqn-search``.

Records a ``meta`` trace of a model zoo workload (default ResNet-50, batch
64, profile ``v100-pcie3``: no GPU needed; ``hf:PATH`` a Hugging Face
configuration, at ``--seq-len`` tokens), then plans it with each planner
at memory limits placed between the trace's ``minimum_memory`` (0%) and
its unplanned ``peak_bytes`` (100%), as the offloading paper's section 6.3
scales its plots.  For every (limit, planner) it reports the planning
time (wall clock and CPU seconds of this process, ``time.process_time``;
run it with ``OMP_NUM_THREADS=1``), the simulations it ran (every
``Simulator.run``, counted, and the ``Simulator.memory_need`` calls apart),
and the simulated figures of its plan: feasible, overhead
(``(makespan - compute) / compute``), makespan over the lower bound, and
the number of swap and recompute actions.  ``dqn-search`` runs without its
time budget unless ``--search-seconds`` is given, so its figures are those
of its budget of simulations.

Prints a table (or JSON with ``--json``); writes nothing unless ``-o``.

Examples::

    python benchmarks/bench_planners.py --model resnet50 --batch-size 64 --fractions 0.9,0.7,0.5,0.3
    python benchmarks/bench_planners.py --model resnet1001 --batch-size 64 --planners dqn-search \\
        --fractions 0.5 -o benchmarks/results/search_time_resnet1001.json
    python benchmarks/bench_planners.py --model hf:benchmarks/configs/llama-32l --batch-size 1 --seq-len 4096 \\
        --planners dqn-search --fractions 0.5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dqn_swap.agents import get_planner, planner_names
from common import provenance  # noqa: E402
from machine import relative_paths
from dqn_swap.cost import get_profile
from dqn_swap.trace import Trace
from dqn_swap.units import format_bytes
from dqn_swap.files import write_text


@contextmanager
def count_simulations() -> Iterator[dict[str, int]]:
    """Count the simulations run inside the block: ``{"run": Simulator.run calls, "memory_need":
    Simulator.memory_need calls}`` (the counters are updated as the block runs)."""
    from dqn_swap.simulator import Simulator

    counts = {"run": 0, "memory_need": 0}
    run, need = Simulator.run, Simulator.memory_need

    def counted_run(self: Simulator, *a: Any, **k: Any) -> Any:
        counts["run"] += 1
        return run(self, *a, **k)

    def counted_need(self: Simulator, *a: Any, **k: Any) -> Any:
        counts["memory_need"] += 1
        return need(self, *a, **k)

    Simulator.run, Simulator.memory_need = counted_run, counted_need  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        Simulator.run, Simulator.memory_need = run, need  # type: ignore[method-assign]


def record(model: str, batch_size: int, profile: str, seq_len: int | None = None) -> tuple[Trace, float]:
    """A meta-device trace of ``model`` and the seconds recording took (``seq_len``: tokens per
    sequence of a Hugging Face language model, at most its ``max_position_embeddings``)."""
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    if seq_len is not None:
        from dqn_swap.models import hf

        hf.SEQ_LEN = int(seq_len)
    t0 = time.perf_counter()
    w = build_workload(model, batch_size, device="meta")
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta", inputs="released",
                         profile=profile, meta={"model": model, "batch_size": batch_size})
    return trace, time.perf_counter() - t0


def run(trace: Trace, profile_name: str, fractions: list[float], planners: list[str],
        search_seconds: float | None = None) -> list[dict[str, Any]]:
    """Plan ``trace`` with each planner at each limit; one row per (limit, planner)."""
    profile = get_profile(profile_name)
    low, high = trace.minimum_memory, trace.peak_bytes
    rows = []
    for fraction in fractions:
        limit = int(low + fraction * (high - low))
        for name in planners:
            settings: dict[str, Any] = {}
            if name in planner_names("dqn"):
                settings["threads"] = 1
            if name == "dqn-search":
                settings["time_limit"] = search_seconds
            planner = get_planner(name, **settings)
            with count_simulations() as counts:
                t0, c0 = time.perf_counter(), time.process_time()
                plan = planner.plan(trace, limit, profile)
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            f = plan.figures
            rows.append({"fraction": fraction, "limit_bytes": limit, "planner": name,
                         "planning_s": seconds, "cpu_s": cpu, "simulations": counts["run"],
                         "memory_need_calls": counts["memory_need"],
                         **({"search": {k: plan.settings.get(k) for k in ("decode", "decoded", "polish", "cut_by_time")}}
                            if name == "dqn-search" else {}),
                         "feasible": f["feasible"], "overhead": f["overhead"],
                         "makespan_s": f["makespan"], "makespan_over_lower_bound": f["makespan_over_lower_bound"],
                         "peak_bytes": f["peak_bytes"], "n_swap": plan.n_swap, "n_recompute": plan.n_recompute})
            print(f"  {fraction:.0%} {name}: {seconds:.2f} s, {cpu:.2f} CPU s, {counts['run']} simulations",
                  file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Rows as a fixed-width text table."""
    head = f"{'limit':>16} {'planner':<11} {'plan s':>7} {'CPU s':>7} {'sims':>6} {'feasible':>8} {'overhead':>9} " \
           f"{'mk/LB':>6} {'swap':>5} {'recomp':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        overhead = f"{100 * r['overhead']:.1f}%" if r["feasible"] else "-"
        ratio = f"{r['makespan_over_lower_bound']:.2f}" if r["feasible"] else "-"
        limit = f"{r['fraction']:.0%} {format_bytes(r['limit_bytes'])}"
        lines.append(f"{limit:>16} {r['planner']:<11} {r['planning_s']:>7.2f} {r['cpu_s']:>7.2f} {r['simulations']:>6} "
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
    parser.add_argument("--seq-len", type=int, help="tokens per sequence of an hf: language model (default 64)")
    baselines = planner_names("baseline")
    parser.add_argument("--planners", default=",".join(baselines),
                        help=f"comma-separated planners (default every baseline of the papers: {','.join(baselines)})")
    parser.add_argument("--search-seconds", type=float, help="dqn-search's time budget (default: none)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("-o", "--output", help="also write the JSON results to this file")
    parser.add_argument("--force", action="store_true", help="replace an existing --output file")
    args = parser.parse_args(argv)

    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    unknown = [p for p in planners if p not in planner_names()]
    if unknown:
        parser.error(f"unknown planner {unknown[0]!r}; choose from {', '.join(planner_names())}")
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
        trace, record_s = record(args.model, args.batch_size, args.profile, args.seq_len)
        source = f"{args.model} batch {args.batch_size}" + (f" sequence {args.seq_len}" if args.seq_len else "") + " (meta)"
    rows = run(trace, args.profile, fractions, planners, args.search_seconds)
    result = {"trace": source, "fingerprint": trace.fingerprint, "profile": args.profile,
              "record_s": record_s, "ops": trace.n_ops, "events": trace.n_events,
              "minimum_memory_bytes": trace.minimum_memory, "peak_bytes": trace.peak_bytes,
              "compute_time_s": trace.compute_time, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{source}: {trace.n_ops} ops, {trace.n_events} events, compute {trace.compute_time * 1e3:.1f} ms, "
              f"minimum {format_bytes(trace.minimum_memory)}, peak {format_bytes(trace.peak_bytes)}, "
              f"profile {args.profile}")
        print(table(rows))
    if args.output:
        write_text(Path(args.output), json.dumps(relative_paths({**provenance(), **result}), indent=1) + "\n",
                   overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
