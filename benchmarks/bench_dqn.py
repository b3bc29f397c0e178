#!/usr/bin/env python
"""Benchmarks of the DQN planner: speed, plan quality against the baselines, transfer.

Subcommands (each prints a table and writes JSON with ``--json``)::

    python benchmarks/bench_dqn.py train      # wall time to train the ResNet-50 agent
    python benchmarks/bench_dqn.py plan-time  # DQN plan time on the ResNet-1001 trace
    python benchmarks/bench_dqn.py grid       # comparison grid: DQN vs every baseline
    python benchmarks/bench_dqn.py transfer   # fine-tune vs from scratch (ResNet-152, ResNet-1001)
    python benchmarks/bench_dqn.py ablation   # DQN improvements on a small network

The grid is ResNet-50, VGG-16, U-Net, the LSTM and the GPT decoder at memory
limits 90/70/50/30% of the way from ``trace.minimum_memory`` to
``trace.peak_bytes``; ``--agents DIR`` names the per-network agents
(``DIR/<model>.pt``, falling back to ``checkpoints/default.pt``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402,F401  (re-exported for the scripts that still import them from here)
    DEFAULT_AGENT, GRID, LIMITS, NAMES, PROFILE, ROOT, TRACE_DIR, agent_files, get_trace, grid_agent, pct, slug,
    write_json)
from dqn_swap.files import save_figure, write_text  # noqa: E402

CACHE = ROOT / "runs" / "baselines_cache.json"  # baseline figures per (model, limit, trace fingerprint)



def bench_train(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents.dqn import DQNConfig
    from dqn_swap.agents.dqn.algorithm import train

    trace = get_trace("resnet50", GRID["resnet50"])
    cfg = DQNConfig(total_timesteps=args.steps, eval_every=max(args.steps // 8, 1))
    out = Path(args.out or ROOT / "runs" / "bench_resnet50.pt")
    t0 = time.perf_counter()
    res = train(trace, [pct(f) for f in LIMITS], out, cfg, profile=PROFILE, log_dir=str(ROOT / "runs"),
                run_name=f"bench_resnet50_{int(time.time())}", overwrite=True, threads=args.threads)
    dt = time.perf_counter() - t0
    print(f"trained the ResNet-50 agent ({args.steps} steps, limits {LIMITS}) in {dt / 60:.1f} min "
          f"({args.steps / dt:.1f} steps/s); best score {res.best['score']:.4f}")
    return {"steps": args.steps, "seconds": dt, "best": res.best, "path": str(out)}


def bench_plan_time(args: argparse.Namespace) -> dict[str, Any]:
    """Plan time of the dqn planner on ResNet-1001 b64, each decoding in turn at each limit (one run: compare ratios)."""
    from dqn_swap.agents.dqn import DQNPlanner

    trace = get_trace("resnet1001", 64)
    out: dict[str, Any] = {"decodings": list(args.decode)}
    for limit in args.limits:
        lim, row = pct(limit).resolve(trace), {}
        for decode in args.decode:
            planner = DQNPlanner(args.agent, threads=args.threads, decode=decode)
            t0 = time.perf_counter()
            plan = planner.plan(trace, lim, PROFILE)
            dt = time.perf_counter() - t0
            f = plan.figures
            row[decode] = {"seconds": dt, "n_actions": len(plan.actions), "overhead": f.get("overhead"),
                           "feasible": f.get("feasible"), "decoded_as": plan.settings.get("decode")}
            print(f"resnet1001 b64 @ {int(limit * 100)}%, {decode}: planned in {dt:.2f} s ({len(plan.actions)} "
                  f"actions, overhead {f.get('overhead'):.4f}, feasible {f.get('feasible')})", flush=True)
        out[f"{int(limit * 100)}%"] = row
    return out


# ----------------------------------------------------------------------------- quality
def _figures(trace, plan, limit):
    from dqn_swap.simulator import simulate

    from dqn_swap.cost import get_profile

    res = simulate(trace, plan, memory_limit=limit, profile=get_profile(PROFILE))
    return {"feasible": bool(res.feasible), "overhead": float(res.overhead), "makespan": float(res.makespan),
            "makespan_over_lb": float(res.makespan_over_lower_bound), "n_actions": len(plan.actions)}


def bench_grid(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents import get_planner, planner_names
    from dqn_swap.agents.dqn import DQNPlanner, DQNSearchPlanner
    from dqn_swap.cost import get_profile

    # the papers' baselines and the switches users turn on instead (per-block checkpointing, offloading, knapsack)
    names = list(planner_names("baseline")) + list(planner_names("switch"))
    prof = get_profile(PROFILE)
    agents_dir = Path(args.agents) if args.agents else None
    cache = json.loads(CACHE.read_text()) if CACHE.exists() and not args.fresh else {}
    # The exact planner's certified bounds (bench_optimal.py grid), matched by cell and limit in bytes.
    optimal = json.loads(Path(args.optimal).read_text()) if args.optimal and Path(args.optimal).exists() else {}
    bounds = {(c["model"], c["limit"], c["limit_bytes"]): c for c in optimal.get("cells", [])}
    rows, wins, cells, feas_ok = [], 0, 0, 0
    for model in args.models:
        trace = get_trace(model, GRID[model])
        for frac in LIMITS:
            agent = grid_agent(agents_dir, model, frac) or args.default_agent
            agent = agent_files(agent) if isinstance(agent, str) else agent
            dqn = DQNPlanner(agent, decode=args.decode,
                             **({"members": True, "more_agents": args.members} if args.members is not None else {}))
            search = DQNSearchPlanner(agent) if args.search else None
            limit = pct(frac).resolve(trace)
            cell: dict[str, Any] = {"model": model, "limit": frac, "limit_bytes": limit, "agent": dqn._settings()["agent"]}
            key = f"{model}@{frac}@{limit}@{trace.fingerprint}"
            if key in cache:
                cell.update(cache[key])
            for name in names:
                if name in cell:
                    continue
                try:
                    t0 = time.perf_counter()
                    plan = get_planner(name).plan(trace, limit, prof)
                    cell[name] = _figures(trace, plan, limit) | {"seconds": time.perf_counter() - t0}
                except Exception as e:  # a baseline that cannot plan this cell
                    cell[name] = {"feasible": False, "overhead": float("inf"), "error": str(e)[:100]}
            cache[key] = {n: cell[n] for n in names}
            write_text(CACHE, json.dumps(cache, default=float), overwrite=True)
            t0 = time.perf_counter()
            cell["dqn"] = _figures(trace, dqn.plan(trace, limit, PROFILE), limit) | {"seconds": time.perf_counter() - t0}
            if search is not None:
                t0 = time.perf_counter()
                cell["dqn-search"] = _figures(trace, search.plan(trace, limit, PROFILE), limit) | {
                    "seconds": time.perf_counter() - t0}
            feas = [n for n in names if cell[n]["feasible"]]
            best = min(feas, key=lambda n: cell[n]["overhead"]) if feas else None
            cell["best_baseline"] = best
            d = cell["dqn"]
            ok_feas = d["feasible"] or not feas

            def at_or_below(fig: dict[str, Any]) -> bool:
                return (fig["feasible"] or not feas) and (best is None or (fig["feasible"] and fig["overhead"] <= (
                    cell[best]["overhead"] * (1 + 1e-9) + 1e-12 + args.tolerance)))

            win = at_or_below(d)
            cell["dqn_wins"] = bool(win)
            if search is not None:
                cell["dqn-search_wins"] = bool(at_or_below(cell["dqn-search"]))
            opt = bounds.get((model, frac, limit))
            if opt is not None:
                cell["bound"], cell["proved_optimal"] = opt["bound"], opt["proved_optimal"]
                for a in ("dqn", "dqn-search"):
                    if a in cell and cell[a]["feasible"]:
                        cell[a]["distance_to_bound"] = cell[a]["makespan"] / opt["bound"] - 1
            cells += 1
            wins += win
            feas_ok += ok_feas
            rows.append(cell)
            bo = f"{cell[best]['overhead']:.4f} ({best})" if best else "none feasible"
            print(f"{model:9s} {int(frac * 100):3d}%  best baseline {bo:28s} dqn {d['overhead']:.4f} "
                  f"feas {d['feasible']!s:5s} M/LB {d['makespan_over_lb']:.3f}"
                  + (f"  dqn-search {cell['dqn-search']['overhead']:.4f}" if search else "")
                  + ("  WIN" if win else ""), flush=True)
    print(f"DQN <= best baseline (+{args.tolerance:g}) in {wins}/{cells} cells ({100 * wins / max(cells, 1):.0f}%); "
          f"feasible wherever a baseline is in {feas_ok}/{cells}")
    out = {"cells": rows, "wins": wins, "n_cells": cells, "feasible_ok": feas_ok, "tolerance": args.tolerance}
    for a in ("dqn", "dqn-search"):
        if a == "dqn-search" and not args.search:
            continue
        if a == "dqn-search":
            out["search_wins"] = sum(c["dqn-search_wins"] for c in rows)
        dist = [c[a]["distance_to_bound"] for c in rows if "distance_to_bound" in c[a]]
        proved = [c[a]["distance_to_bound"] for c in rows if "distance_to_bound" in c[a] and c["proved_optimal"]]
        if dist:  # geometric mean of makespan / bound, minus 1 (bench_optimal.py's figure)
            out[f"{a}_geomean_distance_to_bound"] = math.exp(sum(math.log1p(x) for x in dist) / len(dist)) - 1
            out[f"{a}_geomean_distance_to_optimum_proved_cells"] = (
                math.exp(sum(math.log1p(x) for x in proved) / len(proved)) - 1 if proved else None)
            print(f"{a}: geometric-mean distance to the certified bound {100 * out[f'{a}_geomean_distance_to_bound']:.2f} % "
                  f"over {len(dist)} cells; to the optimum over the {len(proved)} proved cells "
                  f"{100 * (out[f'{a}_geomean_distance_to_optimum_proved_cells'] or 0):.2f} %")
    if args.search:
        print(f"dqn-search <= best baseline (+{args.tolerance:g}) in {out['search_wins']}/{cells} cells")
    return out


def grid_markdown(result: dict[str, Any]) -> str:
    """The grid as a markdown table: every baseline's overhead, the DQN's, and its makespan / lower bound."""
    cells = result["cells"]
    names = [n for n in cells[0] if isinstance(cells[0][n], dict) and n not in ("dqn", "dqn-search", "none")]
    search = "dqn-search" in cells[0]
    head = ["network", "limit", "GiB"] + names + ["**dqn**", "dqn M/LB"] + (["dqn-search"] if search else []) + ["dqn <= best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(fig: dict[str, Any], best: bool = False) -> str:
        if not fig["feasible"]:
            return "×"
        v = f"{fig['overhead']:.4f}"
        return f"**{v}**" if best else v

    for c in cells:
        feas = [c[n]["overhead"] for n in names if c[n]["feasible"]]
        low = min(feas) if feas else None
        row = [NAMES.get(c["model"], c["model"]), f"{round(c['limit'] * 100)} %", f"{c['limit_bytes'] / 2**30:.2f}"]
        row += [fmt(c[n], low is not None and c[n]["feasible"] and c[n]["overhead"] <= low + 1e-12) for n in names]
        row += [fmt(c["dqn"]), f"{c['dqn']['makespan_over_lb']:.3f}"]
        row += [fmt(c["dqn-search"])] if search else []
        row += ["yes" if c["dqn_wins"] else "no"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(f"\nDQN <= best baseline in {result['wins']} of {result['n_cells']} cells; "
                 f"feasible wherever a baseline is in {result['feasible_ok']} of {result['n_cells']}.")
    return "\n".join(lines) + "\n"


def bench_train_grid(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune the shipped agent on every grid cell (one network, one limit), as in the
    paper's Figure 3: the user's network and limit go in, training returns the agent."""
    from dqn_swap.agents.dqn.algorithm import finetune

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for spec in args.models:
        model, _, steps = spec.partition(":")
        steps = int(steps or args.steps)
        trace = get_trace(model, GRID[model])
        for frac in LIMITS:
            name = f"{model}@{round(frac * 100)}"
            if args.only and name not in args.only:
                continue
            start = out_dir / f"{name}.pt" if args.again and (out_dir / f"{name}.pt").exists() else args.agent
            t0 = time.perf_counter()
            res = finetune(start, trace, [pct(frac)], out_dir / f"{name}.pt", total_timesteps=steps,
                           start_e=args.start_e, config_overrides={"eval_every": max(steps // 6, 1),
                                                                   "batch_size": args.batch_size, "seed": args.seed},
                           profile=PROFILE, log_dir=str(ROOT / "runs"), run_name=f"grid_{name}",
                           overwrite=True, threads=args.threads, command=" ".join(sys.argv))
            out[name] = {"steps": steps, "seconds": time.perf_counter() - t0, "best": res.best, "from": str(start),
                         "start": res.evaluations[0]["score"]}
            print(f"{name}: {steps} steps in {out[name]['seconds']:.0f} s; greedy score {out[name]['start']:.4f} "
                  f"-> best {res.best['score']:.4f} (step {res.best.get('step')})", flush=True)
            (out_dir / f"{name}.pt.resume").unlink(missing_ok=True)
    return out


def _recorded_run(path: Path, trace, limits: list[float], steps: int):  # noqa: ANN001, ANN202
    """The evaluations a finished training run stored in its checkpoint, checked against this experiment."""
    from types import SimpleNamespace

    import torch


    t = torch.load(path, weights_only=True)["training"]
    if t["steps"] != steps or [int(x) for x in t["memory_limits"]] != [pct(f).resolve(trace) for f in limits]:
        raise SystemExit(f"{path}: trained for {t['steps']} steps at {t['memory_limits']}, not {steps} at {limits}; "
                         "drop --reuse-scratch")
    return SimpleNamespace(best=t["best"], evaluations=t["evaluations"], wall_time=t["wall_time_s"])


def bench_transfer(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents.dqn import DQNConfig
    from dqn_swap.agents.dqn.algorithm import eval_cadence, finetune, train
    from dqn_swap.agents.dqn.report import parse_overrides, plot_curves

    out: dict[str, Any] = {}
    curves = {}
    # --set applies to both runs, so that they are trained by the same recipe (demonstrations included)
    overrides = parse_overrides(args.overrides)
    set_tag = "".join(f"_{k}-{v}" for k, v in sorted(overrides.items()))
    ft_overrides = parse_overrides(args.ft_overrides)  # the fine-tuning run's alone
    ft_tag = "".join(f"_{k}-{v}" for k, v in sorted(ft_overrides.items()))
    for spec in args.models:
        model, _, batch = spec.rpartition(":")  # hf:llama:32 -> hf:llama, 32
        trace = get_trace(model, int(batch))
        name = slug(model)
        # both runs evaluate at their own default cadence (a twentieth of their steps), as a user's runs do
        base = DQNConfig(total_timesteps=args.steps, eval_every=eval_cadence(args.steps), seed=args.seed).replace(
            **overrides)
        d = ROOT / "runs" / "transfer"
        limits = list(args.limits)
        seed_tag = (f"_s{args.seed}" if args.seed else "") + set_tag
        scratch_path = d / f"{name}_scratch{seed_tag}.pt"
        if args.reuse_scratch and scratch_path.exists():  # same seed and settings: reuse its recorded evaluations
            scratch = _recorded_run(scratch_path, trace, limits, args.steps)
        else:
            scratch = train(trace, [pct(f) for f in limits], scratch_path, base, profile=PROFILE, log_dir=str(ROOT / "runs"),
                            run_name=f"transfer_{name}_scratch{seed_tag}", overwrite=True, threads=args.threads)
        if args.scratch_only:
            print(f"{name}: scratch best {scratch.best['score']:.4f} in {args.steps} steps ({scratch_path})")
            continue
        ft_steps = int(args.steps * args.fraction)
        tag = "" if Path(args.agent).resolve() == DEFAULT_AGENT.resolve() else f"_from_{Path(args.agent).stem}"
        lr_factor = args.lr_factor if args.lr_factor is not None else \
            inspect.signature(finetune).parameters["lr_factor"].default
        tag += f"_e{args.start_e}" if args.start_e != 0.2 else ""
        tag += f"_lr{args.lr_factor}" if args.lr_factor is not None else ""
        tag += seed_tag + ft_tag
        ft = finetune(args.agent, trace, [pct(f) for f in limits], d / f"{name}_finetune{tag}.pt", total_timesteps=ft_steps,
                      start_e=args.start_e, lr_factor=lr_factor,
                      config_overrides={**overrides, **ft_overrides, "seed": args.seed},
                      profile=PROFILE,
                      log_dir=str(ROOT / "runs"), run_name=f"transfer_{name}_finetune{tag}", overwrite=True,
                      threads=args.threads)
        s_best, f_best = scratch.best["score"], ft.best["score"]
        out[name] = {"agent": str(args.agent), "seed": args.seed, "settings": overrides, "finetune_settings": ft_overrides, "start_e": args.start_e, "lr_factor": lr_factor, "limits": limits,
                     "scratch_steps": args.steps, "finetune_steps": ft_steps,
                     "scratch_seconds": scratch.wall_time, "finetune_seconds": ft.wall_time, "scratch_best": s_best,
                     "finetune_best": f_best, "reached": f_best <= s_best * (1 + 1e-9) + 1e-12,
                     "scratch_curve": [(e["step"], e["score"]) for e in scratch.evaluations],
                     "finetune_curve": [(e["step"], e["score"]) for e in ft.evaluations]}
        curves[f"{name} from scratch"] = out[name]["scratch_curve"]
        curves[f"{name} fine-tuned from {Path(args.agent).name}"] = out[name]["finetune_curve"]
        print(f"{name}: scratch best {s_best:.4f} in {args.steps} steps; fine-tuned best {f_best:.4f} "
              f"in {ft_steps} steps ({100 * args.fraction:.0f}%) -> {'reached' if out[name]['reached'] else 'not reached'}")
    if args.plot and curves:
        plot_curves(curves, args.plot, title=f"fine-tuning {Path(args.agent).name} vs training from scratch")
    return out


def bench_transfer_plot(args: argparse.Namespace) -> dict[str, Any]:
    """One panel per network, one colour per transfer JSON (a seed): from scratch solid, fine-tuned dashed.
    Returns each run's best scores and the means over the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(Path(f).read_text()) for f in args.runs]
    names = [n for n in runs[0] if isinstance(runs[0][n], dict) and "scratch_curve" in runs[0][n]]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    out: dict[str, Any] = {}
    for ax, name in zip(axes[0], names):
        for i, run in enumerate(runs):
            r, colour = run[name], f"C{i}"
            for key, style, label in (("scratch_curve", "-", "from scratch"),
                                      ("finetune_curve", "--", f"fine-tuned, {r['finetune_steps']} steps")):
                steps, scores = zip(*r[key])
                ax.plot(steps, scores, style, color=colour, marker=".", label=f"seed {r['seed']}, {label}")
        bests = [(run[name]["scratch_best"], run[name]["finetune_best"]) for run in runs]
        out[name] = {"scratch_best": [b[0] for b in bests], "finetune_best": [b[1] for b in bests],
                     "scratch_mean": sum(b[0] for b in bests) / len(bests),
                     "finetune_mean": sum(b[1] for b in bests) / len(bests)}
        ax.set(title=name, xlabel="environment steps", ylabel="mean overhead + penalty (greedy plan)", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, args.plot, overwrite=True, dpi=110)
    return out


def bench_transfer_search(args: argparse.Namespace) -> dict[str, Any]:
    """The agents of a transfer experiment (or any) planned through ``dqn-search`` instead of greedily:
    per model and agent, the overhead at each limit and their mean (the transfer score without penalties,
    every plan here fits)."""
    from dqn_swap.agents import get_planner

    out: dict[str, Any] = {}
    agents = dict(item.split("=", 1) for item in args.agents)
    for spec in args.models:
        model, _, batch = spec.rpartition(":")
        trace = get_trace(model, int(batch))
        out[spec] = {}
        for label, path in agents.items():
            path = path.replace("{model}", slug(model))
            planner = get_planner("dqn-search", agent=path)
            t0 = time.perf_counter()
            figs = [planner.plan(trace, pct(f).resolve(trace), PROFILE).figures for f in args.limits]
            over = [f["overhead"] if f.get("feasible") else None for f in figs]
            mean = sum(over) / len(over) if None not in over else None
            out[spec][label] = {"agent": path, "overheads": over, "mean": mean,
                                "seconds": round(time.perf_counter() - t0, 1)}
            print(f"{spec} {label:12s} {over} mean {mean}", flush=True)
    return out


def bench_ablation(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents.dqn import DQNConfig
    from dqn_swap.agents.dqn.algorithm import train

    variants = {
        "all (default)": {},
        "paper (Eq. 1-5 as written)": dict(reward="accrued", aggr="sum", head_features=False,
                                           recompute_chains=True, target_network=False, n_step=1,
                                           double_q=False, mask_target=False, readout="sum"),
        "reward accrued (charged when simulated)": dict(reward="accrued"),
        "- head features": dict(head_features=False),
        "aggregation sum (Eq. 1)": dict(aggr="sum"),
        "+ recompute chains": dict(recompute_chains=True),
        "- target network": dict(target_network=False),
        "- n-step (n=1)": dict(n_step=1),
        "- double Q": dict(double_q=False),
        "- masked target": dict(mask_target=False),
        "+ prioritized replay": dict(prioritized=True),
        "readout sum (Eq. 2)": dict(readout="sum"),
        "events graph (sec. 4.2)": dict(graph="events"),
        "+ demonstrations (DQfD)": dict(demonstrations="best-baseline", demo_pretrain_steps=1000),
    }
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only or k == "all (default)"}
    traces = [get_trace(*s.split(":")[:1], int(s.split(":")[1])) for s in args.models]
    rows = {}
    for name, change in variants.items():
        scores = []
        for seed in range(args.seeds):
            cfg = DQNConfig(total_timesteps=args.steps, eval_every=max(args.steps // 5, 1), seed=seed, **change)
            t0 = time.perf_counter()
            tag = "+".join(m.replace(":", "_b") for m in args.models)
            res = train(traces, [pct(f) for f in LIMITS], ROOT / "runs" / "ablation" / tag / f"{len(rows)}_{seed}.pt", cfg,
                        profile=PROFILE, log_dir=None, overwrite=True, threads=args.threads)
            scores.append((res.best["score"], res.evaluations[-1]["score"], time.perf_counter() - t0))
        s = np.array(scores)
        rows[name] = {"best": float(s[:, 0].mean()), "final": float(s[:, 1].mean()), "seconds": float(s[:, 2].mean()),
                      "seeds": args.seeds}
        print(f"| {name:46s} | {rows[name]['best']:.4f} | {rows[name]['final']:.4f} | {rows[name]['seconds']:.0f} |",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    from dqn_swap.agents import DQN_DECODINGS as DECODINGS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train"); p.add_argument("--steps", type=int, default=20000); p.add_argument("--out")
    p = sub.add_parser("plan-time"); p.add_argument("--agent"); p.add_argument("--limits", nargs="+", type=float,
                                                                              default=[0.9, 0.7, 0.5, 0.3])
    p.add_argument("--decode", nargs="+", default=["greedy", "cover"], choices=DECODINGS,
                   help="decodings of the dqn planner to time, in turn at each limit")
    p = sub.add_parser("grid"); p.add_argument("--agents"); p.add_argument("--search", action="store_true")
    p.add_argument("--decode", default="auto", choices=DECODINGS, help="how the dqn planner decodes Q-values")
    p.add_argument("--members", nargs="*", metavar="AGENT_FILE",
                   help="an ensemble's dqn planner also decodes with each member, and with these agent files in "
                        "their own environments, and keeps the best plan")
    p.add_argument("--default-agent", help="agent for cells without one in --agents (default checkpoints/default.pt; "
                   "PATH+PATH...: the ensemble of those agents)")
    p.add_argument("--fresh", action="store_true", help="re-run the baselines instead of using runs/baselines_cache.json")
    p.add_argument("--models", nargs="+", default=list(GRID))
    p.add_argument("--md", help="also write the table as markdown here")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="a cell counts for the DQN at or below the best baseline's overhead plus this (the recorded grids used 1e-3)")
    p.add_argument("--optimal", default=str(ROOT / "benchmarks" / "results" / "optimal_grid.json"),
                   help="bench_optimal.py grid's results: distance of each plan to the certified bound")
    p = sub.add_parser("train-grid"); p.add_argument("--agent", default=str(DEFAULT_AGENT))
    p.add_argument("--models", nargs="+", default=list(GRID), help="model or model:steps")
    p.add_argument("--steps", type=int, default=3000); p.add_argument("--start-e", type=float, default=0.3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--only", nargs="*", help="cells to train, e.g. vgg16@30")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--again", action="store_true", help="start each cell from its agent in --out-dir if there is one")
    p.add_argument("--out-dir", default=str(ROOT / "checkpoints" / "grid"))
    p = sub.add_parser("transfer"); p.add_argument("--agent", default=str(DEFAULT_AGENT))
    p.add_argument("--models", nargs="+", default=["resnet152:32", "resnet1001:64"])
    p.add_argument("--steps", type=int, default=10000); p.add_argument("--fraction", type=float, default=0.3)
    p.add_argument("--limits", nargs="+", type=float, default=list(LIMITS))
    p.add_argument("--plot", help="PNG of both runs' evaluation curves (default: none)")
    p.add_argument("--start-e", type=float, default=0.2, help="fine-tuning's starting epsilon")
    p.add_argument("--lr-factor", type=float, default=None,
                   help="fine-tuning's learning rate over the agent's (default: finetune's own)")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs (the scratch run's file is per seed)")
    p.add_argument("--reuse-scratch", action="store_true",
                   help="take the from-scratch run from runs/transfer/<model>_scratch.pt if it is there")
    p.add_argument("--scratch-only", action="store_true",
                   help="only train the from-scratch agents (runs/transfer/<model>_scratch.pt), for --reuse-scratch later")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="a DQNConfig setting for both runs, e.g. demonstrations=best-baseline (repeatable)")
    p.add_argument("--ft-set", action="append", default=[], metavar="KEY=VALUE", dest="ft_overrides",
                   help="a DQNConfig setting for the fine-tuning run alone, over finetune's defaults (repeatable)")
    p = sub.add_parser("transfer-plot", help="plot several transfer JSONs (seeds) side by side")
    p.add_argument("runs", nargs="+", help="JSON files written by 'transfer --json'"); p.add_argument("--plot", required=True)
    p = sub.add_parser("transfer-search", help="plan with dqn-search using each agent (e.g. scratch vs fine-tuned)")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--agents", nargs="+", required=True, metavar="LABEL=PATH",
                   help="checkpoints; {model} in PATH becomes the model's file name (runs/transfer/{model}_scratch.pt)")
    p.add_argument("--limits", nargs="+", type=float, default=list(LIMITS))
    p = sub.add_parser("ablation"); p.add_argument("--models", nargs="+", default=["resnet_tiny:8", "gpt_tiny:4"])
    p.add_argument("--only", nargs="*", help="variant names to run (beside the default)")
    p.add_argument("--steps", type=int, default=3000); p.add_argument("--seeds", type=int, default=2)
    for p in sub.choices.values():
        p.add_argument("--json", help="write the results here")
        p.add_argument("--threads", type=int)
    args = ap.parse_args(argv)
    fn = {"train": bench_train, "plan-time": bench_plan_time, "grid": bench_grid, "train-grid": bench_train_grid,
          "transfer": bench_transfer, "transfer-plot": bench_transfer_plot,
          "transfer-search": bench_transfer_search, "ablation": bench_ablation}[args.cmd]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = fn(args)
    write_json(result, args.json)
    if getattr(args, "md", None):
        from machine import machine

        write_text(Path(args.md), f"{machine()}; `{' '.join(sys.argv)}`\n\n" + grid_markdown(result), overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
