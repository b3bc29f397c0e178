"""The ``dqn-swap`` command: one subcommand per workflow.

Every subcommand lives in its own module with ``add_parser(subparsers)``,
which registers it and sets ``func`` to the function that runs it.  Errors
users can cause (bad names, files, limits) become one line on stderr and exit
status 2; nothing they saved is overwritten without ``--force``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import DqnSwapError
from . import (compare_cmd, ensemble_cmd, explain_cmd, finetune_cmd, inspect_cmd, max_batch_cmd, record_cmd, run_cmd,
               simulate_cmd, train_cmd)

# Modules that add subcommands, in the order ``--help`` lists them (simulate_cmd adds
# simulate and plan).
SUBCOMMANDS = [record_cmd, inspect_cmd, simulate_cmd, explain_cmd, max_batch_cmd, compare_cmd, train_cmd, finetune_cmd, ensemble_cmd, run_cmd]


class UserError(DqnSwapError):
    """A problem the user can fix; printed as one line."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (and the way to the help) instead of usage plus error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dqn-swap",
        description="Train networks larger than GPU memory: record one training iteration, "
                    "plan which tensors to swap to host memory or recompute, and run the plan.",
        epilog="Start with: dqn-swap record --model resnet50 --batch-size 64 -o r50.trace; "
               "then dqn-swap inspect r50.trace and dqn-swap plan r50.trace -m 50% -o plan.json.  "
               "Each subcommand has --help.")
    parser.add_argument("--version", action="version", version=f"dqn-swap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


#: Options whose value may start with a minus sign that argparse would take for an option.
_SIGNED_VALUES = ("-m", "--memory-limit", "--memory-limits")


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``-m -5%`` as ``-m-5%``: argparse reads ``-5%`` as an unknown option and says "expected one
    argument"; attached, the value reaches the limit's own check, which says what a limit may be."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _SIGNED_VALUES and i + 1 < len(argv) and re.match(r"-[\d.]", argv[i + 1]):
            out.append(tok + ("=" if tok.startswith("--") else "") + argv[i + 1])
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = _attach_negative_values(list(sys.argv[1:] if argv is None else argv))
    from .common import register_named_planners

    register_named_planners(argv)  # a user's planner named by --planner: its options become flags
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed on one line
        return int(e.code or 0)
    args.argv = argv  # the command line, recorded in what train and finetune save
    from .. import stop

    if sys.stdout is None:  # started with standard output closed (`>&-`): every command prints its result there
        if sys.stderr is not None:
            print(f"dqn-swap {args.command}: error: standard output is closed; the result would be lost "
                  "(redirect it to a file or /dev/null instead)", file=sys.stderr)
        return 2
    try:
        with stop.installed():  # SIGINT and SIGTERM stop a command with one line, exit 130 or 143
            return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as e:
        stopped = stop.as_stopped(e)
        print(f"dqn-swap {args.command}: stopped by {stopped.name}; "
              f"{stopped.detail or 'nothing more was written'}", file=sys.stderr)
        return stopped.exit_status
    except MemoryError:
        print(f"dqn-swap {args.command}: error: out of host memory (a smaller batch, or --device meta)",
              file=sys.stderr)
        return 2
    except (UserError, ValueError, OSError, RuntimeError) as e:
        text = str(e).strip()
        for arg in argv:  # a name with a line break in it stays on the one line, escaped
            if "\n" in arg or "\r" in arg:
                text = text.replace(arg, arg.encode("unicode_escape").decode("ascii"))
        message = text.splitlines()[0] if text else type(e).__name__
        print(f"dqn-swap {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
