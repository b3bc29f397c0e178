#!/usr/bin/env python
"""Fine-tune a trained agent on a larger network (section 4.4.2 of the DQN paper).

Example::

    python scripts/finetune_agent.py --from checkpoints/default.pt --trace resnet152:32 \
        --limits 0.9 0.7 0.5 0.3 --steps 3000 --out runs/resnet152_ft.pt
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.dqn.algorithm import finetune  # noqa: E402
from agents.dqn.planner import DEFAULT_AGENT  # noqa: E402
from agents.dqn.report import load_trace_spec, parse_overrides, plot_curves  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", default=str(DEFAULT_AGENT), help="checkpoint to start from")
    ap.add_argument("--trace", action="append", required=True, help="trace file or model:batch (repeatable)")
    ap.add_argument("--limits", nargs="+", type=float, default=[0.9, 0.7, 0.5, 0.3])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--start-e", type=float, default=0.2)
    ap.add_argument("--profile", default="v100-pcie3")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--log-dir", default="runs")
    ap.add_argument("--run-name")
    ap.add_argument("--curve")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    try:
        traces = [load_trace_spec(s, args.profile) for s in args.trace]
        command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
        res = finetune(args.source, traces, args.limits, args.out, total_timesteps=args.steps, start_e=args.start_e,
                       config_overrides=parse_overrides(args.set), profile=args.profile, log_dir=args.log_dir, run_name=args.run_name,
                       overwrite=args.force, command=command, threads=args.threads)
    except (ValueError, OSError) as e:
        print(f"finetune_agent: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.curve:
        plot_curves({"fine-tuned": [(e["step"], e["score"]) for e in res.evaluations]}, args.curve)
    print(f"saved {res.path} after {res.steps} steps in {res.wall_time:.0f} s; best score {res.best['score']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
