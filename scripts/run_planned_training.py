#!/usr/bin/env python
"""Record, plan and train a model-zoo workload with the planned-execution runtime: ``dqn-swap run``.

Measures peak allocated / reserved memory (CUDA), step time and throughput of
planned training beside unplanned training, full activation checkpointing and
``save_on_cpu``, and the simulator's prediction for the same plan; optionally
finds the largest batch size that trains under a memory budget with each
method.  Writes a JSON report (``--out``) and prints a table.

This script is that subcommand (``dqn-swap run --help`` explains every
option) with the script's own spelling and defaults: the model as the first
argument, ``--limit`` (default ``50%``, so that every model has a plan), ``--out``
(replaced if it exists); the planner is ``dqn-swap run``'s default, ``auto``, unless
``--planner`` names another.  Limits: ``50%`` is halfway from the trace's minimum memory
to its unplanned peak, as everywhere in dqn-swap; ``0.5x`` is half the unplanned peak
(below the minimum of some models); or bytes (``8GiB``); a bare ``0.5`` is refused, as
everywhere.

Examples::

    python scripts/run_planned_training.py resnet50 --batch-size 64 --limit 50% --planner greedy
    python scripts/run_planned_training.py gpt --batch-size 8 --limit 0.7x --max-batch planned,torch-checkpoint
    python scripts/run_planned_training.py mlp_tiny --device cpu --limit 50% --planner swap-all --steps 2
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dqn_swap.cli import main as cli_main  # noqa: E402

RENAMED = {"--limit": "--memory-limit", "--out": "--output"}
WITH_VALUE = {"--batch-size", "--limit", "--planner", "--steps", "--device", "--profile", "--methods",
              "--max-batch", "--budget", "--out", "--agent", "--seed", "--memory-limit", "-m", "--output", "-o",
              "--model"}


def translate(argv: list[str]) -> list[str]:
    out: list[str] = ["run"]
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if not arg.startswith("-"):
            out += ["--model", arg]  # the model, the script's first argument
            i += 1
            continue
        if name in WITH_VALUE:
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            out += [RENAMED.get(name, name), value]
            if name == "--out":
                out.append("--force")  # the script always replaced its report
            i += 1 if eq else 2
        else:
            out.append(arg)
            i += 1
    if "--memory-limit" not in out and "-m" not in out:
        out += ["--memory-limit", "50%"]
    return out


def main(argv: list[str] | None = None) -> int:
    return cli_main(translate(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
