"""Local search after decoding (dqn_swap.agents.local_search): which starting plan it needs.

On every cell of the comparison grid, the simulated overhead of

* the best baseline's plan, and the same plan polished;
* the agent's greedy plan (``dqn``), and the same plan polished;
* ``dqn-search`` (lookahead, then polished: the planner as shipped).

Every plan is polished with the same budget, the default of
:func:`dqn_swap.agents.local_search.default_simulations` for the trace (``dqn-search`` polishes
two plans, its lookahead's and its greedy one, with that budget each).  If the polished baseline
plan were as good as ``dqn-search``, the agent would add nothing; the table says how much it adds.

    python benchmarks/bench_polish.py --json benchmarks/results/polish_grid.json
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dqn import GRID, LIMITS, PROFILE, get_trace, pct, write_json  # noqa: E402
from bench_optimal import BASELINES  # noqa: E402


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents import get_planner
    from dqn_swap.agents.local_search import polish
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import Simulator

    prof = get_profile(PROFILE)
    cells = []
    for model in args.models:
        trace = get_trace(model, GRID[model])
        compute = trace.compute_time
        for frac in LIMITS:
            limit = pct(frac).resolve(trace)
            sim = Simulator(trace, limit, prof)
            plans = {n: get_planner(n).plan(trace, limit, prof) for n in BASELINES}
            fits = {n: p for n, p in plans.items() if p.figures.get("feasible")}
            cell: dict[str, Any] = {"model": model, "limit": frac, "limit_bytes": limit}
            starts = {"dqn": get_planner("dqn").plan(trace, limit, PROFILE)}
            if fits:
                best = min(fits, key=lambda n: fits[n].figures["overhead"])
                starts = {"best_baseline": fits[best], **starts}
                cell["best_baseline_name"] = best
            for label, plan in starts.items():
                cell[label] = plan.figures["overhead"] if plan.figures.get("feasible") else math.inf
                if plan.figures.get("feasible"):
                    cell[f"{label}_polished"] = polish(sim, plan.actions).result.makespan / compute - 1
            cell["dqn-search"] = get_planner("dqn-search").plan(trace, limit, PROFILE).figures["overhead"]
            cells.append(cell)
            print(f"{model:9s} {frac:4.0%}  " + "  ".join(f"{k} {v:.4f}" for k, v in cell.items()
                                                       if isinstance(v, float) and k not in ("limit",)), flush=True)
    from dqn_swap.agents.local_search import EVENT_BUDGET

    return {"event_budget_per_polish": EVENT_BUDGET, "cells": cells}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(GRID))
    p.add_argument("--json")
    args = p.parse_args(argv)
    write_json(run(args), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
