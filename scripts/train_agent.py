#!/usr/bin/env python
"""Train a DQN agent on one or more networks at one or more memory limits: ``dqn-swap train``.

This script is that subcommand (``dqn-swap train --help`` explains every option);
it also takes the script's earlier spelling, ``--trace`` (repeatable),
``--limits`` (space-separated limits, written as everywhere in dqn-swap: ``90%``,
``0.5x`` or bytes) and ``--out``.

Examples::

    python scripts/train_agent.py resnet50:64 --memory-limits 90%,70%,50%,30% -o checkpoints/resnet50.pt
    python scripts/train_agent.py --trace resnet_tiny:8 --trace gpt_tiny:4 --limits 30% 50% 70% 90% \
        --steps 20000 --out checkpoints/default.pt --curve checkpoints/default.png

A trace is a ``.trace`` file or ``model:batch`` (recorded on the meta device).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dqn_swap.cli import main as cli_main  # noqa: E402


def translate(argv: list[str], command: str) -> list[str]:
    """The script's earlier options as the subcommand's: --trace T -> T, --limits A B -> -m A,B, --out -> -o."""
    traces: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name == "--trace":
            traces.append(value if eq else argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if eq else 2
        elif name == "--limits":
            values = [value] if eq else []
            i += 1
            while not eq and i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
            rest += ["--memory-limits", ",".join(values)]
        elif name == "--out":
            rest += ["--output", value] if eq else ["--output", *argv[i + 1:i + 2]]
            i += 1 if eq else 2
        else:
            rest.append(arg)
            i += 1
    return [command, *traces, *rest]


def main(argv: list[str] | None = None) -> int:
    return cli_main(translate(list(sys.argv[1:] if argv is None else argv), "train"))


if __name__ == "__main__":
    sys.exit(main())
