#!/usr/bin/env python
"""The optimality ceiling: the exact planner on the comparison grid, and its solve time against graph size.

Subcommands::

    python benchmarks/bench_optimal.py grid     # 20 cells: optimum (or certified gap) and every planner's distance
    python benchmarks/bench_optimal.py scaling  # solve time, gap and program size against graph size

``grid`` plans every cell of the comparison grid (``common.py``: five
networks at 90/70/50/30 %) with every baseline, the per-network DQN agents of
``checkpoints/grid`` and ``optimal`` (``--time-limit`` seconds a cell), then
reports per cell the certified bound (the larger of the program's dual bound
and the lower bound; where a plan reaches it, the optimum) and each planner's
distance to it, ``makespan / bound - 1``.  Results go to
``benchmarks/results/optimal_grid.{json,md}``; cells already in the JSON are
kept unless ``--fresh`` (so a long run can be resumed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import (  # noqa: E402,F401  (BASELINES re-exported for the scripts that import it from here)
    BASELINES, DEFAULT_AGENT, GRID, LIMITS, NAMES, PROFILE, get_trace, grid_agent, pct, write_json)
from dqn_swap.files import save_figure, write_text

RESULTS = ROOT / "benchmarks" / "results"


def plan_cell(model: str, frac: float, time_limit: float) -> dict[str, Any]:
    from dqn_swap.agents import get_planner
    from dqn_swap.cost import get_profile

    trace = get_trace(model, GRID[model])
    limit = pct(frac).resolve(trace)
    prof = get_profile(PROFILE)
    cell: dict[str, Any] = {"model": model, "limit": frac, "limit_bytes": limit, "compute_time": trace.compute_time,
                            "n_ops": trace.n_ops, "planners": {}}
    for name in (*BASELINES, "dqn"):
        t0 = time.perf_counter()
        agent = grid_agent(ROOT / "checkpoints" / "grid", model, frac) or DEFAULT_AGENT
        planner = get_planner(name, agent=str(agent)) if name == "dqn" else get_planner(name)
        try:
            plan = planner.plan(trace, limit, prof)
            fig = plan.figures
            cell["planners"][name] = {"feasible": bool(fig["feasible"]),
                                      "makespan": float(fig["makespan"]) if fig["feasible"] else None,
                                      "seconds": round(time.perf_counter() - t0, 2)}
        except Exception as e:  # a baseline that cannot plan this cell
            cell["planners"][name] = {"feasible": False, "makespan": None, "error": str(e)[:100]}
    t0 = time.perf_counter()
    plan = get_planner("optimal", time_limit=time_limit, progress=sys.stderr.isatty()).plan(trace, limit, prof)
    s = plan.settings
    cell["planners"]["optimal"] = {"feasible": bool(plan.figures["feasible"]),
                                   "makespan": float(plan.figures["makespan"]) if plan.figures["feasible"] else None,
                                   "seconds": round(time.perf_counter() - t0, 2)}
    # The ceiling: the bound, lifted to any plan that reaches it (every planner's plan is a valid upper bound).
    made = [p["makespan"] for p in cell["planners"].values() if p["feasible"]]
    best = min(made) if made else math.inf
    bound = float(s["certified_bound"])
    cell.update(bound=bound, bound_source=s["bound_source"], best=best,
                gap=best / bound - 1 if math.isfinite(best) else None,
                proved_optimal=bool(math.isfinite(best) and best <= bound * (1 + 1e-6)),
                solve_seconds=s["solve_seconds"], rounds=len(s["rounds"]), plan_from=s["plan_from"],
                candidates=s["candidates"], program_size=s.get("program_size"),
                lower_bound=float(plan.figures.get("lower_bound", float("nan"))))
    return cell


def grid_markdown(result: dict[str, Any]) -> str:
    """Per cell: the optimum (or the bound and the certified gap), and every planner's distance to it."""
    names = [*BASELINES, "dqn", "optimal"]
    head = ["network", "limit", "optimum (overhead)", "gap", "bound from", "solve s", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in result["cells"]:
        T, bound = c["compute_time"], c["bound"]
        opt = f"{c['best'] / T - 1:.4f}" if c["proved_optimal"] else f"≥ {bound / T - 1:.4f}"
        row = [NAMES.get(c["model"], c["model"]), f"{round(c['limit'] * 100)} %", opt,
               "0" if c["proved_optimal"] else f"{100 * c['gap']:.3f} %", c.get("bound_source", "?"),
               f"{c['solve_seconds']:.0f}"]
        for n in names:
            p = c["planners"][n]
            if not p["feasible"]:
                row.append("×")
                continue
            d = p["makespan"] / bound - 1
            text = f"{100 * d:.2f} %"
            row.append(f"**{text}**" if p["makespan"] <= c["best"] * (1 + 1e-9) else text)
        lines.append("| " + " | ".join(row) + " |")
    s = result["summary"]
    lines.append(f"\nDistance = makespan / certified bound - 1 (bold: the best plan of the cell). "
                 f"`optimal` proves optimality in {s['proved']} of {s['cells']} cells; largest certified gap "
                 f"{100 * s['max_gap']:.3f} %; geometric-mean distance of the DQN to the bound "
                 f"{100 * s['dqn_geomean_distance']:.2f} % (best baseline per cell: "
                 f"{100 * s['best_baseline_geomean_distance']:.2f} %).")
    return "\n".join(lines) + "\n"


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    def geomean_distance(values: list[float]) -> float:
        return math.exp(sum(math.log(v) for v in values) / len(values)) - 1 if values else math.nan

    dqn = [c["planners"]["dqn"]["makespan"] / c["bound"] for c in cells if c["planners"]["dqn"]["feasible"]]
    base = []
    for c in cells:
        made = [c["planners"][n]["makespan"] for n in BASELINES if c["planners"][n]["feasible"]]
        if made:
            base.append(min(made) / c["bound"])
    return {"cells": len(cells), "proved": sum(c["proved_optimal"] for c in cells),
            "max_gap": max((c["gap"] for c in cells if c["gap"] is not None), default=math.nan),
            "max_solve_seconds": max(c["solve_seconds"] for c in cells),
            "dqn_geomean_distance": geomean_distance(dqn), "dqn_feasible": len(dqn),
            "best_baseline_geomean_distance": geomean_distance(base)}


def bench_grid(args: argparse.Namespace) -> dict[str, Any]:

    path = Path(args.json)
    old = json.loads(path.read_text()) if path.exists() and not args.fresh else {}
    done = {(c["model"], c["limit"]): c for c in old.get("cells", [])}
    cells = []
    for model in args.models:
        for frac in args.limits:
            cell = done.get((model, frac))
            if cell is None:
                cell = plan_cell(model, frac, args.time_limit)
            cells.append(cell)
            T = cell["compute_time"]
            print(f"{model:9s} {round(frac * 100):3d}%  bound {cell['bound'] / T:.5f} T  best {cell['best'] / T:.5f} T "
                  f"({cell['plan_from']})  gap {100 * cell['gap']:.3f} %  dqn "
                  f"{(cell['planners']['dqn']['makespan'] or math.nan) / T:.5f} T  {cell['solve_seconds']:.0f} s",
                  flush=True)
            result = {"time_limit": args.time_limit, "cells": cells, "summary": summarize(cells)}
            write_json(result, args.json)
    from machine import commit

    result = {"time_limit": args.time_limit, **commit(), "cells": cells, "summary": summarize(cells)}
    write_json(result, args.json)
    if args.md:
        from machine import machine

        head = f"{machine()}; `{' '.join(sys.argv)}`\n\n"
        write_text(Path(args.md), head + grid_markdown(result), overwrite=True)
    return result


def bench_scaling(args: argparse.Namespace) -> dict[str, Any]:

    from dqn_swap.agents import get_planner
    from dqn_swap.cost import get_profile

    prof = get_profile(PROFILE)
    path = Path(args.json)
    old = json.loads(path.read_text()) if path.exists() and not args.fresh else {}
    done = {(r["model"], r["batch"], r["limit"]): r for r in old.get("rows", [])}
    rows = []
    for spec in args.models:
        model, batch = spec.split(":")
        for frac in args.limits:
            row = done.get((model, int(batch), frac))
            if row is None:
                trace = get_trace(model, int(batch))
                limit = pct(frac).resolve(trace)
                t0 = time.perf_counter()
                plan = get_planner("optimal", time_limit=args.time_limit).plan(trace, limit, prof)
                s = plan.settings
                size = s.get("program_size") or {}
                row = {"model": model, "batch": int(batch), "limit": frac, "n_ops": trace.n_ops,
                       "candidates": s["candidates"], "binaries": size.get("binaries", 0),
                       "constraints": size.get("constraints", 0), "checkpoints": size.get("checkpoints", 0),
                       "seconds": round(time.perf_counter() - t0, 1), "gap": s["certified_gap"],
                       "proved_optimal": s["proved_optimal"], "rounds": len(s["rounds"]),
                       "plan_from": s["plan_from"], "overhead": plan.figures.get("overhead")}
            rows.append(row)
            print(f"{model}:{batch} {round(frac * 100)}%  {row['n_ops']} ops  {row['candidates']} candidates  "
                  f"{row['binaries']} binaries  {row['seconds']:.0f} s  gap {100 * row['gap']:.3f} %", flush=True)
            write_json({"time_limit": args.time_limit, "rows": rows}, args.json)
    result = {"time_limit": args.time_limit, "rows": rows}
    write_json(result, args.json)
    if args.md:
        lines = ["| network | limit | ops | candidates | binaries | constraints | solve s | certified gap | rounds |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['model']} b{r['batch']} | {round(r['limit'] * 100)} % | {r['n_ops']} | {r['candidates']} | "
                         f"{r['binaries']} | {r['constraints']} | {r['seconds']:.0f} | {100 * r['gap']:.3f} % | {r['rounds']} |")
        from machine import machine

        write_text(Path(args.md), f"{machine()}; `{' '.join(sys.argv)}`\n\n" + "\n".join(lines) + "\n", overwrite=True)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for frac in args.limits:
            rs = sorted((r for r in rows if r["limit"] == frac), key=lambda r: r["candidates"])
            x = [r["candidates"] for r in rs]
            a1.plot(x, [r["seconds"] for r in rs], "o-", label=f"{round(frac * 100)} %")
            a2.plot(x, [max(100 * r["gap"], 1e-4) for r in rs], "o-", label=f"{round(frac * 100)} %")
        a1.set(xlabel="candidate tensors (action nodes)", ylabel="solve time (s)", title="solve time")
        a2.set(xlabel="candidate tensors (action nodes)", ylabel="certified gap (%)", yscale="log",
               title="certified gap (1e-4 % = proved)")
        for a in (a1, a2):
            a.legend(title="limit")
            a.grid(alpha=0.3)
        fig.tight_layout()
        save_figure(fig, args.png, overwrite=True, dpi=120)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grid")
    g.add_argument("--models", nargs="+", default=list(GRID))
    g.add_argument("--limits", nargs="+", type=float, default=list(LIMITS))
    g.add_argument("--time-limit", type=float, default=600.0)
    g.add_argument("--json", default=str(RESULTS / "optimal_grid.json"))
    g.add_argument("--md", default=str(RESULTS / "optimal_grid.md"))
    g.add_argument("--fresh", action="store_true")
    s = sub.add_parser("scaling")
    s.add_argument("--models", nargs="+", default=["resnet18:64", "resnet34:64", "resnet50:64", "resnet101:64",
                                                   "resnet152:64"])
    s.add_argument("--limits", nargs="+", type=float, default=[0.5])
    s.add_argument("--time-limit", type=float, default=600.0)
    s.add_argument("--json", default=str(RESULTS / "optimal_scaling.json"))
    s.add_argument("--md", default=str(RESULTS / "optimal_scaling.md"))
    s.add_argument("--png", default=str(RESULTS / "optimal_scaling.png"))
    s.add_argument("--fresh", action="store_true")
    args = p.parse_args(argv)
    {"grid": bench_grid, "scaling": bench_scaling}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
