"""``dqn-swap finetune``: continue training an agent on other (larger) networks."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import AGENT_HELP, MAX_SEED, MAX_STEPS, whole
from .train_cmd import (TRACE_HELP, add_training_options, check_outputs, check_settings, command_line,
                        load_traces, log_dir, split_limits, summarise, training_limits)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "finetune", help="fine-tune a trained DQN agent on other networks",
        description="Continue training an agent on other (usually larger) traces: train on small "
                    "graphs, fine-tune on a large one (section 4.4.2 of the DQN paper). The agent's "
                    "settings are kept, with less exploration (--start-e), a smaller learning rate that "
                    "rises over the first tenth of the updates and falls to zero at the end, "
                    "a short warm-up and an update every step; the starting agent is evaluated first, so the result is "
                    "never worse than it on these traces. From an ensemble file, the mean of its "
                    "agents' Q-values is what is trained, and the result is an ensemble file.",
        epilog="Example: dqn-swap finetune resnet152:32 --from checkpoints/default.pt "
               "--memory-limits 90%,70%,50%,30% --steps 3000 -o resnet152-ft.pt")
    p.add_argument("traces", nargs="+", metavar="TRACE", help=TRACE_HELP)
    p.add_argument("--from", dest="source", metavar="AGENT_FILE",
                   help=f"agent to start from: {AGENT_HELP}")
    add_training_options(p, default_limits="90%,70%,50%,30%")
    p.add_argument("--steps", type=whole(1, MAX_STEPS, "steps"),
                   help="environment steps (default: a quarter of the agent's own training, at least 1000)")
    p.add_argument("--start-e", type=float, default=0.2,
                   help="exploration at the start: the chance of a random action, decaying over the first "
                        "30%% of the steps (default 0.2; training from scratch starts at 1.0)")
    p.add_argument("--seed", type=whole(0, MAX_SEED, "seed"), help="random seed (default: the starting agent's)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted fine-tuning from the -o file's resume file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dqn_swap.agents.dqn.report import parse_overrides

    out = check_outputs(args, resume=args.resume)
    if args.source is None:
        from dqn_swap.agents.dqn.planner import DEFAULT_AGENT

        source = Path(DEFAULT_AGENT)
    else:
        from dqn_swap.agents.dqn.agent_file import agent_location

        source = agent_location(args.source)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such agent file (--from)")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be at least 1, not {args.steps}")
    if not 0 <= args.start_e <= 1:
        raise ValueError(f"--start-e is a probability between 0 and 1, not {args.start_e}")
    overrides = parse_overrides(args.overrides)
    if args.seed is not None:
        overrides["seed"] = args.seed
    check_settings(overrides)
    traces = load_traces(args.traces, args.profile)
    limits = training_limits(traces, split_limits(args.memory_limits))
    from dqn_swap.agents.dqn.algorithm import finetune

    result = finetune(source, list(traces.values()), limits, out, total_timesteps=args.steps, start_e=args.start_e,
                      config_overrides=overrides, profile=args.profile, log_dir=log_dir(args.log_dir),
                      run_name=args.run_name, progress=None, resume=args.resume, overwrite=args.force,
                      command=command_line(args), threads=args.threads)
    return summarise(result, args, "fine-tuned", start_phase="start")
