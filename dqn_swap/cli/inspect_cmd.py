"""``dqn-swap inspect``: summarise a trace and plot its memory over time."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import human, load_trace, print_json, print_table


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect", help="summarise a trace and plot its memory over time",
        description="Print a trace's figures: events, ops, peak memory and the op where it occurs, "
                    "total compute time, bytes of activations saved for backward, and the minimum "
                    "memory any plan needs (what stays on the device at the busiest op with every "
                    "saved activation moved away between its uses). Also writes a PNG of memory over time, "
                    "coloured by phase.",
        epilog="Example: dqn-swap inspect r50.trace --plot r50-memory.png")
    p.add_argument("trace", help="trace file written by 'dqn-swap record'")
    p.add_argument("--plot", help="PNG to write (default: TRACE-memory.png beside the trace)")
    p.add_argument("--no-plot", action="store_true", help="do not write a plot")
    p.add_argument("--force", action="store_true", help="replace the plot file even if it is not ours")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..plots import check_output, memory_plot

    trace = load_trace(args.trace)
    summary = {"trace": args.trace, **trace.summary()}
    if not args.no_plot:
        # the name as given (a Path would drop a trailing separator, which names a folder)
        path = check_output(args.plot if args.plot is not None else
                            Path(args.trace).with_name(Path(args.trace).stem + "-memory.png"), args.force, png=True)
        memory_plot(trace, path)
        summary["plot"] = str(path)
    if args.json:
        print_json(summary)
    else:
        print_table([(k, human(k, v)) for k, v in summary.items()])
    return 0
