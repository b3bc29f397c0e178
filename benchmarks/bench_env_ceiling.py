#!/usr/bin/env python
"""What the agent's environment can express: the best plans known, replayed in it.

An agent plans one action at a time, in the environment it was trained in
(:class:`dqn_swap.env.SwapRecomputeEnv`), so no agent plans better than the best plan the
environment lets an episode reach.  This script takes every cell of the table of best plans
known (``benchmarks/results/best_known.json`` and its plan files) and replays the cell's plan
in the environment as a demonstration is replayed
(:func:`dqn_swap.agents.dqn.demonstrations.demonstration_episode`: at each decision point the
plan's valid action on the largest tensor, until the plan fits), once per setting of
``recompute_chains``:

* ``off`` (the environment's default): a removal whose producer reads another removed tensor,
  or whose tensor another removal's producer reads, is not offered;
* ``on``: every removal the simulator allows is offered.

Per cell it reports the replay's makespan over the plan's own; per setting, the geometric mean
over the cells (a replay that ends without fitting counts as 2) and the cells that lose more than
2 %.  The plan's actions are nodes of the environment's graph either way (the script checks that
the plan's actions on those nodes simulate to the plan's own makespan): what a setting loses is
what its episodes cannot reach.

    python benchmarks/bench_env_ceiling.py --json benchmarks/results/env_ceiling.json \\
        --md benchmarks/results/env_ceiling.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generalization import geomean  # noqa: E402
from common import run_and_publish  # noqa: E402

#: A replay that ends without fitting counts as this ratio in the geometric means.
UNFIT = 2.0


#: The settings replayed: label -> (recompute_chains, max_chain).
SETTINGS = {"off": (False, 1), "groups of 2": (False, 2), "groups of 3": (False, 3), "groups of 6": (False, 6),
            "groups of 10": (False, 10), "on": (True, 1)}


def replay(trace: Any, plan: Any, chains: bool, max_chain: int = 1) -> dict[str, Any]:
    """``plan`` replayed in the environment with ``recompute_chains=chains`` and ``max_chain``: its figures."""
    from dqn_swap.agents.dqn.config import DQNConfig
    from dqn_swap.agents.dqn.demonstrations import action_nodes, demonstration_episode
    from dqn_swap.agents.dqn.planner import make_env

    config = DQNConfig(recompute_chains=chains, max_chain=max_chain)
    env = make_env(trace, plan.memory_limit, plan.profile, config)
    nodes = action_nodes(env, plan.actions)
    on_nodes = env.sim.run([env.graph.action(int(n)) for n in nodes])
    steps = demonstration_episode(env, plan)
    res = env.result
    base = 1.0 + float(plan.figures["overhead"])
    return {"nodes": len(nodes), "nodes_overhead": float(on_nodes.overhead), "steps": len(steps),
            "actions": len(env.actions), "feasible": bool(res.feasible),
            "overhead": float(res.overhead) if res.feasible else None,
            "ratio": (1.0 + float(res.overhead)) / base if res.feasible else UNFIT}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.plan import Plan
    from dqn_swap.trace import Trace

    table = json.loads(Path(args.best_known).read_text())["cells"]
    traces: dict[str, Any] = {}
    for path in sorted((ROOT / "runs" / "corpus").glob("*/*.trace")):
        t = Trace.load(path)
        traces[t.fingerprint] = t
    cells = []
    for key, entry in sorted(table.items()):
        trace = traces.get(entry["fingerprint"])
        if trace is None:
            raise ValueError(f"{key}: no recorded trace with fingerprint {entry['fingerprint']} under runs/corpus/ "
                             "(run benchmarks/bench_generalization.py --split test first)")
        plan = Plan.load(ROOT / entry["plan_file"], trace)
        cell = {"cell": key, "family": entry["family"], "planner": entry["planner"],
                "plan_overhead": float(plan.figures["overhead"]), "plan_actions": len(plan.actions)}
        for label, (chains, max_chain) in SETTINGS.items():
            cell[label] = replay(trace, plan, chains, max_chain)
            if abs(cell[label]["nodes_overhead"] - cell["plan_overhead"]) > 1e-9:
                raise ValueError(f"{key}: the plan's actions on the environment's nodes simulate to "
                                 f"{cell[label]['nodes_overhead']:.6f}, not the plan's {cell['plan_overhead']:.6f}")
        cells.append(cell)
        print(f"{key}: {cell['plan_overhead']:.4f}, replayed "
              + ", ".join(f"{cell[label]['ratio']:.4f} ({label})" for label in SETTINGS), file=sys.stderr)
    summary = {}
    for label in SETTINGS:
        ratios = [c[label]["ratio"] for c in cells]
        summary[label] = {"geomean": geomean(ratios), "cells": len(ratios),
                          "unfit": sum(not c[label]["feasible"] for c in cells),
                          "over_2pct": sum(r > 1.02 for r in ratios),
                          "by_family": {f: geomean([c[label]["ratio"] for c in cells if c["family"] == f])
                                        for f in sorted({c["family"] for c in cells})}}
    return {"best_known": args.best_known, "unfit_counts_as": UNFIT, "summary": summary,
            "cells": cells}


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = ["| recompute chains | cells | replay makespan / plan's (geometric mean) | replays that do not fit | "
             "cells more than 2 % above |", "|---|---|---|---|---|"]
    for label in SETTINGS:
        x = s[label]
        lines.append(f"| {label} | {x['cells']} | {x['geomean']:.4f} | {x['unfit']} | {x['over_2pct']} |")
    fams = sorted(s["off"]["by_family"])
    lines += ["", "| family | " + " | ".join(f"chains {label}" for label in SETTINGS) + " |",
              "|---|" + "---|" * len(SETTINGS)]
    lines += [f"| `{f}` | " + " | ".join(f"{s[label]['by_family'][f]:.4f}" for label in SETTINGS) + " |"
              for f in fams]
    lines += ["", f"A replay that does not fit counts as {result['unfit_counts_as']:g}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--best-known", default="benchmarks/results/best_known.json")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args(argv)
    return run_and_publish("bench_env_ceiling", run, markdown, args, errors=(ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
