"""Every planner of dqn-swap, registered by name: the default (``auto``), the DQN, the baselines of
the papers, the exact planner and the simple rules.

Importing this package registers each planner in the core's registry
(:mod:`dqn_swap.planners`, which defines the contract :class:`~dqn_swap.planners.Planner`);
the table below is the one place that names them, gives each its kind and its one-line summary.
All produce the same :class:`~dqn_swap.plan.Plan` through
``get_planner(name).plan(trace, memory_limit, profile)``.  A planner's module is imported when
the planner is first built, so naming a baseline never loads the learning side (torch).

:func:`get_planner`, :func:`planner_names`, :func:`planner_options` and :func:`planner_help` are the registry's own,
re-exported here so that whoever imports them from this package has every planner registered.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from dqn_swap.planner_options import PlannerOption, positive_seconds, simulation_count
from dqn_swap.planners import (Planner, check_planner_name, get_planner, planner_help, planner_names, planner_options,
                               register)

#: How the ``dqn`` planner reads its Q-values (see :class:`dqn_swap.agents.dqn.planner.DQNPlanner`).
DQN_DECODINGS = ("greedy", "cover", "auto")
#: ``decode="auto"`` uses ``cover`` from this many action nodes up.
AUTO_COVER_NODES = 2000


# The settings the command line offers as flags (dqn_swap.planner_options): one object per flag.
TIME_LIMIT = PlannerOption(
    "time_limit", metavar="SECONDS", parse=positive_seconds, aliases=("--search-seconds",),
    help="seconds the planner may take for one plan; when they run out it returns the best plan found so far. "
         "auto and dqn-search count wall-clock seconds (auto's default grows with the trace, 4 s on ResNet-50 "
         "b64 to at most 25; dqn-search's is 30; their budgets of simulations stop the searches first where they "
         "can, and then the plan is the same on every machine); optimal counts its solver's CPU seconds "
         "(default 600) and reports the plan's certified gap")
DECODE = PlannerOption(
    "decode", choices=DQN_DECODINGS,
    help="how the agent's Q-values are read: greedy (one action, then look again), cover (the best actions "
         "until the bytes missing are covered, then look again; several times faster on large graphs) or auto "
         f"(cover from {AUTO_COVER_NODES} action nodes up, else greedy; the default)")
MEMBERS = PlannerOption(
    "members", nargs="*", metavar="AGENT_FILE", to_settings=lambda files: {"members": True, "more_agents": list(files)},
    help="with an ensemble (--agent ensemble): also plan with each of its agents alone, and with these agent or "
         "ensemble files in their own environments (ensemble_groups, shipped), and keep the plan the simulator "
         "finds fastest (one greedy pass per agent, no search)")
SEARCH_SIMULATIONS = PlannerOption(
    "polish_simulations", flag="--search-simulations", metavar="N", parse=simulation_count,
    to_settings=lambda n: {"polish": n > 0, "polish_simulations": n},
    help="how many simulations the local search may run on each of its two decoded plans (it drops, flips, "
         "shifts or replaces actions while the simulated iteration gets faster, and stops earlier when nothing "
         "helps; default: 250 million simulated events' worth, 57,803 on ResNet-50 b64; 0: no local search)")
#: Each planner's flags (the others have none).
_OPTIONS: dict[str, tuple[PlannerOption, ...]] = {
    "auto": (TIME_LIMIT,), "dqn": (DECODE, MEMBERS), "dqn-search": (TIME_LIMIT, SEARCH_SIMULATIONS),
    "optimal": (TIME_LIMIT,)}


def _lazy(module: str, cls: str, *, agent: str | None = None) -> Callable[..., Planner]:
    """A factory that imports ``module`` (relative to this package) when first called and builds ``cls``;
    with ``agent``, the registry's ``agent`` goes to that parameter of ``cls``."""

    def factory(**settings: Any) -> Planner:
        planner_cls = getattr(importlib.import_module(module, __name__), cls)
        if agent is not None and agent != "agent":
            settings[agent] = settings.pop("agent")
        return planner_cls(**settings)

    factory.__qualname__ = f"{module}.{cls}"
    return factory


# name, kind, module, class, the parameter that takes the agent file (None: reads none), summary
_PLANNERS: tuple[tuple[str, str, str, str, str | None, str], ...] = (
    ("auto", "dqn", ".auto", "AutoPlanner", "agent",
     "the default: the fastest plan of dqn-search and of the quick baselines polished by local search, "
     "in a few seconds"),
    ("dqn", "dqn", ".dqn.planner", "DQNPlanner", "agent_path",
     "the trained structure2vec agent's own plan, greedy in its Q-values (DQN paper)"),
    ("dqn-search", "dqn", ".dqn.planner", "DQNSearchPlanner", "agent_path",
     "the agent with a one-step lookahead on its best actions, polished by local search"),
    ("none", "baseline", ".baselines.none", "NonePlanner", None, "no actions"),
    ("window", "baseline", ".baselines.window", "WindowPlanner", None,
     "locally adaptive window scheduling (nnabla out-of-core paper)"),
    ("greedy", "baseline", ".baselines.greedy", "GreedyPlanner", None,
     "GREEDY eager prefix offloading (offloading paper)"),
    ("dynprog", "baseline", ".baselines.dynprog", "DynProgPlanner", None,
     "DYNPROG dynamic programming over offloads (offloading paper)"),
    ("vdnn", "baseline", ".baselines.vdnn", "VdnnPlanner", None, "the vDNN heuristic"),
    ("lru", "baseline", ".baselines.lru", "LruPlanner", None,
     "SuperNeurons-style LRU swapping plus recomputation of cheap layers"),
    ("tflms", "baseline", ".baselines.tflms", "TflmsPlanner", None,
     "TFLMS swap-out threshold, tuned by simulation"),
    ("sqrt-n", "baseline", ".baselines.sqrt_n", "SqrtNPlanner", None,
     "Chen et al.'s sqrt(n) checkpointing with memonger's budget search, recompute only"),
    ("layrub", "baseline", ".baselines.layrub", "LayrubPlanner", None, "Layrub's offloading of every activation"),
    ("per-block", "switch", ".baselines.per_block", "PerBlockPlanner", None,
     "per-layer activation checkpointing as Hugging Face's gradient_checkpointing_enable() applies it"),
    ("offload-all", "switch", ".baselines.offload_all", "OffloadAllPlanner", None,
     "torchtune's OffloadActivations: offload every saved activation of at least 1 KiB"),
    ("offload-all+per-block", "switch", ".baselines.offload_all", "OffloadAllPerBlockPlanner", None,
     "torchtune's activation offloading together with per-layer checkpointing"),
    ("knapsack", "switch", ".baselines.knapsack", "KnapsackPlanner", None,
     "torch.compile's activation-memory-budget 0/1 knapsack (dp), recompute only"),
    ("optimal", "optimal", ".optimal", "OptimalPlanner", "agent",
     "the exact planner: a mixed-integer program on HiGHS, with a certified bound"),
    ("swap-all", "simple", ".simple", "SwapAllPlanner", None, "swap every activation"),
    ("recompute-all", "simple", ".simple", "RecomputeAllPlanner", None,
     "recompute every activation the simulator allows to"),
    ("greedy-swap", "simple", ".simple", "GreedySwapPlanner", None, "swap the largest activations until the plan fits"),
)

for _name, _kind, _module, _cls, _agent, _summary in _PLANNERS:
    register(_name, _lazy(_module, _cls, agent=_agent), kind=_kind, summary=_summary, takes_agent=_agent is not None,
             options=_OPTIONS.get(_name, ()))
del _name, _kind, _module, _cls, _agent, _summary


__all__ = ["AUTO_COVER_NODES", "DECODE", "DQN_DECODINGS", "MEMBERS", "SEARCH_SIMULATIONS", "TIME_LIMIT",
           "check_planner_name", "get_planner", "planner_help", "planner_names", "planner_options"]
