"""Demonstrations: the best baseline's plan of a cell, replayed in the environment, for learning
that starts where the heuristics end (deep Q-learning from demonstrations).

Hester et al., "Deep Q-learning from Demonstrations" (AAAI 2018; DQfD): transitions of a
demonstrator are kept in the replay memory for the whole run, the network is pre-trained
on them alone, and on top of the TD loss a *large-margin* supervised loss (their Eq. 2)

.. math::
    J_E(Q) = \\max_{a} \\left[ Q(s, a) + l(a_E, a) \\right] - Q(s, a_E),
    \\qquad l(a_E, a) = \\text{margin} \\cdot [a \\neq a_E],

pushes the demonstrator's action ``a_E`` above every other action by the margin.

Here the demonstrator of a (trace, limit) cell is the baseline whose replayed plan the
simulator times best (:func:`best_demonstration`).  A plan is a set of actions; the environment
asks for one action at a time at its decision points, so :func:`demonstration_episode`
replays the plan: at each decision point, of the plan's actions that are valid there, the
one on the largest tensor (covering the excess with the fewest actions).  The replay
stops when the plan has no valid action left (what remains is the plan's, not the
environment's, business); its transitions carry the environment's own rewards, so they
fit the TD loss as any other.  Departures from DQfD: demonstrations enter each
mini-batch as a fixed fraction (``demo_fraction``) instead of through prioritised
replay's bonus, and no L2 term is added; and (``demo_improve="search"``, ours) a cell's
demonstration is replaced during training by the ``dqn-search`` episode of the agent
itself wherever that plans the cell better (:func:`dqn_swap.agents.dqn.planner.search_episode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dqn_swap.env.candidates import NOTHING
from dqn_swap.env.swap_recompute import DynamicState, SwapRecomputeEnv
from dqn_swap.plan import Action, Plan

from .. import get_planner, planner_names


def demonstrators() -> tuple[str, ...]:
    """The planners demonstrations are drawn from (the best of them per cell): every baseline that
    plans (the registry's kind ``baseline``, less ``none``)."""
    return tuple(name for name in planner_names("baseline") if name != "none")


@dataclass(frozen=True)
class DemoStep:
    """One step of a replayed plan: the environment's transition and the demonstrator's action."""

    state: DynamicState
    action: int
    reward: float
    next_state: DynamicState
    terminated: bool
    truncated: bool


def action_nodes(env: SwapRecomputeEnv, actions: tuple[Action, ...] | list[Action]) -> np.ndarray:
    """The environment's nodes standing for ``actions`` (same tensor and kind); actions without one are left out."""
    g = env.graph
    node_of: dict[tuple[int, int], int] = {}
    for n in np.flatnonzero(g.kind != NOTHING):
        node_of[(int(g.tensor[n]), int(g.kind[n]) - 1)] = int(n)
    nodes = [node_of.get((int(a.tensor), int(a.kind))) for a in actions]
    return np.array(sorted(n for n in nodes if n is not None), dtype=np.int64)


def demonstration_episode(env: SwapRecomputeEnv, plan: Plan | list[Action]) -> list[DemoStep]:
    """Replay ``plan`` in ``env`` from a reset, one valid plan action per decision point."""
    actions = plan.actions if isinstance(plan, Plan) else plan
    nodes = action_nodes(env, actions)
    size = env.trace.tensor_nbytes[env.graph.tensor[nodes]] if len(nodes) else np.zeros(0)
    env.reset(seed=0)
    state = env.state()
    steps: list[DemoStep] = []
    while True:
        open_ = np.asarray(state.valid, dtype=bool)[nodes] & ~np.asarray(state.chosen, dtype=bool)[nodes]
        if not open_.any():
            break
        node = int(nodes[open_][np.argmax(size[open_])])
        _, reward, terminated, truncated, _ = env.step(node)
        next_state = env.state()
        steps.append(DemoStep(state, node, float(reward), next_state, bool(terminated), bool(truncated)))
        state = next_state
        if terminated or truncated:
            break
    return steps


def best_demonstration(env: SwapRecomputeEnv, planners: tuple[str, ...] | None = None
                       ) -> tuple[list[DemoStep], dict[str, Any]]:
    """The best replayed plan of ``planners`` on ``env``'s cell: every feasible plan is replayed and
    the replay that ends feasible with the least simulated overhead is kept (a replay stops once the
    iteration fits, so it may do better than its plan; actions the environment does not offer are
    left out, so it may also do worse).  ``planners`` defaults to :func:`demonstrators`."""
    best: tuple[tuple[bool, float], list[DemoStep], dict[str, Any]] | None = None
    for name in planners if planners is not None else demonstrators():
        plan = get_planner(name).plan(env.trace, env.memory_limit, env.profile)
        if not plan.figures.get("feasible"):
            continue
        steps = demonstration_episode(env, plan)
        res = env.result
        rank = (not res.feasible, float(res.overhead))
        if steps and (best is None or rank < best[0]):
            best = (rank, steps, {"env": getattr(env, "name", ""), "planner": name,
                                  "plan_overhead": float(plan.figures["overhead"]), "steps": len(steps),
                                  "replayed_overhead": float(res.overhead), "replayed_feasible": bool(res.feasible)})
    if best is None:
        return [], {"env": getattr(env, "name", ""), "planner": None, "steps": 0}
    return best[1], best[2]


def demonstrations(envs: list[SwapRecomputeEnv], planners: tuple[str, ...] | None = None
                   ) -> tuple[list[list[DemoStep]], list[dict[str, Any]]]:
    """Per environment, :func:`best_demonstration`'s episode and what it was."""
    episodes, info = [], []
    for env in envs:
        steps, what = best_demonstration(env, planners)
        episodes.append(steps)
        info.append(what)
    return episodes, info


__all__ = ["DemoStep", "action_nodes", "best_demonstration", "demonstration_episode",
           "demonstrations", "demonstrators"]

