"""``dqn-swap explain``: what a plan does to the model, module by module, and a plot of it."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cost import PROFILES
from .common import add_plot_options, human, load_trace, plot_path, print_json, print_table

#: How many trace files beside the plan ``explain`` opens, at most, to find the plan's own.
SEARCHED_TRACES = 20


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain", help="say what a plan does to the model, module by module, and plot it",
        description="Read a plan and its trace, simulate the plan, and say what it does in the model's terms: "
                    "per module, how many activations (and bytes) are swapped to host memory and how many "
                    "are dropped and re-created in backward; where the limit binds (the op where the unplanned "
                    "iteration would overflow it, the op of the planned peak); and, with --actions, every "
                    "action: which tensor, made by which op, when it leaves the device, when its copy back "
                    "starts or which ops re-run, and which op needs it. Writes a PNG of memory over the "
                    "iteration, unplanned and planned, with the limit, the minimum, forward and backward, "
                    "and the copies and re-runs drawn below.",
        epilog="Example: dqn-swap explain plan.json --trace r50.trace --depth 2 --plot plan.png. "
               "Without --trace, the trace files beside the plan and in the current folder are searched "
               "for the one the plan was made for.")
    p.add_argument("plan", help="plan file written by 'dqn-swap plan' (or autoplan's cache)")
    p.add_argument("--trace", help="the trace the plan was made for (default: found beside the plan by "
                                   "its fingerprint)")
    p.add_argument("--depth", type=int, default=None, metavar="N",
                   help="sum per module path cut to N parts (layer1.0.conv1 at 2 is layer1.0); default: full paths")
    p.add_argument("--actions", action="store_true", help="also list every action, in forward order")
    p.add_argument("--profile", choices=list(PROFILES),
                   help="device profile for the simulation (default: the plan's)")
    add_plot_options(p, "PLAN-explained.png beside the plan")
    p.add_argument("--json", action="store_true", help="print the whole explanation as JSON")
    p.set_defaults(func=run)


def find_trace(plan_path: Path, fingerprint: str):  # noqa: ANN201
    """The trace file beside the plan, or in the current folder, that the plan was made for."""
    from ..trace import Trace, TraceError

    seen = 0
    # autoplan's cache names a signature's files KEY.trace and KEY.plan.json: that one first
    stem = plan_path.name.removesuffix(".json").removesuffix(".plan")
    likely = [plan_path.with_name(stem + ".trace")]
    for folder in dict.fromkeys([plan_path.parent, Path(".")]):
        for candidate in [c for c in likely if c.parent == folder and c.is_file()] + sorted(folder.glob("*.trace")):
            if seen >= SEARCHED_TRACES:
                break
            seen += 1
            try:
                trace = Trace.load(candidate)
            except TraceError:
                continue
            if trace.fingerprint == fingerprint:
                return candidate, trace
    raise ValueError(f"{plan_path}: made for trace {fingerprint}, and no trace file beside it or in the current "
                     "folder is that trace; give it with --trace")


def run(args: argparse.Namespace) -> int:
    from ..explain import explain_plan
    from ..plan import Plan
    from ..plots import plan_memory_plot

    if args.depth is not None and args.depth < 1:
        raise ValueError(f"--depth must be 1 or more, not {args.depth}")
    plot = plot_path(args, Path(args.plan).with_name(Path(args.plan).stem + "-explained.png"))
    plan = Plan.load(args.plan)
    if args.trace:
        trace_path, trace = Path(args.trace), load_trace(args.trace)
    else:
        trace_path, trace = find_trace(Path(args.plan), plan.trace_fingerprint)
    report = explain_plan(trace, plan, args.profile, depth=args.depth, timeline=plot is not None, where=args.plan)
    report["trace"] = str(trace_path)
    if plot is not None:
        plan_memory_plot(trace, report, plot)
        report["plot"] = str(plot)
    for key in [k for k in report if k.startswith("_")]:
        del report[key]
    if not args.json:
        show(report, args.actions)
    else:
        print_json(report if args.actions else {k: v for k, v in report.items() if k != "actions"})
    return 0


def show(report: dict, actions: bool) -> None:
    """The explanation as text: figures, where the limit binds, the modules, the actions."""
    f, b, p = report["figures"], report["binds"], report["plan"]
    rows = [("plan", f"{p['planner']}" + (f" (chose {p['chosen']})" if p.get("chosen") else "")),
            ("trace", report["trace"]),
            ("memory limit", human("bytes", f["memory_limit_bytes"])),
            ("unplanned peak", f"{human('bytes', f['unplanned_peak_bytes'])} at {b['unplanned_peak_op']}"),
            ("planned peak", f"{human('bytes', f['planned_peak_bytes'])} at {b['planned_peak_op']}"
                             f" ({human('bytes', b['headroom_bytes'])} below the limit)"),
            ("minimum any plan needs", human("bytes", f["minimum_memory_bytes"])),
            ("time", f"{human('_s', f['planned_time_s'])} planned, {human('_s', f['compute_time_s'])} unplanned "
                     f"({f['overhead'] * 100:.1f} % slower)"),
            ("swapped to host", f"{f['swapped']} tensors, {human('bytes', f['swapped_bytes'])}"),
            ("dropped, re-created", f"{f['recomputed']} tensors, {human('bytes', f['recomputed_bytes'])}"
                                    f" ({human('_s', f['recompute_time_s'])} of re-runs)")]
    if b["first_overflow_op"]:
        rows.append(("without the plan", f"over the limit first at {b['first_overflow_op']}, by "
                                         f"{human('bytes', b['overflow_bytes_there'])}"))
    else:
        rows.append(("without the plan", "the iteration fits: the limit does not bind"))
    if b["infeasible"]:
        rows.append(("infeasible", b["infeasible"]))
    if report.get("plot"):
        rows.append(("plot", report["plot"]))
    print_table(rows)
    if report["modules"]:
        print()
        width = max(len("module"), *(len(m["module"]) for m in report["modules"]))
        print(f"{'module':<{width}}  {'swapped':>7}  {'bytes':>10}  {'re-created':>10}  {'bytes':>10}")
        for m in report["modules"]:
            print(f"{m['module']:<{width}}  {m['swapped']:>7}  {human('bytes', m['swapped_bytes']):>10}  "
                  f"{m['recomputed']:>10}  {human('bytes', m['recomputed_bytes']):>10}")
    if actions and report["actions"]:
        print()
        for a in report["actions"]:
            if a["kind"] == "swap":
                what = f"to host after {a['leaves_after']}, back from {a['copy_back_from']}"
            else:
                reruns = ", ".join(a["re_run"]) or "nothing"
                what = f"dropped after {a['leaves_after']}, re-created by {reruns} before {a['re_created_before']}"
            print(f"tensor {a['tensor']} ({a['module']}, {a['made_by']}, {human('bytes', a['bytes'])}): {what}; "
                  f"needed by {a['needed_by']}")
