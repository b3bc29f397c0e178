#!/usr/bin/env python
"""Zero-shot planning of generated networks: an agent against every baseline and the best plan known.

Draws ``--per-family`` networks of every family of ``--split`` (default ``test``: the
families no shipped agent is trained on, :mod:`dqn_swap.models.generator`), records each
on ``meta`` at its own batch size and device profile (cached under ``runs/corpus/``),
and plans it at 90/70/50/30 % of the way from its minimum memory to its peak with every
baseline of the planner registry -- the papers' and the switches users turn on (per-block
checkpointing, activation offloading, both, torch.compile's knapsack) -- and with the agent
(``dqn``; ``--search`` adds ``dqn-search``).

Every planner gets a *scorecard* over the cells (:func:`scorecard`), overall and per family:
cells at or below the best baseline (its overhead plus ``--tolerance``, default 1e-3, with
the agent's plan feasible), infeasible cells, the geometric means of the makespan over the best
baseline's, over the best plan known and over the certified lower bound
(:mod:`dqn_swap.lower_bound`), and the CPU seconds of one thread it took to plan a cell (median
and largest).  The markdown names the families each agent was trained on, as its agent file
records them (:func:`trained_families`).

**The best plans known.**  ``--best-known PATH`` (``benchmarks/results/best_known.json``) is a
table of the best feasible plan known per cell -- network, batch size, profile, limit -- with the
trace's fingerprint, the planner and settings that found it, and the certified lower bound beside
it.  Every plan of the run is a candidate; the table is merged (:func:`merge_best_known`): an entry
is replaced only by a faster feasible plan, and an entry whose fingerprint is not the freshly
recorded trace's is reported and replaced.  Scorecards measure against the merged table.
``--best-known-plans DIR`` saves the plans of the entries a run adds or improves as plan files
(:mod:`dqn_swap.plan`), so that a figure of the table can be simulated again, and every run does:
an entry with a plan file gets the current simulator's figures for it (:func:`resimulated`) before
it is compared, so a change of the simulator's model never leaves a target no plan can reach.
``--long-search SECONDS`` adds the candidates that cost the most: ``dqn-search`` with that time
budget, ``--long-factor`` times its default local-search budget and twice its width, its plan
then polished until a pass finds nothing (:data:`LONG`), and every feasible baseline's plan
polished the same way.
``--optimal SECONDS`` adds the exact planner (its certified bound is kept beside the lower bound).

Examples::

    python benchmarks/bench_generalization.py --split test --per-family 1 --search --polish-control \\
        --json benchmarks/results/generalization_test.json --md benchmarks/results/generalization_test.md
    python benchmarks/bench_generalization.py --split test --per-family 2 --search --polish-control \\
        --long-search 300 --best-known benchmarks/results/best_known.json

``--planners NAME ...`` scores more planners of the registry as the agents are scored (``auto``, the
default planner).

``--agents LABEL=PATH ...`` compares several agents on the same cells (an ablation: planners
``dqn[LABEL]`` and, with ``--search``, ``dqn-search[LABEL]``); the markdown is then their scorecards.
``LABEL=PATH+PATH...`` is the ensemble of those agents (the mean of their Q-values,
:class:`dqn_swap.agents.dqn.policy.QEnsemble`).

``--reuse RESULT.json`` takes the figures of the planners that do not learn (the baselines, the
switches, the fixed rules, ``optimal`` and the polished best baseline) from an earlier result of
this script wherever its cell has the same trace fingerprint and limit, and plans only the agents:
the baselines plan the same on every run, and on the test split's GRU networks ``dynprog`` alone
takes minutes a cell.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import (DEFAULT_AGENT, LIMITS, arm_files, pct, provenance, run_and_publish, slug,  # noqa: E402
                    write_json)
from dqn_swap.agents import planner_names  # noqa: E402

CORPUS = ROOT / "runs" / "corpus"

#: The baselines a cell's best baseline is taken over: every ``baseline`` and ``switch`` of the
#: registry but ``none``, which never fits (every limit here is below the unplanned peak).
SCORED = tuple(n for n in (*planner_names("baseline"), *planner_names("switch")) if n != "none")
#: Plans by fixed rules: candidates for the table of best plans known, not scored as baselines.
SIMPLE = planner_names("simple")
POLISHED = "best baseline polished"
#: The long search: ``dqn-search`` with ``--long-search`` seconds, ``--long-factor`` times its default
#: local-search budget and twice ``--search-k``, its plan then polished until a pass finds nothing
#: (:class:`LongSearch`).
LONG = "dqn-search long"
#: Passes of local search the long search allows (dqn-search's own polish stops after 4).
LONG_ROUNDS = 1000


# --------------------------------------------------------------------------- planning a cell
def figures(trace: Any, plan: Any, limit: int) -> dict[str, Any]:
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import simulate

    res = simulate(trace, plan.actions, limit, get_profile(trace.meta["profile"]))
    return {"feasible": bool(res.feasible), "overhead": float(res.overhead) if res.feasible else None}


def plan_cell(trace: Any, limit: int, planners: dict[str, Any],
              plans: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every planner's figures on one cell: feasible, overhead, ``cpu_seconds`` (``time.process_time``:
    one thread's when run with OMP_NUM_THREADS=1) and wall ``seconds``; ``plans``, if given, receives
    the plans themselves."""
    cell: dict[str, Any] = {}
    for name, planner in planners.items():
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            plan = planner.plan(trace, limit, trace.meta["profile"])
            cell[name] = figures(trace, plan, limit)
            if plans is not None:
                plans[name] = plan
        except Exception as e:  # noqa: BLE001 - a baseline that cannot plan this cell counts as infeasible
            cell[name] = {"feasible": False, "overhead": None, "error": f"{type(e).__name__}: {e}"[:120]}
        cell[name]["cpu_seconds"] = round(time.process_time() - c0, 3)
        cell[name]["seconds"] = round(time.perf_counter() - t0, 3)
    return cell


class LongSearch:
    """:data:`LONG`: ``dqn-search`` with a larger budget, its plan then polished by
    :func:`~dqn_swap.agents.local_search.polish` for up to :data:`LONG_ROUNDS` passes (ours: a search for
    the table of best plans known, not a planner of the papers)."""

    name = LONG

    def __init__(self, agent: str, k: int, seconds: float, factor: int) -> None:
        self.agent, self.k, self.seconds, self.factor = agent, k, seconds, factor

    def settings(self, trace: Any) -> dict[str, Any]:
        from dqn_swap.agents.local_search import default_simulations

        budget = self.factor * default_simulations(trace.n_events)
        return {"planner": "dqn-search", "agent": str(self.agent), "k": self.k, "time_limit": self.seconds,
                "polish_simulations": budget, "then_polished": {"max_rounds": LONG_ROUNDS, "max_simulations": budget}}

    def plan(self, trace: Any, limit: int, profile: Any) -> Any:
        import dataclasses

        from dqn_swap.agents import get_planner
        from dqn_swap.agents.local_search import polish
        from dqn_swap.cost import get_profile
        from dqn_swap.plan import Plan
        from dqn_swap.simulator import Simulator

        s = self.settings(trace)
        plan = get_planner("dqn-search", agent=self.agent, threads=1, k=self.k, time_limit=self.seconds,
                           polish_simulations=s["polish_simulations"]).plan(trace, limit, profile)
        if not plan.figures.get("feasible"):
            return plan
        res = polish(Simulator(trace, limit, get_profile(profile)), plan.actions, max_rounds=LONG_ROUNDS,
                     max_simulations=s["polish_simulations"])
        return dataclasses.replace(plan, actions=Plan.sorted_actions(res.actions), figures=res.result.figures(),
                                   schedule=res.result.schedule)


def polished(trace: Any, limit: int, actions: Any, simulations: int, rounds: int = 4) -> dict[str, Any]:
    """``actions`` (a feasible plan) polished by ``dqn-search``'s local search
    (:func:`dqn_swap.agents.local_search.polish`) with ``simulations`` as its budget and at most
    ``rounds`` passes: its figures, and its ``actions`` (for the caller to take out)."""
    from dqn_swap.agents.local_search import polish
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import Simulator

    c0 = time.process_time()
    res = polish(Simulator(trace, limit, get_profile(trace.meta["profile"])), actions, max_simulations=simulations,
                 max_rounds=rounds)
    return {"feasible": True, "overhead": float(res.result.makespan / trace.compute_time - 1),
            "simulations": res.simulations, "budget": int(simulations), "max_rounds": rounds,
            "seconds": round(res.seconds, 3),
            "cpu_seconds": round(time.process_time() - c0, 3), "actions": tuple(res.actions)}


def polished_best_baseline(trace: Any, limit: int, cell: dict[str, Any], plans: dict[str, Any]) -> dict[str, Any]:
    """The control for local search: the best baseline's plan polished as ``dqn-search`` polishes its own,
    with the budget ``dqn-search`` spends on its two plans, so that what the agent adds beyond local
    search shows."""
    from dqn_swap.agents.local_search import default_simulations

    best = best_baseline(cell)
    if best is None:
        return {"feasible": False, "overhead": None, "from": None, "cpu_seconds": 0.0}
    return {**polished(trace, limit, plans[best].actions, 2 * default_simulations(trace.n_events)), "from": best}


def best_baseline(cell: dict[str, Any]) -> str | None:
    """The baseline (of :data:`SCORED`) with the lowest overhead among those whose plan fits (None: none fits)."""
    feasible = [n for n in SCORED if n in cell and cell[n]["feasible"]]
    return min(feasible, key=lambda n: cell[n]["overhead"]) if feasible else None


def at_or_below_best_baseline(cell: dict[str, Any], planner: str, tolerance: float) -> bool:
    """Whether ``planner``'s plan fits and its overhead is at most the best baseline's plus ``tolerance``
    (true where no baseline fits)."""
    best = best_baseline(cell)
    a = cell[planner]
    return best is None or bool(a["feasible"] and a["overhead"] <= cell[best]["overhead"] + tolerance)


def warm_up(trace: Any, planners: dict[str, Any]) -> None:
    """Plan ``trace`` at 90 % once, untimed, with the fast planners and a short local search, so that
    the compiled kernels (compiled or loaded once per process) are not charged to the first cell."""
    from dqn_swap.agents.local_search import polish
    from dqn_swap.cost import get_profile
    from dqn_swap.simulator import Simulator

    limit = pct(0.9).resolve(trace)
    for name in ("greedy", *(n for n in planners if n.startswith("dqn[") or n == "dqn")):
        plan = planners[name].plan(trace, limit, trace.meta["profile"])
        if plan.figures.get("feasible"):
            polish(Simulator(trace, limit, get_profile(trace.meta["profile"])), plan.actions, max_simulations=20)


# --------------------------------------------------------------------------- the best plans known
def cell_key(model: str, batch_size: int, profile: str, limit: float) -> str:
    """A cell's name in the table of best plans known: ``gen:mlp_mixer:0 b33 v100-pcie3 70%``."""
    return f"{model} b{batch_size} {profile} {round(limit * 100)}%"


def candidates(cell: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every plan of a cell that fits, by label: the planners' and the polished ones'."""
    out = {n: v for n, v in cell.items() if isinstance(v, dict) and v.get("feasible") is True
           and v.get("overhead") is not None}
    for name, v in cell.get("polished baselines", {}).items():
        if v["feasible"]:
            out[f"{name} polished"] = v
    return out


def best_entry(cell: dict[str, Any], trace: Any, settings: dict[str, dict[str, Any]],
               found: dict[str, Any]) -> dict[str, Any]:
    """The table entry this run makes of a cell: its best feasible plan (``makespan`` None where none fits),
    the planner and settings that made it (``settings``, by planner label), the certified lower bound
    (a makespan), and ``found``: the commit and date of the run."""
    plans = candidates(cell)
    name = min(plans, key=lambda n: plans[n]["overhead"]) if plans else None
    T = trace.compute_time
    entry = {"model": cell["network"], "family": cell["family"], "batch_size": cell["batch_size"],
             "profile": cell["profile"], "limit": cell["limit"], "limit_bytes": cell["limit_bytes"],
             "fingerprint": trace.fingerprint, "compute_time": T, "lower_bound": cell["lower_bound"],
             "planner": name, "overhead": None, "makespan": None, "settings": {}}
    if name is not None:
        best = plans[name]
        if "simulations" in best:  # a plan polished by local search: from which planner, with what budget
            how = {"local_search": "dqn_swap.agents.local_search.polish", "from": best.get("from", name.removesuffix(
                " polished")), **{k: best[k] for k in ("simulations", "budget", "max_rounds") if k in best}}
        else:
            how = settings.get(name, {"planner": name})
        entry.update(overhead=best["overhead"], makespan=T * (1 + best["overhead"]), settings=dict(how), **found)
    if cell.get("certified_bound") is not None:
        entry["certified_bound"] = cell["certified_bound"]
    return entry


def best_plan(trace: Any, limit: int, entry: dict[str, Any], actions: Any) -> Any:
    """The plan of a table entry as a plan file holds it (:class:`dqn_swap.plan.Plan`), simulated again:
    its planner the label of the entry, its settings the entry's."""
    from dqn_swap.cost import get_profile
    from dqn_swap.plan import Plan
    from dqn_swap.simulator import simulate
    from machine import relative_paths

    res = simulate(trace, list(actions), limit, get_profile(entry["profile"]))
    return Plan(actions=Plan.sorted_actions(actions), memory_limit=int(limit), trace_fingerprint=trace.fingerprint,
                profile=entry["profile"], planner=str(entry["planner"]),
                settings=relative_paths(dict(entry["settings"])),  # no path of this machine in a result
                figures=res.figures(), schedule=res.schedule)


def resimulated(entry: dict[str, Any], trace: Any) -> dict[str, Any]:
    """A table entry with its plan file's plan simulated again on ``trace`` (the same fingerprint):
    the table keeps plans, and the simulator, the ruler, decides their figures; the entry as it
    was when it has no plan file or is for another trace."""
    from dqn_swap.plan import Plan
    from dqn_swap.simulator import simulate

    path = entry.get("plan_file")
    if not path or entry.get("fingerprint") != trace.fingerprint or not (ROOT / path).is_file():
        return entry
    res = simulate(trace, Plan.load(ROOT / path, trace))
    if not res.feasible:
        return entry  # not in this model: the next feasible plan of a run replaces it
    return {**entry, "makespan": float(res.makespan), "overhead": float(res.overhead)}


def merge_best_known(table: dict[str, dict[str, Any]], fresh: dict[str, dict[str, Any]],
                     report: Any = print) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``table`` with the entries of ``fresh`` merged in, and the keys that changed.

    A cell's entry is replaced only by a feasible plan of a smaller makespan, so the table only
    improves; an entry whose trace fingerprint differs from the fresh entry's was made for another
    trace of that name (a changed recorder or generator): ``report`` gets one line naming it, and the
    fresh entry replaces it.  A kept entry takes the fresh lower bound (the bound is the trace's, not
    the plan's) and the larger certified bound.
    """
    out = dict(table)
    changed: list[str] = []
    for key, new in fresh.items():
        old = out.get(key)
        if old is None:
            out[key] = new
            changed.append(key)
        elif old.get("fingerprint") != new["fingerprint"]:
            report(f"best known: {key}: the table's entry is for trace {old.get('fingerprint')}, the trace recorded "
                   f"now is {new['fingerprint']}; entry replaced")
            out[key] = new
            changed.append(key)
        elif new["makespan"] is not None and (old.get("makespan") is None or new["makespan"] < old["makespan"]):
            out[key] = {**new, "certified_bound": _larger(old.get("certified_bound"), new.get("certified_bound"))}
            changed.append(key)
        else:
            kept = {**old, "lower_bound": new["lower_bound"],
                    "certified_bound": _larger(old.get("certified_bound"), new.get("certified_bound"))}
            if kept["certified_bound"] is None:
                del kept["certified_bound"]
            if kept != old:
                changed.append(key)
            out[key] = kept
        if out[key].get("certified_bound") is None:
            out[key].pop("certified_bound", None)
    return out, changed


def _larger(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def read_best_known(path: str | Path) -> dict[str, dict[str, Any]]:
    """The cells of a table of best plans known (empty if the file does not exist yet)."""
    import json

    p = Path(path)
    if not p.exists():
        return {}
    try:
        d = json.loads(p.read_text())
        cells = d["cells"]
        if not isinstance(cells, dict):
            raise TypeError("cells is not an object")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a table of best plans known ({e})") from None
    return cells


def write_best_known(path: str | Path, cells: dict[str, dict[str, Any]]) -> None:
    write_json({"about": "The best feasible plan known per cell (network, batch size, profile, limit): the planner "
                         "and settings that found it, its makespan and overhead, and the certified lower bound "
                         "(dqn_swap.lower_bound) beside it; merged by benchmarks/bench_generalization.py "
                         "--best-known, an entry replaced only by a faster plan for the same trace fingerprint.",
                "cells": dict(sorted(cells.items()))}, path)


# --------------------------------------------------------------------------- scorecards
def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def scorecard(cells: list[dict[str, Any]], planner: str, tolerance: float) -> dict[str, Any]:
    """``planner``'s scorecard over ``cells``.

    ``wins``: cells at or below the best baseline (:func:`at_or_below_best_baseline`); ``infeasible``:
    cells where its plan does not fit; the geometric means over the cells where it fits of its
    makespan ``T (1 + overhead)`` over the best baseline's (``geomean_vs_best``), over the best plan
    known's (``geomean_vs_best_known``, cells with ``best_known``) and over the certified lower bound
    (``geomean_vs_lower_bound``, cells with ``lower_bound``, the bound a makespan); the CPU seconds it
    took per cell, median and largest; and, where the cells carry the polished best baseline, the cells
    at or below it (+``tolerance``).
    """
    mine = [c for c in cells if planner in c]
    fit = [c for c in mine if c[planner]["feasible"]]
    ms = {id(c): c["compute_time"] * (1 + c[planner]["overhead"]) for c in fit if "compute_time" in c}

    def ratio(c: dict[str, Any], other: float | None) -> float | None:
        return None if other is None or id(c) not in ms else ms[id(c)] / other

    vs_best = [(1 + c[planner]["overhead"]) / (1 + c[b]["overhead"]) for c in fit
               if (b := best_baseline(c)) is not None]
    known = [r for c in fit if (r := ratio(c, (c.get("best_known") or {}).get("makespan"))) is not None]
    bound = [r for c in fit if (r := ratio(c, c.get("lower_bound"))) is not None]
    cpu = [c[planner]["cpu_seconds"] for c in mine if "cpu_seconds" in c[planner]]
    out = {"wins": sum(at_or_below_best_baseline(c, planner, tolerance) for c in mine), "cells": len(mine),
           "infeasible": len(mine) - len(fit), "geomean_vs_best": geomean(vs_best),
           "geomean_vs_best_known": geomean(known), "geomean_vs_lower_bound": geomean(bound),
           "cpu_seconds_median": statistics.median(cpu) if cpu else None, "cpu_seconds_max": max(cpu, default=None)}
    if planner != POLISHED and mine and all(POLISHED in c for c in mine):
        out["at_or_below_polished_best_baseline"] = sum(
            bool(c[planner]["feasible"] and (not c[POLISHED]["feasible"]
                                             or c[planner]["overhead"] <= c[POLISHED]["overhead"] + tolerance))
            for c in mine)
    return out


def trained_families(path: str | Path) -> dict[str, Any]:
    """The families an agent file's training networks belong to, read from its training record: each
    training environment is named ``MODEL@LIMIT`` and the model's family is
    :func:`dqn_swap.models.generator.family_of`'s (generated networks and zoo networks alike).
    ``unknown``: the models whose family cannot be told (a trace without a model name is named by
    its fingerprint; a network of no family).  ``PATH+PATH...`` (an ensemble) and ``PATH|PATH...`` (agent
    files decoded by members): every agent's."""
    from dqn_swap.agents.dqn.agent_file import load_agent
    from dqn_swap.models.generator import family_of

    envs = []
    agent, more = arm_files(path)
    for member in (agent if isinstance(agent, list) else [agent]) + more:
        _, _, obj = load_agent(member)
        envs += list(obj.get("training", {}).get("environments", []))
    families: set[str] = set()
    unknown: set[str] = set()
    for env in envs:
        model = str(env).rsplit("@", 1)[0]
        try:
            family = family_of(model)
        except ValueError:
            family = None
        (families.add(family) if family else unknown.add(model))
    if not envs:
        unknown.add("(no training environments recorded)")
    return {"families": sorted(families), "unknown": sorted(unknown)}


# --------------------------------------------------------------------------- the run
def reusable_cells(path: str | Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The cells of an earlier result of this script, by (trace fingerprint, limit in bytes)."""
    import json

    try:
        cells = json.loads(Path(path).read_text())["cells"]
        return {(c["fingerprint"], int(c["limit_bytes"])): c for c in cells if "fingerprint" in c}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a result of this script to reuse ({type(e).__name__})") from None


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dqn_swap.agents import get_planner
    from dqn_swap.agents.local_search import default_simulations
    from dqn_swap.planners import planner_entry
    from machine import relative_paths
    from dqn_swap.cost import get_profile
    from dqn_swap.lower_bound import lower_bound
    from dqn_swap.models.corpus import record_corpus
    from dqn_swap.models.generator import corpus, family_names
    from dqn_swap.trace import Trace

    specs = corpus(args.split, args.per_family, args.first_seed)
    if args.families:
        unknown = sorted(set(args.families) - set(family_names(args.split)))
        if unknown:
            raise ValueError(f"no family {', '.join(unknown)} in the {args.split} split; its families: "
                             f"{', '.join(family_names(args.split))}")
        specs = [s for s in specs if s.family in args.families]
    paths = record_corpus(specs, CORPUS / args.split)
    planners = {n: get_planner(n) for n in SCORED}
    settings: dict[str, dict[str, Any]] = {}
    search = {"k": args.search_k}
    if args.agents:
        sources = dict(item.split("=", 1) for item in args.agents)
    else:
        sources = {"": args.agent}
    agents = []
    for label, source in sources.items():
        agent, more = arm_files(source)  # decoding by members: more agent files, in their own environments
        suffix = f"[{label}]" if label else ""
        for kind in ("dqn", *(["dqn-search"] if args.search else [])):
            by_members = args.members is not None and (not args.members or label in args.members)
            s = search if kind == "dqn-search" else ({"members": True} if by_members else {})
            if by_members and more:
                s = s | {"more_agents": more}
            planners[kind + suffix] = get_planner(kind, agent=agent, threads=1, **s)
            settings[kind + suffix] = {"planner": kind, "agent": "+".join(agent) if isinstance(agent, list) else agent,
                                       **s}
            agents.append(kind + suffix)
    for name in args.planners:
        entry = planner_entry(name)
        planners[name] = (get_planner(name, agent=args.agent, threads=1) if entry.takes_agent
                          else get_planner(name))
        settings[name] = {"planner": name, **({"agent": str(args.agent)} if entry.takes_agent else {})}
        agents.append(name)
    if args.long_search:
        planners[LONG] = long = LongSearch(args.agent, 2 * args.search_k, args.long_search, args.long_factor)
    if args.optimal:
        planners["optimal"] = get_planner("optimal", agent=args.agent, time_limit=args.optimal)
        settings["optimal"] = {"planner": "optimal", "time_limit": args.optimal}
    if args.best_known:
        planners |= {n: get_planner(n) for n in SIMPLE}
    settings |= {n: {"planner": n} for n in planners if n not in settings}
    reused = reusable_cells(args.reuse) if args.reuse else {}
    table = read_best_known(args.best_known) if args.best_known else {}
    fresh: dict[str, dict[str, Any]] = {}
    found = {k: v for k, v in provenance().items() if k in ("commit", "date")}
    cells = []
    plan_files: dict[str, Any] = {}  # the best plans found by this run, by cell (--best-known-plans)
    if paths:
        warm_up(Trace.load(paths[0]), planners)
    restated: list[str] = []  # entries whose plan the current simulator gives other figures
    for spec, path in zip(specs, paths):
        trace = Trace.load(path)
        for frac in args.limits:
            key = cell_key(spec.name, spec.batch_size, spec.profile, frac)
            if key in table and (entry := resimulated(table[key], trace)) != table[key]:
                table[key] = entry
                restated.append(key)
        if args.long_search:
            settings[LONG] = long.settings(trace)
        for frac in args.limits:
            c0 = time.process_time()
            limit = pct(frac).resolve(trace)
            plans: dict[str, Any] = {}
            before = reused.get((trace.fingerprint, limit), {})
            kept = {n: before[n] for n in (*SCORED, *SIMPLE, "optimal") if n in planners and n in before}
            cell = {"network": spec.name, "family": spec.family, "batch_size": spec.batch_size,
                    "profile": spec.profile, "fingerprint": trace.fingerprint, "n_ops": trace.n_ops, "limit": frac,
                    "limit_bytes": limit, "compute_time": trace.compute_time,
                    "lower_bound": lower_bound(trace, limit, get_profile(spec.profile)),
                    **plan_cell(trace, limit, {n: p for n, p in planners.items() if n not in kept}, plans), **kept}
            if kept:
                cell["reused"] = sorted(kept)
            if "optimal" in plans:
                cell["certified_bound"] = plans["optimal"].settings.get("certified_bound")
            cell["best_baseline"] = best_baseline(cell)
            actions = {n: plan.actions for n, plan in plans.items()}
            if args.polish_control and POLISHED in before and best_baseline(cell) in kept:
                cell[POLISHED] = before[POLISHED]
            elif args.polish_control:
                cell[POLISHED] = polished_best_baseline(trace, limit, cell, plans)
                actions[POLISHED] = cell[POLISHED].pop("actions", ())
            if args.long_search:
                cell["polished baselines"] = {
                    n: polished(trace, limit, plans[n].actions, args.long_factor * default_simulations(trace.n_events),
                                LONG_ROUNDS) for n in SCORED if cell[n]["feasible"]}
                actions |= {f"{n} polished": v.pop("actions") for n, v in cell["polished baselines"].items()}
            key = cell_key(spec.name, spec.batch_size, spec.profile, frac)
            fresh[key] = best_entry(cell, trace, settings, found)
            merged, _ = merge_best_known({key: table[key]} if key in table else {}, {key: fresh[key]}, print)
            new = fresh[key]
            if (args.best_known_plans and new["planner"] in actions and merged[key]["makespan"] == new["makespan"]
                    and merged[key]["planner"] == new["planner"] and (
                        key not in table or table[key].get("makespan") != new["makespan"])):
                plan_files[key] = best_plan(trace, limit, new, actions[new["planner"]])
            cell["best_known"] = {k: merged[key].get(k) for k in ("makespan", "overhead", "planner")}
            cell["cpu_seconds"] = round(time.process_time() - c0, 3)
            cells.append(cell)
            best = cell["best_baseline"]
            best_text = "-" if best is None else "{:.4f} ({})".format(cell[best]["overhead"], best)
            shown = agents + ([LONG] if args.long_search else [])
            agent_text = "  ".join(
                "{} {}{}".format(a, "{:.4f}".format(cell[a]["overhead"]) if cell[a]["feasible"] else "x",
                                 " WIN" if at_or_below_best_baseline(cell, a, args.tolerance) else "")
                for a in shown)
            known = cell["best_known"]
            known_text = "-" if known["overhead"] is None else f"{known['overhead']:.4f} ({known['planner']})"
            print(f"{spec.name:28s} {round(frac * 100):3d}%  best {best_text:24s} {agent_text}  known {known_text}"
                  f"  cell {cell['cpu_seconds']:.1f} CPU s", flush=True)
    if args.best_known:
        table, changed = merge_best_known(table, fresh, lambda line: None)  # reported cell by cell above
        if restated:
            print(f"best known: {len(restated)} entries' plans simulated again to other figures")
        if (changed or restated) and not args.keep_table:
            for key, plan in plan_files.items():
                if math.isclose(table[key]["makespan"], plan.figures["makespan"], rel_tol=1e-9):  # still the best
                    path = Path(args.best_known_plans) / f"{slug(key)}.plan.json"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    plan.save(path, overwrite=True)
                    table[key] = {**table[key], "plan_file": str(path)}
            write_best_known(args.best_known, table)
        print(f"best known: {len(changed)} of {len(fresh)} cells' entries added, improved or replaced"
              + (" (not written: --keep-table)" if args.keep_table and changed else ""))
    scored = [*SCORED, *(["optimal"] if args.optimal else []), *([POLISHED] if args.polish_control else []),
              *agents, *([LONG] if args.long_search else [])]
    evaluated = [*agents, *([POLISHED] if args.polish_control else []), *([LONG] if args.long_search else [])]
    split_families = family_names(args.split)
    trained = {label or "agent": {"path": relative_paths(str(src)), **trained_families(src)}
               for label, src in sources.items()}
    return {"split": args.split, "per_family": args.per_family, "first_seed": args.first_seed,
            "families": args.families,
            "agent": str(args.agent), "search_k": args.search_k,
            "agents": dict(item.split("=", 1) for item in args.agents or []), "tolerance": args.tolerance,
            "limits": args.limits, "polish_control": args.polish_control, "long_search": args.long_search,
            "long_factor": args.long_factor if args.long_search else None, "optimal": args.optimal,
            "best_known": args.best_known, "trained_families": trained, "cells": cells,
            "summary": {a: scorecard(cells, a, args.tolerance) for a in agents},
            "scorecard": {p: scorecard(cells, p, args.tolerance) for p in scored},
            "scorecard_by_family": {f: {p: scorecard([c for c in cells if c["family"] == f], p, args.tolerance)
                                        for p in evaluated} for f in split_families
                                    if any(c["family"] == f for c in cells)}}


# --------------------------------------------------------------------------- markdown
def _num(x: float | None, fmt: str = ".4f") -> str:
    return "-" if x is None else format(x, fmt)


def scorecard_markdown(cards: dict[str, dict[str, Any]], first: str = "planner") -> list[str]:
    """One row per planner: the columns of :func:`scorecard`."""
    lines = [f"| {first} | cells at or below the best baseline | infeasible | makespan / best baseline's | "
             "makespan / best known | makespan / lower bound | CPU s per cell, median | max |",
             "|---|---|---|---|---|---|---|---|"]
    for name, s in cards.items():
        lines.append(f"| {name} | {s['wins']} / {s['cells']} | {s['infeasible']} | {_num(s['geomean_vs_best'])} | "
                     f"{_num(s['geomean_vs_best_known'])} | {_num(s['geomean_vs_lower_bound'])} | "
                     f"{_num(s['cpu_seconds_median'], '.3g')} | {_num(s['cpu_seconds_max'], '.3g')} |")
    return lines


def trained_lines(result: dict[str, Any]) -> list[str]:
    """Which families each evaluated agent was trained on, and which of them the split holds."""
    from dqn_swap.models.generator import family_names

    split = set(family_names(result["split"]))
    lines = []
    for label, t in result.get("trained_families", {}).items():
        seen = sorted(split & set(t["families"]))
        fams = ", ".join(t["families"]) or "no family it can tell"
        unknown = f"; unknown for {', '.join(t['unknown'])}" if t["unknown"] else ""
        lines.append(f"Agent `{label}` (`{t['path']}`) was trained on the families {fams} (its agent file's training "
                     f"environments){unknown}; of the {result['split']} families: {', '.join(seen) or 'none'}.")
    return lines


def ablation_markdown(result: dict[str, Any]) -> str:
    lines = ["| planner | agent | cells at or below the best baseline | infeasible | makespan / best baseline's "
             "(geometric mean) |", "|---|---|---|---|---|"]
    for a, s in result["summary"].items():
        label = a[a.index("[") + 1:-1]
        g = "-" if s["geomean_vs_best"] is None else f"{s['geomean_vs_best']:.4f}"
        source = str(result["agents"][label]).replace("|", "\\|")  # a pipe would end the table's cell
        lines.append(f"| {a} | `{source}` | {s['wins']} / {s['cells']} | {s['infeasible']} | {g} |")
    if "scorecard" in result:
        lines += ["", *scorecard_markdown({a: result["scorecard"][a] for a in result["summary"]}), "",
                  *trained_lines(result)]
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    if result.get("agents"):
        return ablation_markdown(result)
    agents = list(result["summary"])
    first = result["cells"][0] if result["cells"] else {}
    baselines = [n for n in SCORED if n in first]
    control = [POLISHED] if POLISHED in first else []
    long = [LONG] if LONG in first else []
    known = ["best known"] if "best_known" in first else []
    head = ["network", "batch, profile", "limit", *baselines, *control, *agents, *long, *known]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in result["cells"]:
        feasible = [c[n]["overhead"] for n in baselines if c[n]["feasible"]]
        low = min(feasible) if feasible else None

        def fmt(fig: dict[str, Any], bold: bool) -> str:
            if not fig["feasible"]:
                return "×"
            return f"**{fig['overhead']:.4f}**" if bold else f"{fig['overhead']:.4f}"

        row = [c["network"], f"b{c['batch_size']}, {c['profile']}", f"{round(c['limit'] * 100)} %"]
        row += [fmt(c[n], low is not None and c[n]["feasible"] and c[n]["overhead"] <= low + 1e-12) for n in baselines]
        row += [fmt(c[n], False) for n in control]
        row += [fmt(c[a], False) + (" ✓" if at_or_below_best_baseline(c, a, result["tolerance"]) else "")
                for a in [*agents, *long]]
        if known:
            k = c["best_known"]
            row.append("×" if k["overhead"] is None else f"{k['overhead']:.4f} ({k['planner']})")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for a, s in result["summary"].items():
        lines.append(f"`{a}` at or below the best baseline (+{result['tolerance']:g}) in {s['wins']} of {s['cells']} "
                     f"cells of the {result['split']} families" + (
                         f"; at or below the best baseline polished in {s['at_or_below_polished_best_baseline']}."
                         if "at_or_below_polished_best_baseline" in s else "."))
    if "scorecard" in result:
        lines += ["", "Scorecards over the cells (geometric means over the cells where the plan fits; CPU seconds "
                  "of one thread):", "", *scorecard_markdown(result["scorecard"])]
        for family, cards in result["scorecard_by_family"].items():
            lines += ["", *scorecard_markdown(cards, f"`{family}`")]
        lines += ["", *trained_lines(result)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="test", choices=("train", "validation", "test"))
    p.add_argument("--per-family", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--families", nargs="+", metavar="FAMILY", help="only these families of the split (default: all)")
    p.add_argument("--limits", type=float, nargs="+", default=list(LIMITS))
    p.add_argument("--agent", default=str(DEFAULT_AGENT), help="the DQN checkpoint (default: the shipped one)")
    p.add_argument("--agents", nargs="+", metavar="LABEL=PATH",
                   help="compare several agents on the same cells (an ablation) instead of --agent")
    p.add_argument("--search", action="store_true", help="also plan with dqn-search")
    p.add_argument("--planners", nargs="+", default=[], metavar="NAME",
                   help="more planners of the registry to score like the agents (auto, the default planner, say; "
                        "those that read an agent read --agent)")
    p.add_argument("--members", nargs="*", metavar="LABEL",
                   help="these --agents arms (none named: every arm; each must be an ensemble) also decode with "
                        "each member and keep the best plan (DQNPlanner's members=True); such an arm's PATH may "
                        "add agent files after '|', decoded the same way in their own environments (more_agents)")
    p.add_argument("--search-k", type=int, default=4, help="dqn-search's width: actions tried per decision point")
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--polish-control", action="store_true",
                   help="also polish the best baseline's plan by dqn-search's local search, with the budget "
                        "dqn-search spends on its two plans: a control for what the agent adds")
    p.add_argument("--best-known", metavar="PATH",
                   help="the table of best plans known (e.g. benchmarks/results/best_known.json): measure against "
                        "it and merge this run's plans into it")
    p.add_argument("--keep-table", action="store_true", help="read --best-known but do not write it")
    p.add_argument("--best-known-plans", metavar="DIR",
                   help="also save the plan of every entry this run adds or improves, as a plan file in DIR "
                        "(e.g. benchmarks/results/best_known/; the entry names it)")
    p.add_argument("--long-search", type=float, metavar="SECONDS",
                   help=f"add '{LONG}' (dqn-search with this time budget, --long-factor times the local-search "
                        "budget, twice --search-k) and every baseline's plan polished")
    p.add_argument("--long-factor", type=int, default=8,
                   help="the long search's local-search budget over dqn-search's default (default 8)")
    p.add_argument("--optimal", type=float, metavar="SECONDS",
                   help="add the exact planner with this CPU time limit per cell (and its certified bound)")
    p.add_argument("--reuse", metavar="RESULT.json",
                   help="take the baselines' figures from an earlier result of this script where the trace and "
                        "limit are the same, and plan only the agents")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args(argv)
    if args.reuse and args.long_search:
        p.error("--reuse does not go with --long-search, which polishes the baselines' plans")
    if args.agents and (args.long_search or args.optimal):
        p.error("--long-search and --optimal plan with --agent, not --agents")
    for name in ("long_search", "optimal"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            p.error(f"--{name.replace('_', '-')} must be a positive number of seconds, not {v}")
    if args.long_factor < 1:
        p.error(f"--long-factor must be at least 1, not {args.long_factor}")
    if (args.keep_table or args.best_known_plans) and not args.best_known:
        p.error("--keep-table and --best-known-plans need --best-known")
    return run_and_publish("bench_generalization", run, markdown, args)


if __name__ == "__main__":
    sys.exit(main())
