#!/usr/bin/env python
"""The exact planner's certified bound against exhaustive enumeration, on thousands of small traces.

::

    python benchmarks/bench_bound.py --cases 5000 --cli-samples 36

Draws ``--cases`` random small traces of every shape
(:mod:`dqn_swap.agents.optimal.exhaustive`: chains, skips, scratch, several
outputs, saved tensors returning out of order, recompute chains, on every device
profile and on one shared copy engine), simulates every plan of each (keep,
swap or recompute each tensor at its valid event), and plans it with
``OptimalPlanner(incumbents=(), gap=0)``: the program alone, solved to
optimality.  It counts

* **bound violations**: a certified bound above the enumerated optimum (the
  program is then not a relaxation of the simulator);
* **false proofs**: ``proved_optimal`` on a plan slower than the optimum;
* plans that reach the optimum, and proofs.

``--cli-samples`` of the traces (on named profiles) are also saved and planned
through ``dqn-swap simulate --planner optimal --json``, whose standard output
must parse as JSON and agree with the enumeration.  Results go to
``benchmarks/results/optimal_bound_enumeration.json`` with the command, the
commit and the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import commit, machine, relative_paths  # noqa: E402

from dqn_swap.agents.optimal import OptimalPlanner  # noqa: E402
from dqn_swap.agents.optimal.exhaustive import SHAPES, enumerate_plans, random_case  # noqa: E402
from dqn_swap.cost import PROFILES  # noqa: E402
from dqn_swap.files import write_text  # noqa: E402
from dqn_swap.simulator import Simulator  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
REL = 1e-9  # relative tolerance of every comparison with the optimum


def check_case(index: int, seed: int, max_plans: int, time_limit: float) -> dict[str, Any]:
    """One random case: the enumerated optimum, and what the planner says about it."""
    rng = random.Random(f"{seed}-{index}")
    shape, trace, limit, profile = random_case(rng, SHAPES[index % len(SHAPES)], max_plans=max_plans)
    sim = Simulator(trace, limit, profile)
    t0 = time.perf_counter()
    best = enumerate_plans(sim, max_plans=max_plans)
    t1 = time.perf_counter()
    plan = OptimalPlanner(incumbents=(), gap=0.0, time_limit=time_limit).plan(trace, limit, profile)
    t2 = time.perf_counter()
    s, fig = plan.settings, plan.figures
    opt = best.makespan
    ms = float(fig["makespan"]) if fig["feasible"] else math.inf
    bound = float(s["certified_bound"])
    finite = math.isfinite(opt)
    return {
        "index": index, "shape": shape, "profile": profile.name, "ops": trace.n_ops, "limit": limit,
        "plans": best.plans, "optimum": opt if finite else None, "makespan": ms if math.isfinite(ms) else None,
        "bound": bound, "proved": bool(s["proved_optimal"]), "rounds": len(s.get("rounds", ())),
        "violation": finite and bound > opt * (1 + REL),
        "false_proof": bool(s["proved_optimal"]) and finite and abs(ms - opt) > REL * opt,
        "feasibility_mismatch": bool(fig["feasible"]) != finite,
        "reached": finite and abs(ms - opt) <= REL * opt,
        "enumerate_s": t1 - t0, "plan_s": t2 - t1,
        "_case": (trace, limit, profile),
    }


def cli_check(row: dict[str, Any], folder: Path, time_limit: float) -> dict[str, Any]:
    """Plan one case through ``dqn-swap simulate --planner optimal --json``; its output must parse."""
    trace, limit, profile = row["_case"]
    path = folder / f"case{row['index']}.npz"
    trace.save(path, overwrite=True)
    cmd = [sys.executable, "-m", "dqn_swap", "simulate", str(path), "--planner", "optimal", "--json",
           "--memory-limit", str(limit), "--profile", profile.name, "--time-limit", str(time_limit)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])})
    out = {"index": row["index"], "returncode": proc.returncode, "parses": False}
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        out["error"] = f"{e}: {proc.stdout[:200]!r}"
        return out
    out["parses"] = True
    opt = row["optimum"]
    if opt is not None:
        out["bound_ok"] = data["certified_bound"] <= opt * (1 + REL)
        out["proof_ok"] = not data["proved_optimal"] or abs(data["makespan"] - opt) <= REL * opt
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=5000, help="random traces (default 5000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-plans", type=int, default=2000, help="most plans a trace may have (default 2000)")
    p.add_argument("--time-limit", type=float, default=60.0, help="the planner's seconds per trace")
    p.add_argument("--cli-samples", type=int, default=36, help="cases also planned through the CLI")
    p.add_argument("--json", default=str(RESULTS / "optimal_bound_enumeration.json"))
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    cli: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.cases):
            row = check_case(i, args.seed, args.max_plans, args.time_limit)
            named = row["profile"] in PROFILES
            if named and len(cli) < args.cli_samples and i % 7 == len(cli) % 7:
                cli.append(cli_check(row, Path(tmp), args.time_limit))
            del row["_case"]
            rows.append(row)
            if (i + 1) % 500 == 0:
                bad = sum(r["violation"] or r["false_proof"] for r in rows)
                print(f"{i + 1} cases, {bad} bad, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    def totals(sel: list[dict[str, Any]]) -> dict[str, Any]:
        feasible = [r for r in sel if r["optimum"] is not None]
        return {"cases": len(sel), "plans_simulated": sum(r["plans"] for r in sel), "feasible": len(feasible),
                "bound_violations": sum(r["violation"] for r in sel),
                "false_proofs": sum(r["false_proof"] for r in sel),
                "feasibility_mismatches": sum(r["feasibility_mismatch"] for r in sel),
                "proved": sum(r["proved"] for r in sel), "reached_optimum": sum(r["reached"] for r in sel),
                "max_bound_over_optimum": max((r["bound"] / r["optimum"] for r in feasible), default=None),
                "max_makespan_over_optimum": max((r["makespan"] / r["optimum"] for r in feasible
                                                  if r["makespan"] is not None), default=None)}

    by: dict[str, dict[str, list[dict[str, Any]]]] = {"shape": defaultdict(list), "profile": defaultdict(list)}
    for r in rows:
        by["shape"][r["shape"]].append(r)
        by["profile"][r["profile"]].append(r)
    rounds = Counter(r["rounds"] for r in rows)
    result = {
        "machine": machine(), **commit(),
        "command": " ".join(["python", "benchmarks/bench_bound.py", *(sys.argv[1:] if argv is None else argv)]),
        "seconds": round(time.perf_counter() - t0, 1),
        "totals": totals(rows),
        "by_shape": {k: totals(v) for k, v in sorted(by["shape"].items())},
        "by_profile": {k: totals(v) for k, v in sorted(by["profile"].items())},
        "rounds": {str(k): v for k, v in sorted(rounds.items())},
        "cli": {"runs": len(cli), "parsed": sum(c["parses"] for c in cli),
                "bound_ok": sum(c.get("bound_ok", True) for c in cli),
                "proof_ok": sum(c.get("proof_ok", True) for c in cli),
                "failures": [c for c in cli if not c["parses"] or c["returncode"]
                             or not c.get("bound_ok", True) or not c.get("proof_ok", True)]},
        "bad_cases": [r for r in rows if r["violation"] or r["false_proof"] or r["feasibility_mismatch"]],
        "enumerate_s": round(sum(r["enumerate_s"] for r in rows), 1),
        "plan_s": round(sum(r["plan_s"] for r in rows), 1),
    }
    write_text(Path(args.json), json.dumps(relative_paths(result), indent=1, default=float) + "\n", overwrite=True)
    t = result["totals"]
    print(f"{t['cases']} traces, {t['plans_simulated']} plans simulated: {t['bound_violations']} bound violations, "
          f"{t['false_proofs']} false proofs, {t['proved']} proved, {t['reached_optimum']} at the optimum; "
          f"CLI {result['cli']['parsed']}/{result['cli']['runs']} outputs parse")
    return 0 if not result["bad_cases"] and not result["cli"]["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
