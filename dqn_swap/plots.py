"""PNG plots: memory over time, comparisons.  matplotlib with the Agg backend (no screen)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .files import folder_problem, refuse_to_replace_special
from .trace import Phase, Trace

# Written into every PNG we make, so that a later run may replace our own plot
# but never a user's file of the same name.
MARKER = {"Software": "dqn-swap"}
PHASE_COLOURS = {Phase.FORWARD: "tab:blue", Phase.BACKWARD: "tab:orange", Phase.OPTIMIZER: "tab:green"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def is_our_png(path: Path) -> bool:
    """True when ``path`` is a PNG this tool wrote (its tEXt chunk says so)."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            return im.format == "PNG" and im.info.get("Software") == MARKER["Software"]
    except Exception:  # unreadable or not an image: not ours
        return False


def check_output(path: str | os.PathLike[str], force: bool = False, png: bool = False) -> Path:
    """Check an output before any work is done: refuse to replace a file the user owns (our own
    earlier plots may be replaced) or a link (even one pointing nowhere), a directory, or a place
    that cannot be written; with ``png``, a name that does not end in ``.png`` (plots are PNG).  A name
    ending in a path separator names a folder and is refused; what is not a regular file or a link (a
    device, a FIFO, a socket) is never replaced, ``force`` or not."""
    text = os.fspath(path)
    if not text.strip():
        raise ValueError("the output's name is empty; give the file to write")
    if text.endswith(("/", os.sep)) or (os.altsep and text.endswith(os.altsep)):
        raise IsADirectoryError(f"{text}: ends with a separator, so it names a folder; give the file's name")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory, not a file to write")
    refuse_to_replace_special(path)
    if png and path.suffix.lower() != ".png":
        raise ValueError(f"{path}: plots are written as PNG; name the file .png")
    if path.exists() and not force and not (path.suffix.lower() == ".png" and is_our_png(path)):
        raise FileExistsError(f"{path}: already exists (pass --force to replace it)")
    if path.is_symlink() and not force:
        raise FileExistsError(f"{path}: is a link (pass --force to replace the link itself; it is not followed)")
    problem = folder_problem(path)
    if problem is not None:
        raise problem
    if not os.access(path.parent, os.W_OK):
        raise PermissionError(f"{path}: directory {path.parent} is not writable")
    return path


def save(fig, path: Path) -> Path:
    """Write the figure (``check_output`` has decided it may replace what is there), then close it."""
    from .files import save_figure

    try:
        save_figure(fig, path, overwrite=True, dpi=120, bbox_inches="tight", metadata=MARKER)
    finally:
        _pyplot().close(fig)
    return path


def memory_plot(trace: Trace, path: Path, title: str | None = None,
                limit: int | None = None) -> Path:
    """Allocated memory over the unplanned iteration, coloured by phase."""
    plt = _pyplot()
    t = trace.event_time
    mem = trace.memory_after_event / 2**30
    phase = trace.op_phase[trace.event_op]
    fig, ax = plt.subplots(figsize=(9, 4))
    for p, colour in PHASE_COLOURS.items():
        sel = phase == p
        if sel.any():
            # Draw each phase as its own step curve over its time range.
            ax.fill_between(t, 0, mem, where=sel, step="post", color=colour, alpha=0.35,
                            label=p.name.lower())
    ax.step(t, mem, where="post", color="black", linewidth=0.8)
    if limit is not None:
        ax.axhline(limit / 2**30, color="red", linestyle="--", label="memory limit")
    ax.axhline(trace.minimum_memory / 2**30, color="grey", linestyle=":", label="minimum any plan needs")
    ax.set_xlabel("time (s, unplanned)")
    ax.set_ylabel("allocated (GiB)")
    ax.set_title(title or f"{trace.meta.get('model', 'trace')}: memory over one iteration")
    ax.legend(loc="upper left")
    ax.set_xlim(0, max(float(t[-1]) if len(t) else 1.0, 1e-9))
    ax.set_ylim(0, float(np.max(mem, initial=0)) * 1.08 or 1)
    return save(fig, path)


def plan_memory_plot(trace: Trace, report: dict, path: Path, title: str | None = None) -> Path:
    """Memory over the iteration without the plan and under it (:func:`dqn_swap.explain.explain_plan`
    with ``timeline=True``), the limit and the minimum any plan needs, forward and backward shaded;
    below, the copies to the host, the copies back and the re-runs, when the simulation runs them."""
    from .explain import copy_intervals, phase_spans

    plt = _pyplot()
    result, schedule, profile = report["_result"], report["_schedule"], report["_profile"]
    fig, (ax, lanes) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True,
                                    gridspec_kw={"height_ratios": [4, 1.3]})
    scale, unit = (2**30, "GiB") if trace.peak_bytes >= 2**30 else (2**20, "MiB")
    end = max(float(result.makespan), float(trace.event_time[-1]) if trace.n_events else 0.0)
    tk, tunit = (1.0, "s") if end >= 1 else (1e3, "ms")  # the time axis in seconds, or ms for short iterations
    for phase, start, stop in phase_spans(trace, result):
        colour = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}[phase]
        ax.axvspan(start * tk, stop * tk, color=colour, alpha=0.08, label=f"{phase} (planned)")
    ax.step(trace.event_time * tk, trace.memory_after_event / scale, where="post", color="grey", linewidth=0.9,
            label="unplanned")
    if result.timeline is not None:
        times, values = result.timeline
        ax.step(times * tk, values / scale, where="post", color="black", linewidth=1.1, label="planned")
    limit = report["figures"]["memory_limit_bytes"]
    ax.axhline(limit / scale, color="red", linestyle="--", label="memory limit")
    ax.axhline(trace.minimum_memory / scale, color="tab:purple", linestyle=":", label="minimum any plan needs")
    ax.set_ylabel(f"allocated ({unit})")
    top = max(trace.peak_bytes, limit) / scale
    ax.set_ylim(0, top * 1.12 or 1)
    f = report["figures"]
    ax.set_title(title or f"{trace.meta.get('model', 'trace')}: plan by {report['plan']['planner']} "
                          f"({f['swapped']} swapped, {f['recomputed']} re-created, "
                          f"{f['overhead'] * 100:.1f} % slower than unplanned)")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    lanes_y = {"to host": 2, "back": 1, "re-run": 0}
    colours = {"to host": "tab:red", "back": "tab:green", "re-run": "tab:brown"}
    for name, spans in copy_intervals(trace, result, schedule, profile).items():
        if spans:
            lanes.broken_barh([(s * tk, max(e - s, 0.0) * tk) for s, e in spans], (lanes_y[name] - 0.35, 0.7),
                              color=colours[name], alpha=0.8)
    lanes.set_yticks(list(lanes_y.values()), list(lanes_y))
    lanes.set_ylim(-0.6, 2.6)
    lanes.set_xlabel(f"time ({tunit}, simulated)")
    lanes.set_xlim(0, end * tk or 1.0)
    return save(fig, path)


def capacity_plot(answer: dict, path: Path) -> Path:
    """Speed against size for ``dqn-swap max-batch`` (:mod:`dqn_swap.capacity`): items per second,
    unplanned where it fits and planned beyond, with the largest unplanned size and the bound any
    plan allows marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    rows = [r for r in answer["speeds"] if r["items_per_s"]]
    unit = "tokens/s" if answer["searched"] == "sequence length" else "samples/s"
    for kind, colour, marker in (("unplanned", "tab:blue", "o"), ("planned", "tab:orange", "s")):
        sel = [r for r in rows if r["fits"] == kind]
        if sel:
            ax.plot([r["size"] for r in sel], [r["items_per_s"] for r in sel], marker=marker, color=colour,
                    linestyle="none", markersize=7, label=kind if kind == "unplanned" else f"planned ({answer['planner']})")
    if rows:
        ax.plot([r["size"] for r in rows], [r["items_per_s"] for r in rows], color="grey", linewidth=0.8)
    for key, colour, text in (("largest_unplanned", "tab:blue", "largest unplanned"),
                              ("largest_any_plan", "tab:red", "largest any plan allows")):
        if answer.get(key):
            ax.axvline(answer[key], color=colour, linestyle="--", linewidth=1, label=f"{text}: {answer[key]}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(answer["searched"])
    ax.set_ylabel(f"{unit} (simulated, {answer['profile']})")
    ax.set_ylim(bottom=0)
    from .units import format_bytes

    ax.set_title(f"{answer['model']} in {format_bytes(answer['memory_bytes'])}")
    ax.legend(loc="lower left", fontsize=8)
    return save(fig, path)
