#!/usr/bin/env python
"""Train a DQN agent on one or more networks at one or more memory limits.

Examples::

    python scripts/train_agent.py --trace resnet50:64 --limits 0.9 0.7 0.5 0.3 --out checkpoints/resnet50.pt
    python scripts/train_agent.py --trace resnet_tiny:8 --trace gpt_tiny:4 --limits 0.3 0.5 0.7 0.9 \
        --steps 20000 --out checkpoints/default.pt --curve checkpoints/default.png

``--trace`` takes a ``.trace`` file or ``model:batch`` (recorded on the meta device).
Limits are fractions of the way from the trace's minimum memory to its peak, or bytes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.dqn import DQNConfig  # noqa: E402
from agents.dqn.algorithm import train  # noqa: E402
from agents.dqn.report import load_trace_spec, parse_overrides, plot_curves  # noqa: E402


def parse_limit(s: str) -> float | int:
    v = float(s)
    return v if 0 < v <= 1 else int(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", required=True, help="trace file or model:batch (repeatable)")
    ap.add_argument("--limits", nargs="+", type=parse_limit, default=[0.9, 0.7, 0.5, 0.3])
    ap.add_argument("--out", required=True, help="checkpoint to write")
    ap.add_argument("--steps", type=int, help="environment steps (config.total_timesteps)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="v100-pcie3")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="DQNConfig field")
    ap.add_argument("--log-dir", default="runs")
    ap.add_argument("--run-name")
    ap.add_argument("--curve", help="PNG of the greedy evaluation score over training")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--force", action="store_true", help="replace an existing checkpoint")
    args = ap.parse_args(argv)
    try:
        cfg = DQNConfig().replace(seed=args.seed, **parse_overrides(args.set))
        if args.steps:
            cfg = cfg.replace(total_timesteps=args.steps)
        traces = [load_trace_spec(s, args.profile) for s in args.trace]
        command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
        res = train(traces, args.limits, args.out, cfg, profile=args.profile, log_dir=args.log_dir,
                    run_name=args.run_name, resume=args.resume, overwrite=args.force, command=command,
                    threads=args.threads)
    except (ValueError, OSError) as e:
        print(f"train_agent: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.curve:
        plot_curves({"greedy plan": [(e["step"], e["score"]) for e in res.evaluations]}, args.curve,
                    title=f"{Path(args.out).name}: {', '.join(args.trace)} @ {args.limits}")
    last = res.evaluations[-1]
    print(f"saved {res.path} after {res.steps} steps in {res.wall_time:.0f} s; best score {res.best['score']:.4f} "
          f"at step {res.best.get('step')}; last: overhead {last['overhead']:.4f}, feasible {last['feasible']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
