#!/usr/bin/env python
"""The window paper's Table 1 in simulation: ResNet-50 under 16 GiB, images/s against batch size.

The window paper (``../shared/seeds/000``, Table 1, section 5.1) trains ResNet-50
(224 x 224, float32) on a 16 GB V100 linked to its host by two NVLinks and
reports images/s from batch 64 to 1440.  This benchmark records ResNet-50 on
the ``meta`` device at each of those batches (op times from the device
profile's roofline), plans every trace under the same budget with every
planner, and reports the simulator's images/s (``batch / makespan``), for the
``v100-nvlink`` profile (the paper's machine) and for ``v100-pcie3``.

It also reports, per planner and profile:

* the **largest batch** it fits (bisection over the batch size, feasible plan
  at the limit), beside the largest batch whose trace's minimum memory fits
  (no plan can go further) and the largest that fits without a plan;
* its **reach** on the batch-1440 trace: the smallest limit (bisection over
  the limit) at which it finds a feasible plan, as a multiple of the trace's
  minimum memory -- what "plans near the minimum" means;
* for an infeasible cell, why: the limit is under the trace's minimum memory,
  or the simulator's first op that could not run.

The paper's rows are its measured figures on a real V100 (NNabla, cuDNN 8),
printed beside ours for scale; ours are simulated.  ``optimal`` (the exact
planner) runs with ``--optimal-time`` seconds a cell at the paper's batches
only (not in the bisections).

Example (about 15 minutes on one core)::

    python benchmarks/bench_table1.py --json benchmarks/results/table1.json \\
        --md benchmarks/results/table1.md --plot benchmarks/results/table1.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any
from dqn_swap.files import write_text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GiB = 1024**3
MODEL = "resnet50"
BATCHES = (64, 128, 190, 256, 512, 928, 1120, 1248, 1440)
PROFILES = ("v100-nvlink", "v100-pcie3")
PLANNERS = ("none", "window", "greedy", "dynprog", "vdnn", "lru", "tflms", "checkpoint", "layrub", "dqn",
            "dqn-search")
#: Table 1 of the window paper (images/s on a 16 GB V100, NVLink 2 x 50 GB/s; "x": out of memory).
PAPER = {
    "Baseline (V100)": (336, 492, 581, None, None, None, None, None, None),
    "Schedule": (320, 439, 533, 559, 457, 400, None, None, None),
    "Schedule + VA": (304, 389, 415, 424, 446, 409, 398, 347, 321),
    "LMS (Le et al., P100)": (235, 255, 241, 236, 209, 137, None, None, None),
}

_TRACES: dict[tuple[int, str], Any] = {}


def trace_at(batch: int, profile: str):  # noqa: ANN201
    """ResNet-50's meta trace at ``batch`` under ``profile`` (recorded once per run)."""
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    key = (batch, profile)
    if key not in _TRACES:
        w = build_workload(MODEL, batch, device="meta")
        _TRACES[key] = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta",
                                    inputs="released", profile=profile, meta={"model": MODEL, "batch_size": batch})
    return _TRACES[key]


_CELLS: dict[tuple[str, str, int], dict[str, Any]] = {}


def plan_cell(trace: Any, planner: str, limit: int, optimal_time: float = 60.0) -> dict[str, Any]:
    """One planner on one trace at ``limit``: feasibility, makespan, images/s, and why not (planned
    once per run: the bisections and the table ask for the same cells)."""
    # Both profiles are V100s: same op times, same fingerprint; the link differs, so it is in the key.
    key = (trace.fingerprint, str(trace.meta.get("profile")), planner, int(limit))
    if key not in _CELLS:
        _CELLS[key] = _plan_cell(trace, planner, limit, optimal_time)
    return _CELLS[key]


def _plan_cell(trace: Any, planner: str, limit: int, optimal_time: float) -> dict[str, Any]:
    from dqn_swap.agents import get_planner
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import simulate

    batch = int(trace.meta["batch_size"])
    if limit < trace.minimum_memory:
        return {"feasible": False, "why": f"under the trace's minimum memory ({trace.minimum_memory / GiB:.2f} GiB)"}
    profile = get_profile(trace.meta["profile"])
    settings = {"time_limit": optimal_time} if planner == "optimal" else {}
    t0 = time.perf_counter()
    plan = get_planner(planner, **settings).plan(trace, limit, profile)
    seconds = time.perf_counter() - t0
    result = simulate(trace, plan.actions, limit, profile)
    cell: dict[str, Any] = {"feasible": bool(result.feasible), "planning_s": round(seconds, 2)}
    if result.feasible:
        cell.update(makespan=float(result.makespan), images_per_s=batch / float(result.makespan),
                    overhead=float(result.overhead), peak_gib=result.peak_bytes / GiB,
                    n_swap=plan.n_swap, n_recompute=plan.n_recompute)
    else:
        cell["why"] = result.infeasible.message(trace) if result.infeasible is not None else "infeasible"
    if plan.settings.get("certified_bound"):  # the exact planner: no plan can be faster than this
        cell.update(certified_gap=float(plan.settings["certified_gap"]),
                    images_per_s_ceiling=batch / float(plan.settings["certified_bound"]))
    return cell


def _bisect(feasible, low: int, high: int) -> int:  # noqa: ANN001
    """The largest batch in [low, high] that is feasible, given ``feasible(low)`` and monotony."""
    while low < high:
        mid = (low + high + 1) // 2
        if feasible(mid):
            low = mid
        else:
            high = mid - 1
    return low


def largest_batch(feasible, low: int = 1, high: int = 4096) -> int:  # noqa: ANN001
    """The largest batch in [low, high] for which ``feasible(batch)`` holds (0: none).

    Bisection, then a scan down from ``high`` in steps of 1 % (a learned planner's
    feasibility need not be monotone in the batch: one that fails at some batch may fit a
    larger one); a feasible step is refined by bisection up to the next step.
    """
    if not feasible(low):
        return 0
    found = _bisect(feasible, low, high)
    step = max(1, high // 100)
    for top in range(high, found, -step):
        if feasible(top):
            return _bisect(feasible, top, min(high, top + step - 1))
    return found


def reach(trace: Any, planner: str, tolerance: float = 0.002) -> float | None:
    """The smallest limit (a multiple of the trace's minimum memory) at which ``planner`` finds a
    feasible plan, by bisection between the minimum and the unplanned peak; None: not even at the peak."""
    low, high = 1.0, trace.peak_bytes / trace.minimum_memory
    if not plan_cell(trace, planner, int(high * trace.minimum_memory))["feasible"]:
        return None
    if plan_cell(trace, planner, trace.minimum_memory)["feasible"]:
        return 1.0
    while high / low - 1 > tolerance:
        mid = (low * high) ** 0.5
        if plan_cell(trace, planner, int(mid * trace.minimum_memory))["feasible"]:
            high = mid
        else:
            low = mid
    return high


def run(args: argparse.Namespace) -> dict[str, Any]:
    limit = int(args.limit_gib * GiB)
    planners = [p for p in args.planners.split(",") if p]
    out: dict[str, Any] = {"model": MODEL, "limit_bytes": limit, "batches": list(BATCHES), "paper": PAPER,
                           "profiles": {}}
    for profile in args.profiles.split(","):
        t0 = time.perf_counter()
        table: dict[str, list[dict[str, Any]]] = {}
        for name in [*planners, *(["optimal"] if args.optimal_time > 0 else [])]:
            table[name] = [plan_cell(trace_at(b, profile), name, limit, args.optimal_time) for b in BATCHES]
            print(f"{profile} {name}: " + " ".join(
                f"{c['images_per_s']:.0f}" if c["feasible"] else "x" for c in table[name]), flush=True)
        minimum = {b: trace_at(b, profile).minimum_memory for b in BATCHES}
        bound = largest_batch(lambda b: trace_at(b, profile).minimum_memory <= limit)
        largest = {name: largest_batch(lambda b, n=name: plan_cell(trace_at(b, profile), n, limit)["feasible"],
                                       high=bound)
                   for name in planners}
        in_memory = largest["none"]
        in_memory_ips = plan_cell(trace_at(in_memory, profile), "none", limit)["images_per_s"] if in_memory else None
        big = trace_at(BATCHES[-1], profile)
        reaches = {name: reach(big, name) for name in planners if name != "none"}
        at_largest = {name: plan_cell(trace_at(b, profile), name, limit).get("images_per_s") if b else None
                      for name, b in largest.items()}
        out["profiles"][profile] = {
            "table": table, "minimum_memory_gib": {b: m / GiB for b, m in minimum.items()},
            "largest_batch": largest, "images_per_s_at_largest": at_largest, "largest_batch_of_minimum": bound,
            "in_memory_batch": in_memory, "in_memory_images_per_s": in_memory_ips,
            "reach_at_1440": reaches, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{profile}: largest batches {largest}, minimum memory allows {bound}; reach {reaches}", flush=True)
    return out


def markdown(result: dict[str, Any]) -> str:
    batches = result["batches"]
    lines = [f"ResNet-50 (224 x 224, float32) under {result['limit_bytes'] / GiB:g} GiB: images/s, simulated "
             "(`x`: no feasible plan). Paper rows: the window paper's Table 1, measured on a V100 with NVLink.", ""]
    for profile, res in result["profiles"].items():
        lines += [f"### {profile}", "", "| planner | " + " | ".join(str(b) for b in batches)
                  + " | largest batch | images/s there | of in-memory |", "|---|" + "---:|" * (len(batches) + 3)]
        if profile == "v100-nvlink":
            for name, row in result["paper"].items():
                lines.append(f"| *paper: {name}* | " + " | ".join("x" if v is None else str(v) for v in row) + " | | | |")
        base = res["in_memory_images_per_s"]
        for name, cells in res["table"].items():
            largest = res["largest_batch"].get(name, "")
            there = res.get("images_per_s_at_largest", {}).get(name)
            tail = (f" | {largest} | {there:.0f} | {100 * there / base:.1f} % |" if there and base
                    else f" | {largest} | | |")
            lines.append(f"| {name} | " + " | ".join(f"{c['images_per_s']:.0f}" if c["feasible"] else "x"
                                                    for c in cells) + tail)
            if any("images_per_s_ceiling" in c for c in cells):
                lines.append(f"| {name}: certified ceiling | " + " | ".join(
                    f"{c['images_per_s_ceiling']:.0f}" if "images_per_s_ceiling" in c else "x" for c in cells)
                    + " | | | |")
        top_min = res["minimum_memory_gib"][batches[-1]]
        under = top_min * GiB > result["limit_bytes"]
        lines += ["", f"Trace's minimum memory: " + ", ".join(
            f"b{b} {m:.2f} GiB" for b, m in res["minimum_memory_gib"].items()) + ".",
            f"Largest batch any plan could fit (minimum memory under the limit): {res['largest_batch_of_minimum']}; "
            f"without a plan: {res['in_memory_batch']} ({res['in_memory_images_per_s']:.0f} images/s).", "",
            "Reach at batch 1440 (smallest feasible limit / the trace's minimum memory): " + ", ".join(
                f"{n} {'-' if r is None else f'{r:.3f}'}" for n, r in res["reach_at_1440"].items()) + ".", "",
            "Why the infeasible cells are infeasible (each planner's smallest infeasible batch"
            + (f"; every cell at b{batches[-1]} is under the trace's minimum memory, {top_min:.2f} GiB):" if under
               else "):"),
            ""]
        for name, cells in res["table"].items():
            bad = [(b, c) for b, c in zip(batches, cells) if not c["feasible"] and not (under and b == batches[-1])]
            if bad:
                b, c = bad[0]
                lines.append(f"- {name} at b{b}: {c['why']}")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    from dqn_swap.plots import _pyplot, save

    plt = _pyplot()
    profiles = list(result["profiles"])
    fig, axes = plt.subplots(1, len(profiles), figsize=(7 * len(profiles), 4.5), squeeze=False)
    batches = result["batches"]
    colours = plt.cm.tab20.colors
    for ax, profile in zip(axes[0], profiles):
        for k, (name, cells) in enumerate(result["profiles"][profile]["table"].items()):
            xs = [b for b, c in zip(batches, cells) if c["feasible"]]
            ys = [c["images_per_s"] for c in cells if c["feasible"]]
            ax.plot(xs, ys, marker=".", label=name, color=colours[(2 * k) % 20 + (2 * k) // 20],
                    linewidth=2.4 if name.startswith("dqn") else 1.0)
        if profile == "v100-nvlink":
            for marker, (name, row) in zip("osD^", result["paper"].items()):
                xs = [b for b, v in zip(batches, row) if v is not None]
                ax.scatter(xs, [v for v in row if v is not None], marker=marker, facecolors="none",
                           edgecolors="black", label=f"paper: {name}", zorder=3)
        ax.set_title(f"ResNet-50, {result['limit_bytes'] / GiB:g} GiB, {profile} (simulated)")
        ax.set_xlabel("batch size")
        ax.set_ylabel("images / s")
        ax.grid(alpha=0.3)
    for ax in axes[0]:
        ax.legend(fontsize=7, ncol=2)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit-gib", type=float, default=16.0, help="device memory budget in GiB (default 16)")
    p.add_argument("--profiles", default=",".join(PROFILES))
    p.add_argument("--planners", default=",".join(PLANNERS))
    p.add_argument("--optimal-time", type=float, default=60.0,
                   help="seconds the exact planner gets per cell of the table (0: leave it out)")
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--plot")
    p.add_argument("--from-json", help="write --md and --plot from this earlier result instead of running")
    args = p.parse_args(argv)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        for res in result["profiles"].values():  # JSON keys are strings
            res["minimum_memory_gib"] = {int(b): m for b, m in res["minimum_memory_gib"].items()}
    else:
        result = run(args)
        from common import write_json

        write_json(result, args.json)
    text = markdown(result)
    print(text)
    if args.md:
        write_text(Path(args.md), text + "\n", overwrite=True)
    if args.plot:
        plot(result, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
