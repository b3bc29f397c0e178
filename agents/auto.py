"""``auto``, the default planner: the best plan the project makes within a planning time a user waits for.

Every entry point plans with it unless told otherwise (the command line, ``autoplan``, the
Hugging Face ``Trainer`` callback and ``run``).  Within one budget of seconds
(:func:`default_seconds`: 4 s on a ResNet-50-sized trace, growing with the trace's events to at
most 25 s) it makes three kinds of candidate and returns the fastest that fits, stopping early
when a plan reaches the simulator's lower bound (no plan is faster):

1. **the quick baselines** (:func:`quick_baselines`): every baseline of the papers and every switch
   users turn on (per-block checkpointing, activation offloading, torch.compile's knapsack) whose
   planning time stays below a second on the trace -- all but ``dynprog``, whose dynamic program takes
   minutes on recurrent graphs, and ``tflms`` on traces of more than :data:`TFLMS_EVENTS` events;
2. **``dqn-search``**: the shipped agent's greedy decoding with a one-step lookahead in the
   simulator, both plans polished by local search (:class:`~dqn_swap.agents.dqn.planner.DQNSearchPlanner`),
   with :data:`SEARCH_SHARE` of the time left, and from the agent file given (``--agent``) if any;
3. **the quick baselines' plans polished** by the same local search (:func:`~dqn_swap.agents.local_search.polish`)
   with the rest of the time: the best one first, then, while time is left, the others in order of
   makespan (their local optima differ; on small graphs the searches end well within the budget).

Every candidate is judged by the same simulator, so the plan returned fits whenever one of them
does, and it is never slower than the best quick baseline (the polish only keeps faster plans).
This is ours, not the DQN paper's: the paper decodes greedily and stops.  The agent alone in one
greedy pass (``dqn``) stays available by name; measured against ``auto`` and the rest in
``docs/learning.md`` ("The default planner").

The budget is a wall-clock cap.  The searches stop on their own budgets of simulations, which do
not depend on the machine, so a plan made within the time is the same on every machine; where the
time runs out first, ``settings["cut_by_time"]`` names the stages cut short and the plan depends on
the machine's speed.

``settings`` of the plan record how it was made: ``chosen`` (the candidate returned: ``dqn-search``,
a baseline's name, or ``"<baseline> polished"``), ``candidates`` (every candidate's overhead, None
where it did not fit), ``time_limit`` (the budget), ``agent`` (None: the shipped one), ``stage_seconds``,
the settings of ``dqn-search``'s plan (``dqn_search``, where it ran) and, for a baseline's plan, that
planner's own name and settings (``from_planner``, ``from_settings``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np

from dqn_swap.cost import DeviceProfile, profile_of
from dqn_swap.limits import plan_bytes
from dqn_swap.plan import Plan
from dqn_swap.planner_options import checked_seconds, renamed_setting
from dqn_swap.planners import get_planner, plan_cost
from dqn_swap.progress import progress
from dqn_swap.simulator import Simulator
from dqn_swap.trace import Trace

from .local_search import default_simulations, polish

#: The baselines and switches ``auto`` runs before searching: all of the registry's but ``dynprog``
#: (its dynamic program takes minutes on recurrent graphs) and ``tflms`` (:data:`TFLMS_EVENTS`).
QUICK_BASELINES = ("window", "greedy", "vdnn", "lru", "sqrt-n", "layrub",
                   "per-block", "offload-all", "offload-all+per-block", "knapsack")
#: ``tflms`` tunes its threshold by simulation (1,500-2,100 simulations, 11-14 CPU-seconds, on
#: ResNet-1001 b64): ``auto`` runs it on traces of at most this many events only (ResNet-50 b64: 4,293).
TFLMS_EVENTS = 20_000
#: The share of the time left after the baselines that ``dqn-search`` may take; the polish of the
#: best baseline gets the rest (and whatever ``dqn-search`` leaves unused).
SEARCH_SHARE = 0.8
#: Events of a ResNet-50 at batch 64 (4,293), where the budget is :data:`BASE_SECONDS`.
BASE_EVENTS = 4_300
BASE_SECONDS = 4.0
MAX_SECONDS = 25.0


def default_seconds(n_events: int) -> float:
    """``auto``'s budget for a trace of ``n_events`` events: :data:`BASE_SECONDS` times
    ``(n_events / BASE_EVENTS) ** 0.6``, between :data:`BASE_SECONDS` and :data:`MAX_SECONDS`
    (ResNet-50 b64: 4 s; a 32-layer Llama at 4,096 tokens, 25,211 events: 11.5 s; ResNet-1001 b64,
    79,794 events: 23 s)."""
    return float(min(MAX_SECONDS, max(BASE_SECONDS, BASE_SECONDS * (max(int(n_events), 1) / BASE_EVENTS) ** 0.6)))


def quick_baselines(n_events: int) -> tuple[str, ...]:
    """The baselines ``auto`` runs on a trace of ``n_events`` events (:data:`QUICK_BASELINES`, and
    ``tflms`` up to :data:`TFLMS_EVENTS` events)."""
    return QUICK_BASELINES + (("tflms",) if n_events <= TFLMS_EVENTS else ())


def _overhead(plan: Plan) -> float | None:
    return round(float(plan.figures["overhead"]), 6) if plan.figures.get("feasible") else None


def _optimal(plan: Plan) -> bool:
    """Whether ``plan`` fits and reaches the simulator's lower bound (no plan is faster)."""
    f = plan.figures
    return bool(f.get("feasible")) and float(f["makespan"]) <= float(f.get("lower_bound", 0.0)) * (1 + 1e-12)


class AutoPlanner:
    """``plan(trace, memory_limit, profile) -> Plan``: the fastest of the quick baselines, ``dqn-search``
    and the baselines polished, within ``time_limit`` (module docstring).

    Args:
        agent: the agent file ``dqn-search`` reads (None: the shipped agent).
        time_limit: the budget in wall-clock seconds for one plan (None: :func:`default_seconds` of
            the trace; ``seconds``, its former name, is still taken, with a ``DeprecationWarning``).
        threads: torch threads for the agent's network (None: torch's setting).

    Raises:
        ValueError: ``time_limit`` is not a positive finite number.

    Example::

        from dqn_swap import get_planner
        plan = get_planner("auto").plan(trace, trace.minimum_memory + (trace.peak_bytes - trace.minimum_memory) // 2)
        plan.settings["chosen"]   # which candidate made it
    """

    name = "auto"

    def __init__(self, agent: str | os.PathLike[str] | None = None, *, time_limit: float | None = None,
                 threads: int | None = None, seconds: float | None = None) -> None:
        if seconds is not None:
            time_limit = renamed_setting("seconds", "time_limit", seconds)
        self.time_limit = checked_seconds("auto", "time_limit", time_limit)
        self.threads = threads
        self.agent = agent
        # Loaded here, as dqn-search loads it (torch and the agent: about 2 s), not in a plan's budget.
        self._search = get_planner("dqn-search", agent=None if agent is None else str(agent), threads=threads)

    def _searcher(self, time_limit: float) -> Any:
        self._search.time_limit = max(float(time_limit), 1e-3)
        return self._search

    def plan(self, trace: Trace, memory_limit: int, profile: str | DeviceProfile | None = None) -> Plan:
        memory_limit = plan_bytes(memory_limit, f"planner {self.name!r}")
        t0 = time.perf_counter()
        budget = self.time_limit if self.time_limit is not None else default_seconds(trace.n_events)
        end = t0 + budget
        prof = profile_of(trace, profile)
        candidates: dict[str, Plan] = {}
        stages: dict[str, float] = {}
        cut: list[str] = []

        def stage(name: str) -> None:
            stages[name] = time.perf_counter() - t0 - sum(stages.values())

        with progress(self.name) as show:
            baselines = quick_baselines(trace.n_events)
            for name in baselines:
                show(f"baseline {name}")
                candidates[name] = get_planner(name).plan(trace, memory_limit, prof)
            stage("baselines")
            fitting = [n for n in baselines if candidates[n].figures.get("feasible")]
            best_baseline = min(fitting, key=lambda n: plan_cost(candidates[n])) if fitting else None
            # A plan at the lower bound is optimal: nothing is searched beyond it.
            done = best_baseline is not None and _optimal(candidates[best_baseline])
            search = None
            if not done:
                show("dqn-search")
                left = max(end - time.perf_counter(), 0.0)
                search = self._searcher(SEARCH_SHARE * left).plan(trace, memory_limit, prof)
                candidates["dqn-search"] = search
                cut += [f"dqn-search {s}" for s in search.settings.get("cut_by_time", [])]
                stage("dqn-search")
                done = _optimal(search)
            if best_baseline is not None and not done:
                # The best baseline's plan first; with the time left, the others in order of makespan (their
                # local optima differ, and on small graphs the searches above end well within the budget).
                sim = Simulator(trace, int(memory_limit), prof)
                seen: set[tuple[Any, ...]] = set()
                for i, name in enumerate(sorted(fitting, key=lambda n: plan_cost(candidates[n]))):
                    start = candidates[name]
                    if tuple(start.actions) in seen:
                        continue
                    if i and time.perf_counter() >= end:
                        cut.append("polishing the other baselines")
                        break
                    seen.add(tuple(start.actions))
                    res = polish(sim, list(start.actions),
                                 max_simulations=(2 if i == 0 else 1) * default_simulations(trace.n_events),
                                 progress=show, label=f"polishing {name}", deadline=lambda: time.perf_counter() >= end)
                    if res.stopped == "time":
                        cut.append(f"{name} polished")
                    candidates[f"{name} polished"] = polished = dataclasses.replace(
                        start, actions=Plan.sorted_actions(res.actions), figures=res.result.figures(),
                        schedule=res.result.schedule,
                        settings=dict(start.settings, polish={"simulations": res.simulations, "stopped": res.stopped,
                                                              "seconds": round(res.seconds, 3)}))
                    if _optimal(polished):
                        break
                stage("polish")
            chosen = min(candidates, key=lambda n: plan_cost(candidates[n]))
            plan = candidates[chosen]
            show.close(lambda: f"done, {chosen}, overhead {plan.figures.get('overhead', np.nan):.4f}")
        settings: dict[str, Any] = {
            "chosen": chosen, "time_limit": budget, "agent": None if self.agent is None else str(self.agent),
            "candidates": {n: _overhead(p) for n, p in candidates.items()}, "cut_by_time": cut,
            "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
            "plan_seconds": round(time.perf_counter() - t0, 3)}
        if search is not None:
            settings["dqn_search"] = {k: v for k, v in search.settings.items() if k != "cut_by_time"}
        if chosen != "dqn-search":
            settings["from_planner"] = plan.planner
            settings["from_settings"] = plan.settings
        return dataclasses.replace(plan, planner=self.name, settings=settings)


__all__ = ["AutoPlanner", "QUICK_BASELINES", "TFLMS_EVENTS", "default_seconds", "quick_baselines"]
