"""Every planner of dqn-swap behind one name: the baselines of the papers, the exact planner and the DQN.

All produce the same :class:`~dqn_swap.plan.Plan` through
``get_planner(name).plan(trace, memory_limit, profile)``.  Modules are imported
on demand, so naming a baseline never loads the learning side.
"""

from __future__ import annotations

from typing import Any

BASELINE_NAMES = ("none", "window", "greedy", "dynprog", "vdnn", "lru", "tflms", "checkpoint", "layrub")
DQN_NAMES = ("dqn", "dqn-search")
#: the exact planner (mixed-integer program on HiGHS) and its certified bound
OPTIMAL_NAME = "optimal"
PLANNER_NAMES = (*DQN_NAMES, *BASELINE_NAMES, OPTIMAL_NAME)
#: How the ``dqn`` planner reads its Q-values (see :class:`dqn_swap.agents.dqn.planner.DQNPlanner`).
DQN_DECODINGS = ("greedy", "cover", "auto")
#: ``decode="auto"`` uses ``cover`` from this many action nodes up.
AUTO_COVER_NODES = 2000


def get_planner(name: str, *, agent: str | None = None, **settings: Any):  # noqa: ANN201
    """The planner called ``name``; ``agent`` is the DQN checkpoint (default: the shipped one)."""
    if name in DQN_NAMES:
        from .dqn.planner import get_dqn_planner

        return get_dqn_planner(name, agent, **settings)
    if name in BASELINE_NAMES:
        from .baselines import get_planner as get_baseline

        return get_baseline(name, **settings)
    if name == OPTIMAL_NAME:
        from .optimal import OptimalPlanner

        # the agent is the one the ``dqn`` incumbents plan with
        return OptimalPlanner(**({"agent": agent} if agent is not None else {}), **settings)
    raise ValueError(f"unknown planner {name!r}; choose one of: {', '.join(PLANNER_NAMES)}")


__all__ = ["AUTO_COVER_NODES", "BASELINE_NAMES", "DQN_DECODINGS", "DQN_NAMES", "OPTIMAL_NAME", "PLANNER_NAMES",
           "get_planner"]
