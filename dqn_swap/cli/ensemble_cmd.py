"""``dqn-swap ensemble``: join trained agents into one agent file that plans by the mean of their Q-values."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ensemble", help="join trained agents into one agent that plans by the mean of their Q-values",
        description="Write one agent file holding two or more trained agents of the same environment "
                    "(the same graph, recompute chains, reward and penalties). It plans by the mean of "
                    "their Q-values, still in one pass, and goes wherever an agent file does (--agent), "
                    "except as the start of train or finetune. Agents that differ only by their seed "
                    "plan quite differently on networks they have not seen; their mean is steadier "
                    "(docs/learning.md, \"Ensembles\").",
        epilog="Example: dqn-swap ensemble checkpoints/default.pt a.pt b.pt -o ensemble.pt")
    p.add_argument("agents", nargs="+", metavar="AGENT_FILE", help="two or more agent files (train's -o)")
    p.add_argument("-o", "--output", required=True, help="the ensemble's agent file to write")
    p.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dqn_swap.agents.dqn import save_ensemble

    if len(args.agents) < 2:
        raise ValueError(f"an ensemble needs at least two agent files, not {len(args.agents)}")
    out = save_ensemble(args.output, args.agents, overwrite=args.force)
    summary = {"output": str(out), "agents": list(args.agents), "bytes": out.stat().st_size}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote {out}: the ensemble of {len(args.agents)} agents ({', '.join(args.agents)}); "
              f"use it: dqn-swap plan TRACE -m 50% --agent {out} -o plan.json")
    return 0
