"""``dqn-swap inspect``: summarise a trace and plot its memory over time."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_plot_options, human, load_trace, plot_path, print_json, print_table


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
    add_plot_options(p, "TRACE-memory.png beside the trace")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..plots import memory_plot

    trace = load_trace(args.trace)
    summary = {"trace": args.trace, **trace.summary()}
    path = plot_path(args, Path(args.trace).with_name(Path(args.trace).stem + "-memory.png"))
    if path is not None:
        memory_plot(trace, path)
        summary["plot"] = str(path)
    if args.json:
        print_json(summary)
    else:
        print_table([(k, human(k, v)) for k, v in summary.items()])
    return 0
