#!/usr/bin/env python
"""Fine-tune a trained agent on a larger network (section 4.4.2 of the DQN paper): ``dqn-swap finetune``.

This script is that subcommand (``dqn-swap finetune --help`` explains every
option); it also takes the script's earlier spelling, ``--trace``
(repeatable), ``--limits`` (space-separated, as everywhere: ``90%``, ``0.5x`` or bytes) and ``--out``.

Examples::

    python scripts/finetune_agent.py resnet152:32 --from checkpoints/default.pt \
        --memory-limits 90%,70%,50%,30% --steps 3000 -o runs/resnet152_ft.pt
    python scripts/finetune_agent.py --from checkpoints/default.pt --trace resnet152:32 \
        --limits 90% 70% 50% 30% --steps 3000 --out runs/resnet152_ft.pt
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dqn_swap.cli import main as cli_main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_agent import translate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return cli_main(translate(list(sys.argv[1:] if argv is None else argv), "finetune"))


if __name__ == "__main__":
    sys.exit(main())
