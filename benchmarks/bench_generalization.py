#!/usr/bin/env python
"""Zero-shot planning of generated networks: an agent against the best baseline, family by family.

Draws ``--per-family`` networks of every family of ``--split`` (default ``test``: the
families no shipped agent is trained on, :mod:`dqn_swap.models.generator`), records each
on ``meta`` at its own batch size and device profile (cached under ``runs/corpus/``),
and plans it at 90/70/50/30 % of the way from its minimum memory to its peak with every
baseline and with the agent (``dqn``; ``--search`` adds ``dqn-search``).  A cell counts
for the agent when its plan is feasible wherever a baseline's is and its simulated
overhead is at most the best baseline's plus ``--tolerance`` (default 1e-3).

Example::

    python benchmarks/bench_generalization.py --split test --per-family 1 \\
        --json benchmarks/results/generalization_test.json --md benchmarks/results/generalization_test.md

``--agents LABEL=PATH ...`` compares several agents on the same cells (an ablation: planners
``dqn[LABEL]`` and, with ``--search``, ``dqn-search[LABEL]``); the markdown is then one row per
planner: cells at or below the best baseline, infeasible cells, and the geometric mean of the
makespan over the best baseline's, ``(1 + overhead) / (1 + best overhead)`` over the cells
where it is feasible.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import BASELINES, DEFAULT_AGENT, LIMITS, pct, write_json  # noqa: E402
from dqn_swap.files import write_text
CORPUS = ROOT / "runs" / "corpus"


def figures(trace: Any, plan: Any, limit: int) -> dict[str, Any]:
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import simulate

    res = simulate(trace, plan.actions, limit, get_profile(trace.meta["profile"]))
    return {"feasible": bool(res.feasible), "overhead": float(res.overhead) if res.feasible else None}


def plan_cell(trace: Any, limit: int, planners: dict[str, Any],
              plans: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every planner's figures on one cell; ``plans``, if given, receives the plans themselves."""
    cell: dict[str, Any] = {}
    for name, planner in planners.items():
        t0 = time.perf_counter()
        try:
            plan = planner.plan(trace, limit, trace.meta["profile"])
            cell[name] = figures(trace, plan, limit)
            if plans is not None:
                plans[name] = plan
        except Exception as e:  # noqa: BLE001 - a baseline that cannot plan this cell counts as infeasible
            cell[name] = {"feasible": False, "overhead": None, "error": f"{type(e).__name__}: {e}"[:120]}
        cell[name]["seconds"] = round(time.perf_counter() - t0, 3)
    return cell


POLISHED = "best baseline polished"


def polished_best_baseline(trace: Any, limit: int, cell: dict[str, Any], plans: dict[str, Any]) -> dict[str, Any]:
    """The control for local search: the best baseline's plan polished as ``dqn-search`` polishes its own
    (:func:`dqn_swap.agents.local_search.polish`), with the budget ``dqn-search`` spends on its two plans,
    so that what the agent adds beyond local search shows."""
    from dqn_swap.agents.local_search import default_simulations, polish
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import Simulator

    best = best_baseline(cell)
    if best is None:
        return {"feasible": False, "overhead": None, "from": None}
    res = polish(Simulator(trace, limit, get_profile(trace.meta["profile"])), plans[best].actions,
                 max_simulations=2 * default_simulations(trace.n_events))
    return {"feasible": True, "overhead": float(res.result.makespan / trace.compute_time - 1), "from": best,
            "simulations": res.simulations, "seconds": round(res.seconds, 3)}


def best_baseline(cell: dict[str, Any]) -> str | None:
    """The baseline with the lowest overhead among those whose plan fits (None: none fits)."""
    feasible = [n for n in BASELINES if n in cell and cell[n]["feasible"]]
    return min(feasible, key=lambda n: cell[n]["overhead"]) if feasible else None


def judge(cell: dict[str, Any], agent: str, tolerance: float) -> tuple[str | None, bool]:
    """The best feasible baseline of a cell, and whether ``agent`` is at or below it."""
    best = best_baseline(cell)
    a = cell[agent]
    if best is None:
        return None, True
    return best, bool(a["feasible"] and a["overhead"] <= cell[best]["overhead"] + tolerance)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents import get_planner
    from dqn_swap.models.corpus import record_corpus
    from dqn_swap.models.generator import corpus
    from dqn_swap.trace import Trace

    specs = corpus(args.split, args.per_family, args.first_seed)
    paths = record_corpus(specs, CORPUS / args.split)
    planners = {n: get_planner(n) for n in BASELINES}
    if args.agents:
        sources = dict(item.split("=", 1) for item in args.agents)
        agents = [f"{kind}[{label}]" for label in sources for kind in ("dqn", *(["dqn-search"] if args.search else []))]
        planners |= {a: get_planner(a.split("[")[0], agent=sources[a[a.index("[") + 1:-1]],
                                    **({"k": args.search_k} if a.startswith("dqn-search") else {})) for a in agents}
    else:
        agents = ["dqn", *(["dqn-search"] if args.search else [])]
        planners |= {n: get_planner(n, agent=args.agent, **({"k": args.search_k} if n == "dqn-search" else {}))
                     for n in agents}
    cells = []
    for spec, path in zip(specs, paths):
        trace = Trace.load(path)
        for frac in args.limits:
            limit = pct(frac).resolve(trace)
            plans: dict[str, Any] = {}
            cell = {"network": spec.name, "family": spec.family, "batch_size": spec.batch_size,
                    "profile": spec.profile, "n_ops": trace.n_ops, "limit": frac, "limit_bytes": limit,
                    **plan_cell(trace, limit, planners, plans)}
            for agent in agents:
                cell[f"{agent}_best_baseline"], cell[f"{agent}_wins"] = judge(cell, agent, args.tolerance)
            if args.polish_control:
                cell[POLISHED] = control = polished_best_baseline(trace, limit, cell, plans)
                for agent in agents:
                    cell[f"{agent}_beats_polished"] = bool(
                        cell[agent]["feasible"] and (not control["feasible"]
                                                     or cell[agent]["overhead"] <= control["overhead"] + args.tolerance))
            cells.append(cell)
            best = cell[f"{agents[0]}_best_baseline"]
            best_text = "-" if best is None else "{:.4f} ({})".format(cell[best]["overhead"], best)
            agent_text = "  ".join(
                "{} {}{}".format(a, "{:.4f}".format(cell[a]["overhead"]) if cell[a]["feasible"] else "x",
                                 " WIN" if cell[a + "_wins"] else "") for a in agents)
            print(f"{spec.name:28s} {round(frac * 100):3d}%  best {best_text:24s} {agent_text}", flush=True)
    summary = {a: summarize(cells, a) for a in agents}
    return {"split": args.split, "per_family": args.per_family, "first_seed": args.first_seed,
            "agent": str(args.agent), "search_k": args.search_k,
            "agents": dict(item.split("=", 1) for item in args.agents or []), "tolerance": args.tolerance,
            "limits": args.limits, "polish_control": args.polish_control, "cells": cells,
            "summary": summary}


def summarize(cells: list[dict[str, Any]], agent: str) -> dict[str, Any]:
    """Cells won, cells infeasible, and the geometric mean of the makespan over the best baseline's."""
    import math

    ratios = [(1 + c[agent]["overhead"]) / (1 + c[c[f"{agent}_best_baseline"]]["overhead"]) for c in cells
              if c[agent]["feasible"] and c[f"{agent}_best_baseline"] is not None]
    out = {"wins": sum(c[f"{agent}_wins"] for c in cells), "cells": len(cells),
           "infeasible": sum(not c[agent]["feasible"] for c in cells),
           "geomean_vs_best": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None}
    if cells and f"{agent}_beats_polished" in cells[0]:
        out["at_or_below_polished_best_baseline"] = sum(c[f"{agent}_beats_polished"] for c in cells)
    return out


def ablation_markdown(result: dict[str, Any]) -> str:
    lines = ["| planner | agent | cells at or below the best baseline | infeasible | makespan / best baseline's "
             "(geometric mean) |", "|---|---|---|---|---|"]
    for a, s in result["summary"].items():
        label = a[a.index("[") + 1:-1]
        g = "-" if s["geomean_vs_best"] is None else f"{s['geomean_vs_best']:.4f}"
        lines.append(f"| {a} | `{result['agents'][label]}` | {s['wins']} / {s['cells']} | {s['infeasible']} | {g} |")
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    if result.get("agents"):
        return ablation_markdown(result)
    agents = list(result["summary"])
    control = [POLISHED] if result["cells"] and POLISHED in result["cells"][0] else []
    head = ["network", "batch, profile", "limit", *BASELINES, *control, *agents]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in result["cells"]:
        feasible = [c[n]["overhead"] for n in BASELINES if c[n]["feasible"]]
        low = min(feasible) if feasible else None

        def fmt(fig: dict[str, Any], bold: bool) -> str:
            if not fig["feasible"]:
                return "×"
            return f"**{fig['overhead']:.4f}**" if bold else f"{fig['overhead']:.4f}"

        row = [c["network"], f"b{c['batch_size']}, {c['profile']}", f"{round(c['limit'] * 100)} %"]
        row += [fmt(c[n], low is not None and c[n]["feasible"] and c[n]["overhead"] <= low + 1e-12) for n in BASELINES]
        row += [fmt(c[n], False) for n in control]
        row += [fmt(c[a], False) + (" ✓" if c[f"{a}_wins"] else "") for a in agents]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for a, s in result["summary"].items():
        lines.append(f"`{a}` at or below the best baseline (+{result['tolerance']:g}) in {s['wins']} of {s['cells']} "
                     f"cells of the {result['split']} families" + (
                         f"; at or below the best baseline polished in {s['at_or_below_polished_best_baseline']}."
                         if "at_or_below_polished_best_baseline" in s else "."))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="test", choices=("train", "validation", "test"))
    p.add_argument("--per-family", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--limits", type=float, nargs="+", default=list(LIMITS))
    p.add_argument("--agent", default=str(DEFAULT_AGENT), help="the DQN checkpoint (default: the shipped one)")
    p.add_argument("--agents", nargs="+", metavar="LABEL=PATH",
                   help="compare several agents on the same cells (an ablation) instead of --agent")
    p.add_argument("--search", action="store_true", help="also plan with dqn-search")
    p.add_argument("--search-k", type=int, default=4, help="dqn-search's width: actions tried per decision point")
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--polish-control", action="store_true",
                   help="also polish the best baseline's plan by dqn-search's local search, with the budget "
                        "dqn-search spends on its two plans: a control for what the agent adds")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args(argv)
    result = run(args)
    write_json(result, args.json)
    text = markdown(result)
    print(text)
    if args.md:
        write_text(Path(args.md), text, overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
