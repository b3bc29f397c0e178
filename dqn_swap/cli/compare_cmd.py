"""``dqn-swap compare``: every planner on every trace at every limit, side by side."""

from __future__ import annotations

import argparse
import csv
import io
import os
import time
from pathlib import Path
from typing import Any

from ..files import folder_problem, link_new, write_text
from .common import AGENT_HELP, add_planner_options, given_flags, load_trace, planner_values, print_json
from .simulate_cmd import LIMIT_HELP

COLUMNS = ["trace", "model", "limit", "limit_bytes", "planner", "feasible", "overhead", "makespan_s",
           "makespan_over_lower_bound", "ceiling_s", "ceiling", "distance_to_ceiling", "peak_bytes", "fails_at_op",
           "fails_short_bytes", "n_swap", "n_recompute", "planning_s"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    from dqn_swap.agents import planner_names as registered

    p = sub.add_parser(
        "compare", help="compare planners on traces at several memory limits (table and plots)",
        description="Plan every trace at every memory limit with every planner, simulate each plan, "
                    "and write a table (markdown and CSV: overhead, distance to the ceiling, peak, "
                    "feasible, planning time) and two plots: overhead against memory reduction "
                    "(the DQN paper's Figure 5) and makespan / ceiling against the limit "
                    "(the offloading paper's Figure 5). The ceiling of a cell is the least makespan any "
                    "plan could have as far as is proved: the exact planner's certified bound where "
                    "'optimal' is among the planners (the optimum where a plan reaches it), else the "
                    "lower bound; every plan's distance to it is makespan / ceiling - 1.",
        epilog="Example: dqn-swap compare r50.trace vgg16.trace --memory-limits 90%,70%,50%,30% "
               "--planners all -o comparison/")
    p.add_argument("traces", nargs="+", help="trace files")
    p.add_argument("--memory-limits", default="90%,70%,50%,30%",
                   help="comma-separated limits (default 90%%,70%%,50%%,30%%). " + LIMIT_HELP)
    p.add_argument("--planners", default="all",
                   help=f"comma-separated planners ({', '.join(registered())}) or 'all' (every one but the "
                        "simple rules)")
    p.add_argument("--agent", nargs="+", metavar="AGENT",
                   help=f"for auto and the dqn planners: {AGENT_HELP}. Several compare those planners once per "
                        "agent, as PLANNER@AGENT_NAME columns")
    add_planner_options(p)
    p.add_argument("-o", "--output", default="comparison",
                   help="folder for compare.md, compare.csv and the PNG plots (default ./comparison)")
    p.add_argument("--force", action="store_true", help="replace existing result files")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    p.set_defaults(func=run)


def planner_names(spec: str) -> list[str]:
    from dqn_swap.agents import check_planner_name, planner_names as registered

    if spec.strip() == "all":
        return [n for n in registered() if n not in registered("simple")]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        check_planner_name(n)  # unknown or renamed: one line naming the planners
    return names


def compare_grid(traces: dict[str, Any], limits: list[str], planners: list[str],
                 agent: str | list[str] | None = None, progress: bool = False,
                 options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Plan and simulate every (trace, limit, planner) cell; one row per cell, with the cell's ceiling.

    ``options``: the planner options given (flag's ``dest`` -> value, :func:`.common.planner_values`);
    each planner takes those it reads.
    ``agent``: one agent file for the planners that read one, or several: each such planner is
    then compared once per agent, as ``PLANNER@NAME`` (the file's name without its suffix).
    ``progress``: report on standard error (:mod:`dqn_swap.progress`): the cell being planned, and
    what a planner that takes more than a few seconds is doing, after the cell's name."""
    from contextlib import nullcontext

    from dqn_swap.agents import get_planner

    from ..cost import profile_of
    from ..progress import progress as progress_line
    from ..progress import showing
    from ..trace import resolve_memory_limit

    from ..planners import planner_entry, settings_from

    agents = [agent] if isinstance(agent, str) or agent is None else list(agent)
    labels: dict[str, tuple[str, str | None]] = {}  # column -> (planner, agent)
    for pl in planners:
        if len(agents) > 1 and planner_entry(pl).takes_agent:
            for a in agents:
                labels[f"{pl}@{Path(a).stem if a not in ('shipped', 'ensemble') else a}"] = (pl, a)
        else:
            labels[pl] = (pl, agents[0] if agents else None)
    cells = [(name, lim, label) for name in traces for lim in limits for label in labels]
    planner_objs = {label: get_planner(pl, agent=a, **settings_from(pl, options or {}))
                    for label, (pl, a) in labels.items()}
    rows = []
    with (showing() if progress else nullcontext()), progress_line("compare") as line:
        for i, (name, lim, pl) in enumerate(cells):
            line(f"{i} of {len(cells)} plans, next {name} at {lim} by {pl}")
            trace = traces[name]
            limit = resolve_memory_limit(trace, lim)
            profile = profile_of(trace)
            t0 = time.perf_counter()
            with (showing(prefix=f"compare {i + 1}/{len(cells)} {name} {lim}: ") if progress else nullcontext()):
                plan = planner_objs[pl].plan(trace, limit, profile)
            elapsed = time.perf_counter() - t0
            rows.append({"trace": name, "model": trace.meta.get("model"), "limit": lim, "limit_bytes": limit,
                         "planner": pl, **cell_figures(trace, plan.figures), "n_swap": plan.n_swap,
                         "n_recompute": plan.n_recompute, "planning_s": elapsed,
                         "unplanned_peak_bytes": trace.peak_bytes,
                         "compute_time_s": trace.compute_time, "lower_bound_s": plan.figures.get("lower_bound"),
                         "certified_bound_s": plan.settings.get("certified_bound"),
                         **({"not_applicable": plan.settings["not_applicable"]}
                            if plan.settings.get("not_applicable") else {})})
        line.close(f"{len(cells)} plans")
    add_ceilings(rows)
    return rows


def cell_figures(trace: Any, figures: dict[str, Any]) -> dict[str, Any]:
    """A cell's figures from a plan's simulated ``figures``.

    A feasible plan gives its overhead, makespan and peak.  An infeasible one gives none of them (the
    simulator stopped at the op that could not run, so its makespan and peak are those of a partial
    iteration, its peak below the limit): only that op (``fails_at_op``, ``fails_at`` its label) and
    how many bytes it lacked after every pending swap-out (``fails_short_bytes``).
    """
    if figures.get("feasible"):
        return {"feasible": True, "overhead": figures.get("overhead"), "makespan_s": figures.get("makespan"),
                "makespan_over_lower_bound": figures.get("makespan_over_lower_bound"),
                "peak_bytes": figures.get("peak_bytes"), "fails_at_op": None, "fails_at": None,
                "fails_short_bytes": None}
    where = figures.get("infeasible") or {}
    op = where.get("op")
    short = (int(where["needed"]) - int(where["available"])
             if where.get("needed") is not None and where.get("available") is not None else None)
    return {"feasible": False, "overhead": None, "makespan_s": None, "makespan_over_lower_bound": None,
            "peak_bytes": None, "fails_at_op": None if op is None else int(op),
            "fails_at": None if op is None else trace.op_label(int(op)), "fails_short_bytes": short}


def percent(fraction: float) -> str:
    """``fraction`` as a percentage with one decimal, never ``-0.0%`` (a round-off below zero reads as 0)."""
    text = f"{100 * fraction:.1f}"
    return ("0.0" if text == "-0.0" else text) + "%"


def add_ceilings(rows: list[dict[str, Any]]) -> None:
    """Give each row its cell's ceiling and the row's distance to it (``makespan / ceiling - 1``).

    The ceiling is the tighter of the lower bound and, where ``optimal`` ran, its certified bound;
    ``ceiling`` says which, and ``optimum`` where a plan of the cell reaches the bound.
    """
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["trace"], r["limit"]), []).append(r)
    for cell in cells.values():
        # the certified bound first: on a tie it names the ceiling (it is at least the lower bound)
        bounds = [(r["certified_bound_s"], "certified bound") for r in cell if r.get("certified_bound_s")]
        bounds += [(r["lower_bound_s"] or 0.0, "lower bound") for r in cell]
        value, kind = max(bounds, key=lambda b: b[0])
        made = [r["makespan_s"] for r in cell if r["feasible"] and r["makespan_s"] is not None]
        if made and value > 0 and min(made) <= value * (1 + 1e-6):
            kind = "optimum"
        for r in cell:
            r["ceiling_s"], r["ceiling"] = value, kind
            r["distance_to_ceiling"] = (r["makespan_s"] / value - 1 if r["feasible"] and value > 0
                                        and r["makespan_s"] is not None else None)


#: Within this share of the fastest plan of a cell, the default planner is the one recommended:
#: it needs no choice, and a difference this small is below what the simulator can promise.
RECOMMEND_DEFAULT_WITHIN = 0.01


def _kind(label: str) -> str:
    from ..planners import planner_entry

    try:
        return planner_entry(label.split("@")[0]).kind
    except (KeyError, ValueError):
        return "other"


def recommend(cell: list[dict[str, Any]]) -> tuple[str | None, str]:
    """The planner to use for one (trace, limit) cell, and why, in one line: the fastest feasible
    plan, or the default where it is within :data:`RECOMMEND_DEFAULT_WITHIN` of it."""
    from ..planners import DEFAULT_PLANNER

    feasible = [r for r in cell if r["feasible"] and r["makespan_s"] is not None]
    if not feasible:
        return None, "no planner fits this limit (it is below what they reach; try a larger limit)"
    best = min(feasible, key=lambda r: (r["makespan_s"], r["planning_s"]))
    lb = best.get("lower_bound_s") or 0.0
    above = f", {percent(best['makespan_s'] / lb - 1)} above the lower bound" if lb > 0 else ""
    default = next((r for r in feasible if r["planner"] == DEFAULT_PLANNER), None)
    if default is not None and default["makespan_s"] <= best["makespan_s"] * (1 + RECOMMEND_DEFAULT_WITHIN):
        if default["makespan_s"] <= best["makespan_s"] * (1 + 1e-9):  # a tie counts for the default
            return DEFAULT_PLANNER, (f"the default, and the fastest plan here ({percent(default['overhead'])} slower "
                                     f"than unplanned{above})")
        return DEFAULT_PLANNER, (f"the default, within {percent(default['makespan_s'] / best['makespan_s'] - 1)} of the "
                                 f"fastest here ({best['planner']}, {percent(best['overhead'])} slower than unplanned)")
    return best["planner"], f"the fastest plan here ({percent(best['overhead'])} slower than unplanned{above})"


def summary_table(rows: list[dict[str, Any]]) -> str:
    """The short table: per trace and limit, the ceiling (the lower bound; the certified bound or the
    optimum, said so, where ``optimal`` ran), the default planner, the best baseline of the papers, the
    best of the switches users have (per-block checkpointing, offloading to the host), each as time
    over unplanned compute (the same reference in every run), and the planner to use
    (:func:`recommend`).  Every planner is in the full table, the CSV and the JSON."""
    from ..planners import DEFAULT_PLANNER

    out = io.StringIO()
    for trace in dict.fromkeys(r["trace"] for r in rows):
        sub = [r for r in rows if r["trace"] == trace]
        out.write(f"\n**{sub[0]['model'] or trace}**: time over unplanned compute (lower is better)\n\n")
        out.write(f"| limit | ceiling | {DEFAULT_PLANNER} (default) | best baseline | best switch | use |\n"
                  "|---|---|---|---|---|---|\n")
        lines = []
        for lim in dict.fromkeys(r["limit"] for r in sub):
            cell = [r for r in sub if r["limit"] == lim]
            T = cell[0].get("compute_time_s") or 0.0
            ceiling, kind = cell[0].get("ceiling_s"), cell[0].get("ceiling")
            bound = (percent(ceiling / T - 1) + ("" if kind == "lower bound" else f" ({kind})")) if ceiling and T else "-"

            def best_of(kind: str) -> str:
                mine = [r for r in cell if _kind(r["planner"]) == kind and r["feasible"] and r["overhead"] is not None]
                if not mine:
                    return "none fits" if any(_kind(r["planner"]) == kind for r in cell) else "-"
                r = min(mine, key=lambda r: r["overhead"])
                return f"{percent(r['overhead'])} ({r['planner']})"

            default = next((r for r in cell if r["planner"] == DEFAULT_PLANNER), None)
            dtext = "-" if default is None else percent(default["overhead"]) if default["feasible"] else "does not fit"
            use, why = recommend(cell)
            out.write(f"| {lim} | {bound} | {dtext} | {best_of('baseline')} | {best_of('switch')} | {use or '-'} |\n")
            lines.append(f"{sub[0]['model'] or trace} at {lim}: use {use}: {why}." if use else
                         f"{sub[0]['model'] or trace} at {lim}: {why}.")
        out.write("\n" + "\n".join(lines) + "\n")
    return out.getvalue()


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One table per trace: a row per limit, a column per planner, cells 'overhead (distance to the ceiling)',
    or for an infeasible plan where it fails ('fails at #op, N short')."""
    from ..units import format_bytes

    out = io.StringIO()
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    for trace in dict.fromkeys(r["trace"] for r in rows):
        sub = [r for r in rows if r["trace"] == trace]
        out.write(f"\n**{sub[0]['model'] or trace}** — overhead (distance to the ceiling: makespan / ceiling - 1); "
                  "an infeasible plan: the op where it fails and the bytes it lacks there; best feasible in bold; "
                  "ceiling: the optimum, else the certified bound of `optimal`, else the lower bound\n\n")
        out.write("| limit | ceiling | " + " | ".join(planners) + " |\n|---|---|" + "---|" * len(planners) + "\n")
        for lim in dict.fromkeys(r["limit"] for r in sub):
            cells = {r["planner"]: r for r in sub if r["limit"] == lim}
            feasible = [r["overhead"] for r in cells.values() if r["feasible"]]
            best = min(feasible) if feasible else None
            text = []
            for pl in planners:
                r = cells.get(pl)
                if r is None:
                    text.append("")
                    continue
                if not r["feasible"]:
                    where = f"#{r['fails_at_op']}" if r.get("fails_at_op") is not None else "an unknown op"
                    short = (f", {format_bytes(r['fails_short_bytes'])} short"
                             if r.get("fails_short_bytes") is not None else "")
                    text.append(("not applicable: " if r.get("not_applicable") else "") + f"fails at {where}{short}")
                    continue
                distance = r["distance_to_ceiling"]
                s = percent(r["overhead"]) + (f" ({percent(distance)})" if distance is not None else "")
                text.append(f"**{s}**" if best is not None and r["overhead"] <= best + 1e-12 else s)
            first = next(iter(cells.values()))
            gib = first["limit_bytes"] / 2**30
            T = first.get("compute_time_s")
            ceiling = f"{percent(first['ceiling_s'] / T - 1)} ({first['ceiling']})" if T else first["ceiling"]
            out.write(f"| {lim} ({gib:.2f} GiB) | {ceiling} | " + " | ".join(text) + " |\n")
        why = {r["planner"]: r["not_applicable"] for r in sub if r.get("not_applicable")}
        for pl, message in why.items():  # a method that does not apply to this network says why, once
            out.write(f"\n`{pl}` is {message}.\n")
    return out.getvalue()


#: Plot styles: ten colours, nine markers (coprime counts, so colour and marker together differ for the
#: first 90 planners) and, beyond ten, another line style.
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
           "tab:olive", "tab:cyan")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")
LINESTYLES = ("-", "--", ":", "-.")


def planner_styles(planners: list[str]) -> dict[str, dict[str, Any]]:
    """One distinct line style per planner (colour, marker, line style), the same in every comparison:
    a planner of the registry keeps the style of its place there, any other comes after them."""
    from dqn_swap.agents import planner_names as registered

    order = list(registered()) + [p for p in planners if p not in registered()]
    learned_kind = set(registered("dqn"))
    styles = {}
    for pl in planners:
        i = order.index(pl)
        learned = pl in learned_kind or pl.startswith("dqn")  # the learned planners (the default among them) stand out
        # Each marker smaller than the one before it in the registry and drawn on top of it: planners
        # that share a point show as rings round one another instead of hiding each other.
        share = min(i / max(len(registered()) - 1, 1), 1.0)
        styles[pl] = {"color": COLOURS[i % len(COLOURS)], "marker": MARKERS[i % len(MARKERS)],
                      "linestyle": LINESTYLES[(i // len(COLOURS)) % len(LINESTYLES)],
                      "linewidth": 2.6 if learned else 1.2, "zorder": 2 + share,
                      "markersize": 12 - 8 * share, "markerfacecolor": "none" if i % 2 else None,
                      "markeredgewidth": 1.4}
    return styles


def plot_comparison(rows: list[dict[str, Any]], folder: Path, force: bool) -> list[Path]:
    from ..plots import _pyplot, check_output, save

    plt = _pyplot()
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    styles = planner_styles(planners)
    paths = []
    for kind in ("overhead", "makespan_lb"):
        fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 3.6), squeeze=False)
        for ax, trace in zip(axes[0], traces):
            for pl in planners:
                pts = [r for r in rows if r["trace"] == trace and r["planner"] == pl and r["feasible"]]
                if not pts:
                    continue
                if kind == "overhead":  # DQN paper, Figure 5
                    xs = [1 - r["peak_bytes"] / r["unplanned_peak_bytes"] for r in pts]
                    ys = [100 * r["overhead"] for r in pts]
                else:  # offloading paper, Figure 5
                    xs = [r["limit_bytes"] / 2**30 for r in pts]
                    ys = [1 + r["distance_to_ceiling"] for r in pts]
                order = sorted(range(len(xs)), key=xs.__getitem__)
                ax.plot([xs[i] for i in order], [ys[i] for i in order], label=pl, **styles[pl])
            ys_all = [(100 * r["overhead"] if kind == "overhead" else 1 + r["distance_to_ceiling"])
                      for r in rows if r["trace"] == trace and r["feasible"]]
            if ys_all and max(ys_all) > 20 * max(min(ys_all), 1.0):  # one outlier would flatten the rest
                ax.set_yscale("symlog", linthresh=1.0 if kind == "overhead" else 2.0)
            ax.set_title(str(next(r["model"] for r in rows if r["trace"] == trace) or trace))
            if kind == "overhead":
                ax.set_xlabel("memory reduction (1 - peak / unplanned peak)")
                ax.set_ylabel("overhead (% of compute time)")
            else:
                ax.set_xlabel("memory limit (GiB)")
                ax.set_ylabel("makespan / ceiling (certified bound or lower bound)")
        # one legend for every panel, outside the axes (right of the last one), so it hides no curve
        handles: dict[str, Any] = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        if handles:
            ordered = [pl for pl in planners if pl in handles]
            fig.legend([handles[pl] for pl in ordered], ordered, loc="center left", bbox_to_anchor=(1.0, 0.5),
                       fontsize=7, title="planner")
            fig.tight_layout()
        path = check_output(folder / f"{kind}.png", force)
        paths.append(save(fig, path))
    return paths


def _clean_stale_stages(folder: Path) -> None:
    """Remove the staging folders (``.compare.PID.XXXXXXXX``) of earlier runs killed before they
    finished; a running one's are kept, and nothing is followed."""
    import shutil

    from ..files import stale_entries

    for path in stale_entries(folder, ".compare."):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _write_outputs(folder: Path, made_folder: bool, md_path: Path, csv_path: Path, table: str, csv_text: str,
                   rows: list[dict[str, Any]], force: bool = False) -> list[Path]:
    """Write the table, the CSV and the plots as one: all into a staging folder beside them, then
    each renamed into place (a rename needs no room on the disk), so that a full disk or a signal
    leaves the folder as it was, and a folder this run made is removed again.  Without ``force`` each
    name is taken only if no file has it (a hard link, exclusive): of two runs into one folder, the
    first to finish writes its comparison and the other is refused, its table first, before anything
    of it is put in place."""
    import shutil
    import tempfile

    from ..stop import outputs_together

    _clean_stale_stages(folder)
    stage = Path(tempfile.mkdtemp(prefix=f".compare.{os.getpid()}.", dir=folder))
    done = False
    try:
        with outputs_together(f"{md_path}, {csv_path} and the plots"):
            write_text(stage / md_path.name, table)
            write_text(stage / csv_path.name, csv_text)
            staged = plot_comparison(rows, stage, True)
            plots = [folder / p.name for p in staged]
            for name in (md_path.name, csv_path.name, *(p.name for p in staged)):
                if force:
                    os.replace(stage / name, folder / name)
                else:
                    try:
                        link_new(stage / name, folder / name)
                    except FileExistsError:
                        raise FileExistsError(f"{folder / name}: already exists (another run wrote it meanwhile; "
                                              "pass --force to replace it)") from None
            done = True
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if not done and made_folder and not any(folder.iterdir()):
            folder.rmdir()
    return plots


def run(args: argparse.Namespace) -> int:
    from ..plots import check_output

    from ..limits import MemoryLimit

    planners = planner_names(args.planners)
    if not planners:
        raise ValueError("--planners is empty; name some (for example greedy,lru,dqn) or all")
    from ..planners import check_options_apply

    if args.agent is not None and len(set(args.agent)) != len(args.agent):
        raise ValueError("--agent names the same agent twice")
    check_options_apply(planners, given_flags(args) + (["--agent"] if args.agent is not None else []))
    limits = [s.strip() for s in args.memory_limits.split(",") if s.strip()]
    if not limits:
        raise ValueError("--memory-limits is empty (for example 90%,70%,50%,30%)")
    for lim in limits:
        MemoryLimit.parse(lim)
    if not args.traces:
        raise ValueError("no trace to compare")
    traces = {}
    for path in args.traces:
        traces[Path(path).stem if Path(path).stem not in traces else path] = load_trace(path)
    if not args.output.strip():
        raise ValueError("-o: the folder's name is empty; give the folder the comparison is written to")
    folder = Path(args.output)
    if folder.is_symlink() and not folder.is_dir():
        raise FileExistsError(f"{folder}: is a link to {'a file' if folder.exists() else 'nothing'}; -o names the "
                              "folder the comparison is written to")
    if folder.exists() and not folder.is_dir():
        kind = "a file" if folder.is_file() else "not a regular file (a device, a FIFO or a socket)"
        raise NotADirectoryError(f"{folder}: is {kind}; -o names the folder the comparison is written to")
    if folder.exists():
        md_path = check_output(folder / "compare.md", args.force)
        csv_path = check_output(folder / "compare.csv", args.force)
    elif (problem := folder_problem(folder)) is not None:  # its folder is missing, or a file (-o p.json/sub)
        raise problem
    if not os.access(folder.parent if not folder.exists() else folder, os.W_OK):  # (a missing one: just above)
        raise PermissionError(f"{folder}: cannot be written (its directory is read-only)")
    rows = compare_grid(traces, limits, planners, args.agent, progress=True, options=planner_values(args))
    made_folder = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)  # only now: nothing is written for a run that fails first
    md_path = check_output(folder / "compare.md", args.force)
    csv_path = check_output(folder / "compare.csv", args.force)
    for kind in ("overhead", "makespan_lb"):
        check_output(folder / f"{kind}.png", args.force)
    table = summary_table(rows) + "\n**Every planner**\n" + markdown_table(rows)
    csv_text = io.StringIO(newline="")
    w = csv.DictWriter(csv_text, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    plots = _write_outputs(folder, made_folder, md_path, csv_path, table.lstrip() + "\n", csv_text.getvalue(), rows,
                           force=args.force)
    if args.json:
        print_json(rows)
    else:
        print(summary_table(rows).lstrip())
        print(f"every planner: {md_path}, {csv_path}; plots: " + ", ".join(map(str, plots)))
    return 0
