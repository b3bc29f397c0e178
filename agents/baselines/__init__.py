"""Baseline planners from the papers the DQN planner is compared with.

=============  =====================================================================
name           planner (module docstrings cite the paper and list departures)
=============  =====================================================================
none           no actions
window         locally adaptive window scheduling (nnabla out-of-core paper, section 3)
greedy         GREEDY, eager prefix offloading (offloading paper, Theorem 2)
dynprog        DYNPROG, Algorithm 1 with the discretisation of section 5.3 (offloading paper)
vdnn           the vDNN heuristic as the offloading paper defines it (section 6.1)
lru            SuperNeurons-style LRU swapping plus recomputation of cheap layers
tflms          TFLMS swap-out threshold rule, threshold tuned by simulation
checkpoint     Chen et al.'s sqrt(n) checkpointing with memonger's budget search
layrub         Layrub's inter-layer offloading of every activation (sections 3.3, 4.1)
=============  =====================================================================

Every planner has the same interface (:class:`Planner`)::

    planner = get_planner("dynprog", slots=500)
    plan = planner.plan(trace, memory_limit, get_profile("v100-pcie3"))
    plan.figures["feasible"], plan.figures["makespan"]
"""

from __future__ import annotations

from typing import Any, Callable

from .base import BasePlanner, Planner
from .checkpoint import CheckpointPlanner
from .dynprog import DynProgPlanner
from .greedy import GreedyPlanner
from .layrub import LayrubPlanner
from .lru import LruPlanner
from .none import NonePlanner
from .tflms import TflmsPlanner
from .vdnn import VdnnPlanner
from .window import WindowPlanner

#: name -> factory taking the planner's settings as keyword arguments
PLANNERS: dict[str, Callable[..., Planner]] = {
    cls.name: cls
    for cls in (NonePlanner, WindowPlanner, GreedyPlanner, DynProgPlanner, VdnnPlanner, LruPlanner,
                TflmsPlanner, CheckpointPlanner, LayrubPlanner)
}


def get_planner(name: str, **settings: Any) -> Planner:
    """The planner called ``name`` with ``settings``; an unknown name raises ``ValueError``."""
    try:
        factory = PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; choose one of: {', '.join(PLANNERS)}") from None
    return factory(**settings)


__all__ = ["PLANNERS", "BasePlanner", "Planner", "get_planner"]
