"""Local search after decoding (dqn_swap.agents.local_search): which starting plan it needs, and what
``dqn-search`` costs on the comparison grid.

``control`` (the default): on every cell of the comparison grid, the simulated overhead of

* the best baseline's plan, and the same plan polished;
* the agent's greedy plan (``dqn``), and the same plan polished;
* ``dqn-search`` (lookahead, then polished: the planner as shipped).

Every plan is polished with the same budget, the default of
:func:`dqn_swap.agents.local_search.default_simulations` for the trace (``dqn-search`` polishes
two plans, its lookahead's and its greedy one, with that budget each).  If the polished baseline
plan were as good as ``dqn-search``, the agent would add nothing; the table says how much it adds.

    python benchmarks/bench_polish.py control --json benchmarks/results/polish_grid.json

``grid``: ``dqn-search`` (the shipped agent, one thread) on every cell of the comparison grid, with
its simulated overhead, its CPU seconds (``time.process_time``) and the simulations it ran
(``Simulator.run`` calls, and ``Simulator.memory_need`` calls apart).  ``--before FILE`` (an
earlier ``grid`` result, e.g. of the program before a change) adds that run's figures to each cell
and says whether the plan is no worse (overhead at most the earlier one, +1e-9):

    python benchmarks/bench_polish.py grid --json benchmarks/results/search_grid.json \\
        --before benchmarks/results/search_grid_before.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GRID, LIMITS, PROFILE, get_trace, pct, write_json  # noqa: E402
from bench_planners import count_simulations  # noqa: E402

#: A cell's plan counts as no worse than the earlier run's when its overhead is at most this above.
NO_WORSE_TOLERANCE = 1e-9


def run_control(args: argparse.Namespace) -> dict[str, Any]:
    from common import BASELINES

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


def search_cell(trace: Any, limit: int, threads: int = 1, time_limit: float | None | bool = None) -> dict[str, Any]:
    """``dqn-search`` (shipped agent) on one cell: figures, CPU seconds, simulations."""
    from dqn_swap.agents import get_planner

    planner = get_planner("dqn-search", threads=threads, **({} if time_limit is False else {"time_limit": time_limit}))
    with count_simulations() as counts:
        c0 = time.process_time()
        plan = planner.plan(trace, limit, PROFILE)
        cpu = time.process_time() - c0
    f = plan.figures
    return {"feasible": bool(f.get("feasible")), "overhead": f.get("overhead") if f.get("feasible") else None,
            "makespan": f.get("makespan") if f.get("feasible") else None, "n_actions": len(plan.actions),
            "cpu_s": round(cpu, 3), "simulations": counts["run"], "memory_need_calls": counts["memory_need"],
            "decoded": plan.settings.get("decoded"), "polish": plan.settings.get("polish")}


def no_worse(after: dict[str, Any], before: dict[str, Any]) -> bool:
    """Whether ``after``'s plan is at least as good as ``before``'s: it fits wherever that one did, and
    its overhead is at most ``before``'s (+ :data:`NO_WORSE_TOLERANCE`)."""
    if not before.get("feasible"):
        return True
    return bool(after.get("feasible")) and after["overhead"] <= before["overhead"] + NO_WORSE_TOLERANCE


def run_grid(args: argparse.Namespace) -> dict[str, Any]:
    import json

    before = {}
    if args.before:
        earlier = json.loads(Path(args.before).read_text())
        before = {(c["model"], c["limit"]): c["dqn-search"] for c in earlier["cells"]}
    cells = []
    for model in args.models:
        trace = get_trace(model, GRID[model])
        for frac in LIMITS:
            limit = pct(frac).resolve(trace)
            cell: dict[str, Any] = {"model": model, "limit": frac, "limit_bytes": limit,
                                    "fingerprint": trace.fingerprint, "dqn-search": search_cell(trace, limit)}
            s = cell["dqn-search"]
            line = (f"{model:9s} {frac:4.0%}  overhead {s['overhead'] if s['feasible'] else 'infeasible'!s:>22}  "
                    f"{s['cpu_s']:8.2f} CPU s  {s['simulations']:7d} simulations")
            b = before.get((model, frac))
            if b is not None:
                cell["before"] = b
                cell["no_worse"] = no_worse(s, b)
                line += (f"  | before {b['overhead'] if b['feasible'] else 'infeasible'!s:>22} {b['cpu_s']:8.2f} s "
                         f"{b['simulations']:7d} sims  {'ok' if cell['no_worse'] else 'WORSE'}")
            print(line, flush=True)
            cells.append(cell)
    out: dict[str, Any] = {"profile": PROFILE, "agent": "checkpoints/default.pt", "threads": 1, "cells": cells,
                           "cpu_s": round(sum(c["dqn-search"]["cpu_s"] for c in cells), 3),
                           "simulations": sum(c["dqn-search"]["simulations"] for c in cells)}
    if before:
        compared = [c for c in cells if "before" in c]
        out["before_file"] = args.before
        out["no_worse"] = sum(c["no_worse"] for c in compared)
        out["better"] = sum(1 for c in compared if c["before"].get("feasible") and c["dqn-search"]["feasible"]
                            and c["dqn-search"]["overhead"] < c["before"]["overhead"] - NO_WORSE_TOLERANCE)
        out["compared"] = len(compared)
        out["before_cpu_s"] = round(sum(c["before"]["cpu_s"] for c in compared), 3)
        out["before_simulations"] = sum(c["before"]["simulations"] for c in compared)
        print(f"no worse in {out['no_worse']} of {out['compared']} cells (better in {out['better']}); CPU "
              f"{out['cpu_s']:.1f} s against {out['before_cpu_s']:.1f} s, simulations {out['simulations']} "
              f"against {out['before_simulations']}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", choices=("control", "grid"), default="control",
                   help="control: the starting plan's share (default); grid: dqn-search's cost and plans")
    p.add_argument("--models", nargs="+", default=list(GRID), choices=list(GRID))
    p.add_argument("--before", help="grid: an earlier grid result to compare each cell with")
    p.add_argument("--json", help="write the result to this file")
    args = p.parse_args(argv)
    if args.before and not Path(args.before).is_file():
        p.error(f"--before {args.before}: no such file")
    result = run_control(args) if args.mode == "control" else run_grid(args)
    write_json(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
