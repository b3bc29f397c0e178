"""Baseline planners from the papers the DQN planner is compared with.

Each module's docstring cites its paper and lists where it departs from it:
:mod:`.none` (no actions), :mod:`.window`, :mod:`.greedy`, :mod:`.dynprog`, :mod:`.vdnn`,
:mod:`.lru`, :mod:`.tflms`, :mod:`.sqrt_n` (``sqrt-n``) and :mod:`.layrub`.  Their names
and one-line summaries are in the planner registry (``dqn_swap.agents`` registers them;
``dqn-swap plan --help`` lists them).

Every one follows the planner contract (:class:`dqn_swap.planners.Planner`) and is
registered by name, kind ``baseline``, when :mod:`dqn_swap.agents` is imported::

    from dqn_swap.agents import get_planner
    planner = get_planner("dynprog", slots=500)
    plan = planner.plan(trace, memory_limit, get_profile("v100-pcie3"))
    plan.figures["feasible"], plan.figures["makespan"]
"""

from __future__ import annotations

from .base import BasePlanner
from .dynprog import DynProgPlanner
from .greedy import GreedyPlanner
from .layrub import LayrubPlanner
from .lru import LruPlanner
from .none import NonePlanner
from .sqrt_n import SqrtNPlanner
from .tflms import TflmsPlanner
from .vdnn import VdnnPlanner
from .window import WindowPlanner

__all__ = ["BasePlanner", "DynProgPlanner", "GreedyPlanner", "LayrubPlanner", "LruPlanner",
           "NonePlanner", "SqrtNPlanner", "TflmsPlanner", "VdnnPlanner", "WindowPlanner"]
