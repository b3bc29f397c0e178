#!/usr/bin/env python
"""The default planner (``auto``) on the comparison grid, and what the agent buys a search per CPU-second.

``grid``: plans the comparison grid (:data:`common.GRID`, limits 90/70/50/30 %) with ``auto`` and
scores it against every baseline and switch of an earlier ``bench_dqn.py grid`` result (``--baselines``,
default ``benchmarks/results/dqn_grid.json``, whose cells are matched by limit in bytes) and the
best plan known (the best of those baselines, of ``dqn-search`` in ``--search``,
``benchmarks/results/search_grid.json``, and of ``auto``)::

    python benchmarks/bench_default.py grid --json benchmarks/results/default_planner_grid.json \\
        --md benchmarks/results/default_planner_grid.md

``train``: ``dqn-swap train`` with its defaults (20,000 steps, the shipped agent as the reference to
beat) on three networks the zoo does not hold, its CPU minutes, the shipped agent's score and the
trained agent's, and which of the two the output file holds::

    python benchmarks/bench_default.py train --json benchmarks/results/default_train.json \
        --md benchmarks/results/default_train.md

``anytime``: the quality a search reaches after 1, 2, 5, 10 and 30 seconds (``--seconds``), by its
seed:

* ``agent``: ``dqn-search`` (the shipped agent's lookahead, then local search on its two plans) with
  that time budget;
* ``best baseline``: the best quick baseline's plan (``auto``'s :func:`~dqn_swap.agents.auto.quick_baselines`)
  polished by the same local search until the time is spent (the baselines' own time counted);
* ``nothing``: the plan of a fixed rule that knows neither the agent nor the papers -- ``greedy-swap``
  (swap the largest activations until the plan fits), or ``recompute-all`` where that does not fit --
  polished the same way.

Quality is the makespan over the best plan known for the cell (``--best-known``, the table of
``bench_generalization.py``, and the best of this run); a run that stops on its own budget of
simulations before the time is spent gives the same plan at every longer time, and is not run
again.  Cells: the grid's and one network of each test family (``--per-family``), at 70/50/30 %
(at 90 % most planners reach the lower bound at once).  Times are wall-clock budgets; the CPU
seconds of one thread (``time.process_time``, run with ``OMP_NUM_THREADS=1``) are recorded beside
them::

    OMP_NUM_THREADS=1 python benchmarks/bench_default.py anytime --json benchmarks/results/default_planner_anytime.json \\
        --md benchmarks/results/default_planner_anytime.md --plot docs/default_planner_anytime.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generalization import geomean  # noqa: E402
from common import GRID, LIMITS, NAMES, get_trace, pct, run_and_publish  # noqa: E402

CORPUS = ROOT / "runs" / "corpus"
SCORED = ("window", "greedy", "dynprog", "vdnn", "lru", "tflms", "sqrt-n", "layrub", "per-block", "offload-all",
          "offload-all+per-block", "knapsack")
SEEDS = ("agent", "best baseline", "nothing")


# --------------------------------------------------------------------------- grid
def bench_grid(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents import get_planner

    base = json.loads(Path(args.baselines).read_text())
    search = json.loads(Path(args.search).read_text()) if args.search else {"cells": []}
    by_bytes = {(c["model"], int(c["limit_bytes"])): c for c in base["cells"]}
    searched = {(c["model"], int(c["limit_bytes"])): c for c in search["cells"]}
    auto = get_planner("auto", threads=1)
    first = get_trace(*next(iter(GRID.items())))
    auto.plan(first, pct(0.5).resolve(first))  # untimed: the compiled kernels load once per process
    cells = []
    for model, batch in GRID.items():
        trace = get_trace(model, batch)
        for frac in LIMITS:
            limit = pct(frac).resolve(trace)
            old = by_bytes.get((model, limit))
            if old is None:
                raise ValueError(f"{args.baselines}: no cell of {model} at {limit} bytes (record the grid again with "
                                 "bench_dqn.py grid)")
            c0 = time.process_time()
            plan = auto.plan(trace, limit)
            cpu = time.process_time() - c0
            baselines = {n: old[n]["overhead"] for n in SCORED if n in old and old[n]["feasible"]}
            best = min(baselines, key=baselines.get) if baselines else None
            others = [*baselines.values()]
            s = searched.get((model, limit), {}).get("dqn-search")
            if s and s.get("feasible"):
                others.append(s["overhead"])
            mine = float(plan.figures["overhead"]) if plan.figures["feasible"] else None
            known = min([o for o in [*others, mine] if o is not None])
            cells.append({"network": NAMES[model], "model": model, "limit": frac, "limit_bytes": limit,
                          "fingerprint": trace.fingerprint, "auto": mine, "chosen": plan.settings["chosen"],
                          "cut_by_time": plan.settings["cut_by_time"], "cpu_seconds": round(cpu, 3),
                          "budget_seconds": plan.settings["time_limit"], "best_baseline": best,
                          "best_baseline_overhead": baselines.get(best), "dqn": old["dqn"]["overhead"]
                          if old.get("dqn", {}).get("feasible") else None,
                          "dqn_search": s["overhead"] if s and s.get("feasible") else None, "best_known": known,
                          "at_or_below": mine is not None and (best is None
                                                               or mine <= baselines[best] + args.tolerance)})
            print(f"{NAMES[model]:14s} {round(frac * 100):3d}%  auto {mine:.4f} ({plan.settings['chosen']})  best "
                  f"baseline {baselines.get(best, float('nan')):.4f} ({best})  {cpu:.1f} CPU s", flush=True)
    return {"baselines_file": args.baselines, "search_file": args.search, "tolerance": args.tolerance,
            "cells": cells, "summary": grid_summary(cells)}


def grid_summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    def ratio(c: dict[str, Any], key: str) -> float | None:
        v = c[key]
        return None if v is None else (1 + v) / (1 + c["best_known"])

    return {"cells": len(cells), "at_or_below_best_baseline": sum(c["at_or_below"] for c in cells),
            **{f"{key}_over_best_known": geomean([r for c in cells if (r := ratio(c, key)) is not None])
               for key in ("auto", "dqn", "dqn_search")},
            "cpu_seconds_median": statistics.median(c["cpu_seconds"] for c in cells),
            "cpu_seconds_max": max(c["cpu_seconds"] for c in cells)}


def grid_markdown(result: dict[str, Any]) -> str:
    lines = ["| network | limit | auto | chosen | best baseline | dqn | dqn-search | best known | CPU s |",
             "|---|---|---|---|---|---|---|---|---|"]
    f = (lambda v: "×" if v is None else f"{v:.4f}")  # noqa: E731
    for c in result["cells"]:
        lines.append(f"| {c['network']} | {round(c['limit'] * 100)} % | {'**' if c['at_or_below'] else ''}"
                     f"{f(c['auto'])}{'**' if c['at_or_below'] else ''} | {c['chosen']} | "
                     f"{f(c['best_baseline_overhead'])} ({c['best_baseline']}) | {f(c['dqn'])} | {f(c['dqn_search'])} | "
                     f"{f(c['best_known'])} | {c['cpu_seconds']:.2f} |")
    s = result["summary"]
    g = (lambda v: "-" if v is None else f"{v:.4f}")  # noqa: E731
    lines += ["", f"`auto` at or below the best baseline (+{result['tolerance']}) in {s['at_or_below_best_baseline']} "
              f"of {s['cells']} cells (bold). Makespan over the best known, geometric mean: auto "
              f"{g(s['auto_over_best_known'])}, dqn (per-network agents) {g(s['dqn_over_best_known'])}, dqn-search "
              f"(shipped agent) {g(s['dqn_search_over_best_known'])}. CPU seconds of one thread per plan: median "
              f"{s['cpu_seconds_median']:.2f}, largest {s['cpu_seconds_max']:.2f}."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- train
def bench_train(args: argparse.Namespace) -> dict[str, Any]:
    """``dqn-swap train NETWORK`` with its defaults (the shipped agent as the reference to beat) on each
    network, one process each, its CPU seconds measured (``RUSAGE_CHILDREN``)."""
    import resource
    import subprocess
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for net in args.networks:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = Path(tmp) / f"{len(runs)}.pt"
            cmd = [sys.executable, "-m", "dqn_swap", "train", net, "-o", str(out), "--log-dir", "none", "--json",
                   "--seed", str(args.seed), *(["--steps", str(args.steps)] if args.steps else [])]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                raise ValueError(f"{net}: dqn-swap train failed: {done.stderr.strip().splitlines()[-1:]}")
            summary = json.loads(done.stdout)
            per_limit = greedy_per_limit(net, out)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            ref = summary["reference_score"]
            best = summary["best"]
            run = {"network": net, "steps": summary["steps"], "cpu_seconds": round(cpu, 1), "wall_seconds": round(wall, 1),
                   "reference_score": ref, "best_score": best["score"], "best_step": best.get("step"),
                   "kept": "reference" if best.get("phase") == "reference" else "trained",
                   "beat_reference": ref is not None and best["score"] < ref - 1e-12, "outcome": summary["outcome"],
                   "per_limit": per_limit, "beats_at_every_limit": all(
                       t is not None and (r is None or t <= r + args.tolerance) for r, t in per_limit.values()),
                   "progress_lines": done.stderr.count("train: ")}
            runs.append(run)
            print(f"{net}: per limit (shipped, trained) {per_limit}; {run['kept']} kept, reference {ref:.4f}, best {best['score']:.4f} at step "
                  f"{best.get('step')}, {cpu / 60:.1f} CPU-min; {summary['outcome']}", flush=True)
    return {"networks": args.networks, "seed": args.seed, "steps": args.steps, "tolerance": args.tolerance,
            "runs": runs}


def greedy_per_limit(net: str, agent: Path) -> dict[str, tuple[float | None, float | None]]:
    """Per limit (90/70/50/30 %), the overhead of the shipped agent's greedy plan (``dqn``) and of the
    trained agent's, as ``(shipped, trained)`` (None: the plan does not fit)."""
    from dqn_swap.agents import get_planner
    from dqn_swap.agents.dqn.report import load_trace_spec

    trace = load_trace_spec(net, "v100-pcie3")
    planners = [get_planner("dqn", threads=1), get_planner("dqn", agent=str(agent), threads=1)]
    out = {}
    for frac in LIMITS:
        limit = pct(frac).resolve(trace)
        figs = [p.plan(trace, limit).figures for p in planners]
        out[f"{round(frac * 100)}%"] = tuple(float(f["overhead"]) if f.get("feasible") else None for f in figs)
    return out


def train_markdown(result: dict[str, Any]) -> str:
    lines = ["| network | steps | CPU minutes | shipped agent's score | trained agent's best score (step) | kept | "
             "greedy overhead at 90/70/50/30 %, shipped -> trained |",
             "|---|---|---|---|---|---|---|"]
    f = (lambda v: "×" if v is None else f"{v:.4f}")  # noqa: E731
    for r in result["runs"]:
        per = ", ".join(f"{f(a)} -> {f(b)}" for a, b in r["per_limit"].values())
        lines.append(f"| {r['network']} | {r['steps']:,} | {r['cpu_seconds'] / 60:.1f} | {r['reference_score']:.4f} | "
                     f"{r['best_score']:.4f} ({r['best_step']:,}) | {r['kept']} | {per} |")
    lines += ["", "Score: the mean over the four limits (90/70/50/30 %) of the greedy plan's overhead plus its "
              "penalties; lower is better. `kept`: the agent the output file holds."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- anytime
def _seed_plan(trace: Any, limit: int, seed: str) -> tuple[Any, float]:
    """The plan a local search starts from for ``seed`` (``best baseline`` or ``nothing``), and the
    CPU seconds it took."""
    from dqn_swap.agents import get_planner
    from dqn_swap.agents.auto import quick_baselines

    c0 = time.process_time()
    names = quick_baselines(trace.n_events) if seed == "best baseline" else ("greedy-swap", "recompute-all")
    best = None
    for name in names:
        plan = get_planner(name).plan(trace, limit)
        if plan.figures.get("feasible") and (best is None or plan.figures["makespan"] < best.figures["makespan"]):
            best = plan
        if best is not None and seed == "nothing":
            break
    return best, time.process_time() - c0


def anytime_cell(trace: Any, limit: int, budgets: list[float], searcher: Any) -> dict[str, Any]:
    """Per seed, the makespan reached at each budget (None: no plan that fits), the CPU seconds spent,
    and whether the run stopped on its own before the time (then longer budgets repeat it)."""
    from dqn_swap.agents.local_search import default_simulations, polish
    from dqn_swap.simulator import Simulator

    out: dict[str, Any] = {}
    for seed in SEEDS:
        runs = []
        last = None
        for T in budgets:
            if last is not None and not last["cut"]:
                runs.append({**last, "budget": T, "repeated": True})
                continue
            c0, t0 = time.process_time(), time.perf_counter()
            if seed == "agent":
                searcher.time_limit = T
                plan = searcher.plan(trace, limit)
                makespan = plan.figures["makespan"] if plan.figures.get("feasible") else None
                cut = bool(plan.settings.get("cut_by_time"))
            else:
                start, spent = _seed_plan(trace, limit, seed)
                if start is None:
                    makespan, cut = None, False
                else:
                    end = t0 + T
                    res = polish(Simulator(trace, limit), list(start.actions), max_rounds=1000,
                                 max_simulations=20 * default_simulations(trace.n_events),
                                 deadline=lambda: time.perf_counter() >= end)
                    makespan, cut = float(res.result.makespan), res.stopped == "time"
            last = {"budget": T, "makespan": makespan, "cut": cut, "cpu_seconds": round(time.process_time() - c0, 3),
                    "seconds": round(time.perf_counter() - t0, 3)}
            runs.append(last)
        out[seed] = runs
    return out


def anytime_cells(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """(name, family, trace) of the cells' networks: the grid's and ``--per-family`` of each test family."""
    from dqn_swap.models.corpus import record_corpus
    from dqn_swap.models.generator import corpus
    from dqn_swap.trace import Trace

    nets = [(NAMES[m], "grid", get_trace(m, b)) for m, b in GRID.items()] if "grid" in args.sets else []
    if "test" in args.sets and args.per_family:
        specs = corpus("test", args.per_family)
        for spec, path in zip(specs, record_corpus(specs, CORPUS / "test")):
            nets.append((spec.name, spec.family, Trace.load(path)))
    return nets


def bench_anytime(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents import get_planner

    known = json.loads(Path(args.best_known).read_text())["cells"] if args.best_known else {}
    known_by = {(v["fingerprint"], int(v["limit_bytes"])): v["makespan"] for v in known.values()}
    searcher = get_planner("dqn-search", threads=1)
    nets = anytime_cells(args)
    searcher.time_limit = 5
    searcher.plan(nets[0][2], pct(0.5).resolve(nets[0][2]))  # untimed: the compiled kernels load once per process
    cells = []
    for name, family, trace in nets:
        for frac in args.limits:
            limit = pct(frac).resolve(trace)
            c0 = time.process_time()
            runs = anytime_cell(trace, limit, args.seconds, searcher)
            seen = [r["makespan"] for rs in runs.values() for r in rs if r["makespan"] is not None]
            best = min([*seen, *([known_by[(trace.fingerprint, limit)]] if (trace.fingerprint, limit) in known_by
                                 else [])])
            cell = {"network": name, "family": family, "limit": frac, "limit_bytes": limit,
                    "fingerprint": trace.fingerprint, "n_events": trace.n_events, "best_known_makespan": best,
                    "runs": runs}
            cells.append(cell)
            q = {s: [None if r["makespan"] is None else round(r["makespan"] / best, 4) for r in rs]
                 for s, rs in runs.items()}
            print(f"{name:28s} {round(frac * 100):3d}%  " + "  ".join(f"{s}: {q[s]}" for s in SEEDS)
                  + f"  {time.process_time() - c0:.0f} CPU s", flush=True)
    return {"seconds": args.seconds, "limits": args.limits, "sets": args.sets, "per_family": args.per_family,
            "best_known_file": args.best_known, "cells": cells, "summary": anytime_summary(cells, args.seconds)}


def anytime_summary(cells: list[dict[str, Any]], budgets: list[float]) -> dict[str, Any]:
    """Per seed and budget: the geometric mean of makespan / best known over the cells where every seed
    fits, the cells within 1 % of the best known, and the cells without a plan that fits."""
    out: dict[str, Any] = {}
    for seed in SEEDS:
        rows = []
        for i, T in enumerate(budgets):
            both = [c for c in cells if all(c["runs"][s][i]["makespan"] is not None for s in SEEDS)]
            ratios = [c["runs"][seed][i]["makespan"] / c["best_known_makespan"] for c in both]
            rows.append({"budget": T, "geomean_over_best_known": geomean(ratios),
                         "within_1pct": sum(r <= 1.01 for r in ratios), "cells": len(both),
                         "no_plan": sum(c["runs"][seed][i]["makespan"] is None for c in cells)})
        out[seed] = rows
    return out


def anytime_markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    budgets = result["seconds"]
    n = len(result["cells"])
    lines = [f"Makespan over the best plan known, geometric mean over the cells where every seed gives a plan "
             f"that fits ({s['agent'][0]['cells']} of {n}); in brackets, the cells within 1 % of the best known.", "",
             "| search seeded by | " + " | ".join(f"{T:g} s" for T in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    for seed in SEEDS:
        lines.append(f"| {seed} | " + " | ".join(
            "-" if r["geomean_over_best_known"] is None else f"{r['geomean_over_best_known']:.4f} ({r['within_1pct']})"
            for r in s[seed]) + " |")
    nothing = [r["no_plan"] for r in s["nothing"]]
    if any(nothing):
        lines += ["", f"`nothing` found no plan that fits in {max(nothing)} cells (its rule's plan did not fit)."]
    return "\n".join(lines) + "\n"


def plot_anytime(result: dict[str, Any], path: str) -> None:
    from dqn_swap.plots import _pyplot, save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for seed, style in zip(SEEDS, ("o-", "s--", "^:")):
        rows = [r for r in result["summary"][seed] if r["geomean_over_best_known"] is not None]
        ax.plot([r["budget"] for r in rows], [r["geomean_over_best_known"] for r in rows], style, label=seed)
    ax.set_xscale("log")
    ax.set_xticks(result["seconds"], [f"{T:g}" for T in result["seconds"]])
    ax.set_xlabel("seconds of search (one thread)")
    ax.set_ylabel("makespan / best known (geometric mean)")
    ax.set_title("What a search reaches by its seed")
    ax.grid(alpha=0.3)
    ax.legend(title="search seeded by")
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grid", help="auto on the comparison grid against every baseline")
    g.add_argument("--baselines", default=str(ROOT / "benchmarks/results/dqn_grid.json"))
    g.add_argument("--search", default=str(ROOT / "benchmarks/results/search_grid.json"))
    g.add_argument("--tolerance", type=float, default=1e-3)
    g.add_argument("--json")
    g.add_argument("--md")
    a = sub.add_parser("anytime", help="quality after 1, 2, 5, 10 and 30 seconds of search, by seed")
    a.add_argument("--seconds", type=float, nargs="+", default=[1, 2, 5, 10, 30])
    a.add_argument("--limits", type=float, nargs="+", default=[0.7, 0.5, 0.3])
    a.add_argument("--sets", nargs="+", default=["grid", "test"], choices=("grid", "test"))
    a.add_argument("--per-family", type=int, default=1)
    a.add_argument("--best-known", default=str(ROOT / "benchmarks/results/best_known.json"))
    a.add_argument("--plot")
    a.add_argument("--json")
    a.add_argument("--md")
    t = sub.add_parser("train", help="dqn-swap train with its defaults on networks the zoo does not hold")
    t.add_argument("--networks", nargs="+", default=["gen:mlp_mixer:0", "gen:se_cnn:0", "gen:inverted_residual_cnn:1"])
    t.add_argument("--steps", type=int, help="--steps for train (default: train's own)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--tolerance", type=float, default=1e-3)
    t.add_argument("--json")
    t.add_argument("--md")
    args = parser.parse_args(argv)
    if args.command == "train":
        return run_and_publish("bench_default train", bench_train, train_markdown, args)
    if args.command == "grid":
        return run_and_publish("bench_default grid", bench_grid, grid_markdown, args)

    def run(args: argparse.Namespace) -> dict[str, Any]:
        result = bench_anytime(args)
        if args.plot:
            plot_anytime(result, args.plot)
        return result

    return run_and_publish("bench_default anytime", run, anytime_markdown, args)


if __name__ == "__main__":
    raise SystemExit(main())
