#!/usr/bin/env python
"""What users would switch on instead of dqn-swap, in simulation: against ``dqn`` and the best baseline.

Records ResNet-50 (batch 64), the zoo's GPT (batch 8) and a tiny Hugging Face Llama
(``hf:llama``, batch 8) on the ``meta`` device with the ``v100-pcie3`` profile, and at
90/70/50/30 % of the way from each trace's minimum memory to its peak plans it with

* the user switches of :mod:`dqn_swap.agents.baselines` -- ``per-block`` (Hugging Face's
  per-layer gradient checkpointing), ``offload-all`` (torchtune's activation
  offloading), ``offload-all+per-block`` (the two together) and ``knapsack``
  (``torch.compile``'s activation-memory-budget knapsack);
* the shipped DQN agent (``dqn``), and every existing baseline of the papers, of which
  the feasible plan of least overhead is "the best baseline".

Every plan is measured with :func:`dqn_swap.simulator.simulate`.  For each cell it records
each planner's feasibility, overhead ``(makespan - compute) / compute``, its makespan over
``dqn``'s and over the best baseline's (``(1 + overhead) / (1 + other overhead)``, both
feasible), its swap and recompute counts and its planning time (CPU seconds of this one
thread).  For ``per-block`` it also gives the simulated recompute time beside one re-run of
the blocks' forward ops (what ``torch.utils.checkpoint`` spends; the simulator re-creates
each activation just in time, see :mod:`dqn_swap.agents.baselines.per_block`).

Example (a few minutes on one core)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_baselines.py \\
        --json benchmarks/results/user_baselines.json --md benchmarks/results/user_baselines.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import relative_paths  # noqa: E402

from dqn_swap.files import write_text  # noqa: E402

PROFILE = "v100-pcie3"
MODELS = (("resnet50", 64), ("gpt", 8), ("hf:llama", 8))
LIMITS = (0.9, 0.7, 0.5, 0.3)
USER = ("per-block", "offload-all", "offload-all+per-block", "knapsack")  # planner_names("switch")


def user_planners() -> dict[str, Any]:
    """The switches users reach for, by name (the registry's kind ``switch``)."""
    from dqn_swap.agents import get_planner, planner_names

    return {name: get_planner(name) for name in planner_names("switch")}


def existing_baselines() -> tuple[str, ...]:
    """The papers' baselines that plan something (all but ``none``)."""
    from dqn_swap.agents import planner_names

    return tuple(n for n in planner_names("baseline") if n != "none")


def record(model: str, batch: int) -> Any:
    from dqn_swap.agents.dqn.report import load_trace_spec

    return load_trace_spec(f"{model}:{batch}", PROFILE)


def blocks_forward_seconds(trace: Any) -> float:
    """Seconds of the forward ops run inside the trace's blocks: one re-run of every block."""
    from dqn_swap.agents.baselines.per_block import block_of_op, block_paths

    blocks = block_paths(trace)
    if len(blocks) < 2:
        return 0.0
    return float(trace.op_duration[block_of_op(trace, blocks) >= 0].sum())


def run_cell(trace: Any, limit: int, planners: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every planner's simulated figures at ``limit``."""
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import simulate

    profile = get_profile(PROFILE)
    out: dict[str, dict[str, Any]] = {}
    for name, planner in planners.items():
        t0 = time.process_time()
        plan = planner.plan(trace, limit, profile)
        seconds = time.process_time() - t0
        res = simulate(trace, plan.actions, limit, profile)
        row: dict[str, Any] = {"feasible": bool(res.feasible),
                               "overhead": float(res.overhead) if res.feasible else None,
                               "recompute_s": float(res.recompute_time), "n_swap": plan.n_swap,
                               "n_recompute": plan.n_recompute, "planning_cpu_s": round(seconds, 3)}
        for key in ("not_applicable", "budget_fraction", "not_recomputable"):
            if key in plan.settings:
                row[key] = plan.settings[key]
        out[name] = row
        print(f"    {name}: {'%.4f' % row['overhead'] if row['feasible'] else 'infeasible'} "
              f"({seconds:.1f} s)", file=sys.stderr, flush=True)
    return out


def ratio(a: dict[str, Any], b: dict[str, Any] | None) -> float | None:
    """Makespan of ``a`` over that of ``b`` (same compute time), when both are feasible."""
    if b is None or not a["feasible"] or not b["feasible"]:
        return None
    return (1 + a["overhead"]) / (1 + b["overhead"])


def bench(models: list[tuple[str, int]], limits: list[float]) -> dict[str, Any]:
    from dqn_swap.agents import get_planner
    from dqn_swap.limits import MemoryLimit

    baselines = existing_baselines()
    results = []
    for model, batch in models:
        t0 = time.process_time()
        trace = record(model, batch)
        print(f"{model} b{batch}: recorded in {time.process_time() - t0:.1f} s", file=sys.stderr, flush=True)
        planners = {**user_planners(), "dqn": get_planner("dqn"), **{n: get_planner(n) for n in baselines}}
        cells = []
        for frac in limits:
            limit = MemoryLimit.percent(round(frac * 100, 6)).resolve(trace)
            print(f"  {frac:.0%}", file=sys.stderr, flush=True)
            figs = run_cell(trace, limit, planners)
            feasible = [n for n in baselines if figs[n]["feasible"]]
            best = min(feasible, key=lambda n: (figs[n]["overhead"], n)) if feasible else None
            for name in USER:
                figs[name]["over_dqn"] = ratio(figs[name], figs["dqn"])
                figs[name]["over_best_baseline"] = ratio(figs[name], figs[best] if best else None)
            cells.append({"limit": frac, "limit_bytes": limit, "best_baseline": best, "planners": figs})
        results.append({"model": model, "batch_size": batch, "fingerprint": trace.fingerprint,
                        "n_ops": trace.n_ops, "compute_s": trace.compute_time,
                        "minimum_memory_bytes": trace.minimum_memory, "peak_bytes": trace.peak_bytes,
                        "blocks_forward_s": blocks_forward_seconds(trace), "cells": cells})
    return {"profile": PROFILE, "limits": limits, "user_planners": list(USER), "baselines": list(baselines),
            "models": results}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def markdown(result: dict[str, Any]) -> str:
    """One table per model: overhead of dqn, the best baseline and each user switch, and the switch's
    makespan over dqn's and over the best baseline's."""
    lines = ["# User switches against dqn-swap (simulated)", "",
             f"Profile `{result['profile']}`; limits are the way from each trace's minimum memory (0 %) to its "
             "peak (100 %).  Overhead is `(makespan - compute) / compute` from `dqn_swap.simulator.simulate`; "
             "`x dqn` and `x best` are the switch's makespan over `dqn`'s and over the best existing "
             "baseline's (both feasible); `infeasible`: the plan does not fit.", "",
             f"Command: `{result['command']}`  ", f"Commit: `{result['commit']}`"
             + (f" (modified: {', '.join(result['modified'])})" if result['modified'] else "")
             + f", {result['date']}  ", f"Machine: {result['machine']}", ""]
    for m in result["models"]:
        lines += [f"## {m['model']}, batch {m['batch_size']}", "",
                  f"{m['n_ops']} ops, compute {m['compute_s'] * 1e3:.1f} ms; one re-run of the blocks' forward ops: "
                  f"{m['blocks_forward_s'] * 1e3:.1f} ms.", ""]
        head = ["limit", "dqn", "best baseline", *USER]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in m["cells"]:
            f = c["planners"]

            def cell(name: str) -> str:
                r = f[name]
                if r.get("not_applicable"):
                    return "not applicable"
                if not r["feasible"]:
                    return "infeasible"
                return pct(r["overhead"])

            best = c["best_baseline"]
            row = [f"{round(c['limit'] * 100)} %", cell("dqn"), f"{best} {cell(best)}" if best else "infeasible"]
            for name in USER:
                r = f[name]
                text = cell(name)
                if r["feasible"]:
                    text += f" ({times(r['over_dqn'])} dqn, {times(r['over_best_baseline'])} best)"
                row.append(text)
            lines.append("| " + " | ".join(row) + " |")
        pb = [c["planners"]["per-block"] for c in m["cells"] if c["planners"]["per-block"]["n_recompute"]]
        if pb:
            lines += ["", f"`per-block` simulated recompute time {pb[0]['recompute_s'] * 1e3:.1f} ms against "
                      f"{m['blocks_forward_s'] * 1e3:.1f} ms for one re-run of the blocks (the simulator "
                      "re-creates each activation just in time, re-running its producers from the block's input)."]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=[f"{m}:{b}" for m, b in MODELS],
                   help="MODEL:BATCH workloads (default: resnet50:64 gpt:8 hf:llama:8)")
    p.add_argument("--limits", type=float, nargs="+", default=list(LIMITS),
                   help="fractions of the way from minimum memory to peak (default 0.9 0.7 0.5 0.3)")
    p.add_argument("--json", help="write the results here (JSON)")
    p.add_argument("--md", help="write the tables here (markdown)")
    args = p.parse_args(argv)
    models = []
    for spec in args.models:
        name, _, batch = spec.rpartition(":")
        if not name or not batch.isdigit() or int(batch) < 1:
            p.error(f"--models takes MODEL:BATCH with a positive batch, not {spec!r}")
        models.append((name, int(batch)))
    if any(not 0 < x <= 1 for x in args.limits):
        p.error("--limits must be fractions in (0, 1]")
    t0 = time.process_time()
    result = bench(models, args.limits)
    from common import provenance

    result = {**provenance(), "cpu_s": round(time.process_time() - t0, 1), **result}
    result = relative_paths(result)
    text = markdown(result)
    print(text)
    if args.json:
        write_text(Path(args.json), json.dumps(result, indent=1) + "\n", overwrite=True)
    if args.md:
        write_text(Path(args.md), text + "\n", overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
