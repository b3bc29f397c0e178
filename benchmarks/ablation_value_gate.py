#!/usr/bin/env python
"""Can an ensemble pick its best member in one pass, by the members' own value estimates?

Decoding an ensemble by members (:class:`dqn_swap.agents.dqn.DQNPlanner`, ``members=True``)
decodes the mean and every member and keeps the plan the simulator finds fastest: many passes.
A one-pass stand-in would choose the member *before* decoding, by what the agent itself predicts:
member :math:`k`'s value of the first state, :math:`V_k(s_0) = \\max_a \\hat Q_k(s_0, a)`, an
estimate of the return its greedy episode earns (the return is minus the overhead the plan adds,
in the environment's reward units).  This script measures, per cell of a split's networks:

* ``mean``: the ensemble's one-pass plan (the mean of the Q-values; what ``dqn`` does);
* ``gate``: the plan of the member with the highest :math:`V_k(s_0)`, one pass after one
  forward per member;
* ``best member`` and ``best of all``: the fastest member's plan, and the fastest of the mean's and
  the members' (decoding by members: the ceiling of any choice among these plans);

each scored as in ``bench_generalization.py``: cells at or below the best baseline (+0.001), and the
geometric mean of the makespan over the best baseline's.  It also reports how often the gate picks
the fastest member, and the mean Spearman correlation, over cells where the members' plans differ,
between :math:`V_k(s_0)` and minus the member's overhead (1 would mean the values rank members as
the simulator does).

The baselines' figures come from an earlier ``bench_generalization.py`` result of the same split
(``--reuse``), matched by trace fingerprint and limit.

Example::

    python benchmarks/ablation_value_gate.py --split validation --per-family 2 \\
        --reuse benchmarks/results/generalization_validation_ablation.json \\
        --json benchmarks/results/ensemble_value_gate.json --md benchmarks/results/ensemble_value_gate.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LIMITS, ROOT, run_and_publish  # noqa: E402

CORPUS = ROOT / "runs" / "corpus"
TOLERANCE = 1e-3


def ranks(xs: list[float]) -> list[float]:
    """Ranks of ``xs`` (1 = smallest), ties given their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation of ``a`` and ``b``; None when either is constant."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else None


def score(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    wins = sum(r[key] is not None and r[key] <= r["best_baseline"] + TOLERANCE for r in rows)
    ratios = [(1 + r[key]) / (1 + r["best_baseline"]) for r in rows if r[key] is not None]
    return {"wins": wins, "cells": len(rows), "infeasible": sum(r[key] is None for r in rows),
            "geomean_vs_best": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    from dqn_swap.agents import get_planner
    from dqn_swap.agents.dqn.planner import greedy_q
    from dqn_swap.agents.dqn.policy import GraphBatcher, QEnsemble
    from dqn_swap.models.corpus import record_corpus
    from dqn_swap.models.generator import corpus
    from dqn_swap.trace import Trace

    torch.set_num_threads(1)
    reused = {(c["fingerprint"], c["limit"]): c for c in json.loads(Path(args.reuse).read_text())["cells"]}
    specs = corpus(args.split, args.per_family, 0)
    paths = record_corpus(specs, CORPUS / args.split)
    planner = get_planner("dqn", agent=args.agent, threads=1, members=True)
    label, net, config = planner.portfolio[0]
    if not isinstance(net, QEnsemble):
        raise ValueError(f"{args.agent}: not an ensemble (its members are what the gate chooses among)")
    rows = []
    for spec, path in zip(specs, paths):
        trace = Trace.load(path)
        for limit in args.limits:
            ref = reused.get((trace.fingerprint, limit))
            if ref is None:
                raise ValueError(f"{args.reuse} has no cell for {trace.meta.get('model')} at {limit:.0%} "
                                 "(record it with bench_generalization.py on the same split)")
            plan = planner.plan(trace, ref["limit_bytes"], ref["profile"])
            overheads = next(iter(plan.settings["member_overheads"].values()))  # mean, then each member
            env = planner._env(trace, ref["limit_bytes"], ref["profile"], config)
            env.reset(seed=0)
            batcher = GraphBatcher()
            values = [float(np.max(greedy_q(m, batcher, env))) for m in net.members]
            members = overheads[1:]
            gate = max(range(len(values)), key=lambda k: values[k])
            feasible = [o for o in members if o is not None]
            row = {"network": ref["network"], "limit": limit, "best_baseline": ref[ref["best_baseline"]]["overhead"],
                   "mean": overheads[0], "gate": members[gate], "gate_member": gate,
                   "best member": min(feasible) if feasible else None,
                   "best of all": min(o for o in overheads if o is not None), "values": values,
                   "member_overheads": members}
            pairs = [(v, -o) for v, o in zip(values, members) if o is not None]
            row["spearman"] = spearman([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) > 2 else None
            rows.append(row)
            print(f"{ref['network']} {limit:.0%}: mean {overheads[0]}, gate (member {gate}) {members[gate]}, "
                  f"best member {row['best member']}", file=sys.stderr, flush=True)
    correlations = [r["spearman"] for r in rows if r["spearman"] is not None]
    return {"split": args.split, "per_family": args.per_family, "agent": args.agent, "limits": args.limits,
            "tolerance": TOLERANCE, "cells": rows,
            "summary": {k: score(rows, k) for k in ("mean", "gate", "best member", "best of all")},
            "gate_picks_best_member": sum(r["gate"] is not None and r["gate"] == r["best member"] for r in rows),
            "mean_spearman": sum(correlations) / len(correlations) if correlations else None,
            "cells_with_spearman": len(correlations)}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"`{result['agent']}` on the {result['split']} families ({len(result['cells'])} cells): the member "
             "chosen by its own value of the first state, against the mean and the members' best.", "",
             "| decoding | passes | cells at or below the best baseline (+0.001) | makespan / best baseline's "
             "(geomean) |", "|---|---|---|---|"]
    passes = {"mean": "1", "gate": "1 (+1 forward a member)", "best member": "one a member",
              "best of all": "1 + one a member"}
    for k, s in result["summary"].items():
        g = f"{s['geomean_vs_best']:.4f}" if s["geomean_vs_best"] is not None else "–"
        lines.append(f"| {k} | {passes[k]} | {s['wins']} / {s['cells']} | {g} |")
    rho = result["mean_spearman"]
    lines += ["", f"The gate picks the fastest member in {result['gate_picks_best_member']} of "
              f"{len(result['cells'])} cells; the mean Spearman correlation of the members' values with minus "
              f"their overheads, over the {result['cells_with_spearman']} cells where these differ, is "
              f"{rho:.3f}." if rho is not None else ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="validation", choices=("train", "validation", "test"))
    p.add_argument("--per-family", type=int, default=2)
    p.add_argument("--limits", type=float, nargs="+", default=list(LIMITS))
    p.add_argument("--agent", default="checkpoints/ensemble.pt", help="an ensemble file (default: the shipped one)")
    p.add_argument("--reuse", required=True, metavar="RESULT.json",
                   help="a bench_generalization.py result of the same split: the baselines' figures")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args(argv)
    return run_and_publish("ablation_value_gate", run, markdown, args, errors=(ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
