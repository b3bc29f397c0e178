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

With ``demo_improve="polish"`` (expert iteration, ours) the teacher is the whole search: a plan
is polished by local search (:func:`dqn_swap.agents.local_search.polish`) before it is replayed
(:func:`polished_episode`), the best baseline's plan first, then at every round the lookahead's
plan with the current Q and the cell's current demonstration.  Replaying keeps what the
environment can express: it decides where each action happens (the decision point), so a
polished plan's shifted events may replay a little worse; on ten cells of generated networks the
replay kept the polished overhead in seven and lost 0.02-0.09 in the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dqn_swap.env.candidates import NOTHING
from dqn_swap.env.swap_recompute import DynamicState, SwapRecomputeEnv
from dqn_swap.plan import Action, Plan

from .. import get_planner, planner_names
from ..local_search import polish


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


class PlanTeacher:
    """A plan as a teacher: at a state, the plan's actions still valid and not taken there
    (:meth:`open`), and of those the one on the largest tensor (:meth:`action`), which covers the
    excess with the fewest actions."""

    def __init__(self, env: SwapRecomputeEnv, actions: tuple[Action, ...] | list[Action]) -> None:
        self.nodes = action_nodes(env, actions)
        self.size = env.trace.tensor_nbytes[env.graph.tensor[self.nodes]] if len(self.nodes) else np.zeros(0)

    def open(self, state: DynamicState) -> np.ndarray:
        """Which of :attr:`nodes` are valid and not yet taken in ``state`` (a mask)."""
        return np.asarray(state.valid, dtype=bool)[self.nodes] & ~np.asarray(state.chosen, dtype=bool)[self.nodes]

    def action(self, state: DynamicState) -> int | None:
        """The plan's action at ``state``; None when the plan has none left there."""
        open_ = self.open(state)
        return int(self.nodes[open_][np.argmax(self.size[open_])]) if open_.any() else None


def demonstration_episode(env: SwapRecomputeEnv, plan: Plan | list[Action]) -> list[DemoStep]:
    """Replay ``plan`` in ``env`` from a reset, one valid plan action per decision point."""
    teacher = PlanTeacher(env, plan.actions if isinstance(plan, Plan) else plan)
    env.reset(seed=0)
    state = env.state()
    steps: list[DemoStep] = []
    while True:
        node = teacher.action(state)
        if node is None:
            break
        _, reward, terminated, truncated, _ = env.step(node)
        next_state = env.state()
        steps.append(DemoStep(state, node, float(reward), next_state, bool(terminated), bool(truncated)))
        state = next_state
        if terminated or truncated:
            break
    return steps


def replay_nodes(env: SwapRecomputeEnv, nodes: list[int] | np.ndarray) -> tuple[Action, ...]:
    """The actions the environment holds after taking ``nodes`` in order from a reset (a
    demonstration's episode as a plan)."""
    env.reset(seed=0)
    for node in nodes:
        _, _, terminated, truncated, _ = env.step(int(node))
        if terminated or truncated:
            break
    return tuple(env.actions)


def polished_episode(env: SwapRecomputeEnv, actions: tuple[Action, ...] | list[Action], simulations: int
                     ) -> tuple[list[DemoStep], tuple[bool, float], tuple[Action, ...]] | None:
    """``actions`` polished by local search (at most ``simulations`` simulations) and replayed in
    ``env``: the episode, its rank ``(not feasible, overhead)`` and the actions the replay took;
    None where ``actions`` do not fit (local search needs a plan that fits)."""
    if not actions or not env.sim.run(list(actions)).feasible:
        return None
    polished = polish(env.sim, list(actions), max_simulations=int(simulations))
    steps = demonstration_episode(env, list(polished.actions))
    if not steps:
        return None
    res = env.result
    return steps, (not res.feasible, float(res.overhead)), tuple(env.actions)


def corrections(env: SwapRecomputeEnv, teacher: tuple[Action, ...] | list[Action],
                policy: Callable[[SwapRecomputeEnv], int]) -> list[DemoStep]:
    """The student's own states labelled by the teacher (DAgger: Ross, Gordon and Bagnell, "A
    Reduction of Imitation Learning and Structured Prediction to No-Regret Online Learning",
    AISTATS 2011).

    ``policy(env)`` (the student: the greedy agent) plays one episode from a reset.  Wherever it
    takes an action outside the ``teacher``'s plan while the plan still has a valid action left,
    the teacher's action there (the one on the largest tensor, as :func:`demonstration_episode`
    replays) is tried and taken back, and that transition is kept.  A demonstration shows the
    teacher's states only; once the student strays it meets states no demonstration shows, and
    these steps are what it should have done there."""
    plan = PlanTeacher(env, teacher)
    env.reset(seed=0)
    state = env.state()
    out: list[DemoStep] = []
    while True:
        a = int(policy(env))
        label = plan.action(state)
        if label is not None and a not in set(plan.nodes[plan.open(state)].tolist()):
            saved = env.snapshot()
            _, reward, terminated, truncated, _ = env.step(label)
            out.append(DemoStep(state, label, float(reward), env.state(), bool(terminated), bool(truncated)))
            env.restore(saved)
        _, _, terminated, truncated, _ = env.step(a)
        state = env.state()
        if terminated or truncated:
            return out


def best_demonstration(env: SwapRecomputeEnv, planners: tuple[str, ...] | None = None, teacher: Any = None
                       ) -> tuple[list[DemoStep], dict[str, Any]]:
    """The best replayed plan of ``planners`` on ``env``'s cell: every feasible plan is replayed and
    the replay that ends feasible with the least simulated overhead is kept (a replay stops once the
    iteration fits, so it may do better than its plan; actions the environment does not offer are
    left out, so it may also do worse).  ``planners`` defaults to :func:`demonstrators`;
    ``teacher`` (:func:`~dqn_swap.agents.dqn.planner.teacher_planner`) adds its plan, as the planner ``"teacher"``."""
    best: tuple[tuple[bool, float], list[DemoStep], dict[str, Any]] | None = None
    named = [(name, get_planner(name)) for name in (planners if planners is not None else demonstrators())]
    for name, planner in named + ([("teacher", teacher)] if teacher is not None else []):
        plan = planner.plan(env.trace, env.memory_limit, env.profile)
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


def demonstrations(envs: list[SwapRecomputeEnv], planners: tuple[str, ...] | None = None, teacher: Any = None
                   ) -> tuple[list[list[DemoStep]], list[dict[str, Any]]]:
    """Per environment, :func:`best_demonstration`'s episode and what it was."""
    episodes, info = [], []
    for env in envs:
        steps, what = best_demonstration(env, planners, teacher)
        episodes.append(steps)
        info.append(what)
    return episodes, info


__all__ = ["DemoStep", "PlanTeacher", "action_nodes", "best_demonstration", "corrections", "demonstration_episode",
           "demonstrations", "demonstrators", "polished_episode", "replay_nodes"]

