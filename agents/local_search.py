"""Local search over a finished plan: change its actions while the simulator says it gets faster.

A decoded plan is built one decision point at a time: each action is chosen where the simulated
iteration first exceeds the limit, and none is taken back when later actions make it
unnecessary, or when another action would have cost less once the whole plan is known.
:func:`polish` revisits every action of a feasible plan with four moves,

* **drop** it;
* **flip** it: swap instead of recompute at the same event, or recompute instead of swap;
* **shift** it: the same kind of action on the same tensor at another valid event;
* **replace** it by a valid action on a tensor the plan leaves alone,

and keeps a move when the plan still fits and its simulated makespan goes down (first
improvement, in the plan's order).  A pass tries the first three moves on every action and,
only when none of them improves the plan, the replacements (``|plan| x |valid actions|``
simulations); passes repeat up to ``max_rounds``, until a pass finds nothing, until the plan
reaches the simulator's lower bound (nothing can be faster), or until the budget is spent.  Every
move is judged by the same simulator as the plan, so the result fits and is never slower.

The budget is a number of simulations, so that a plan is the same on every machine and under any
load; :func:`default_simulations` scales it to the trace (a simulation costs time in proportion
to the trace's events), enough for the search to finish on ResNet-50 b64 (it stops after about
30,000 simulations at 30 %).  ``max_seconds`` adds a wall-clock cap for users who prefer one, at
the price of reproducibility.

This is ours, not the DQN paper's: the paper decodes greedily and stops (section 4.9).  It is
the improvement step that follows a constructive heuristic in local search, with the agent's
plan as the construction; the effect is in the README ("Learning plans").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import SimResult, Simulator


#: Events simulated, summed over the simulations, that :func:`default_simulations` allows.
EVENT_BUDGET = 250_000_000


def default_simulations(n_events: int) -> int:
    """The default budget for a trace of ``n_events`` events: ``EVENT_BUDGET / n_events``
    simulations, between 1,000 and 100,000 (ResNet-50 b64, 4,325 events: 57,803; ResNet-1001
    b64, 80,460 events: 3,107)."""
    return int(min(100_000, max(1_000, EVENT_BUDGET // max(int(n_events), 1))))


@dataclass(frozen=True)
class PolishResult:
    """The polished actions, their simulation, and what the search did."""

    actions: tuple[Action, ...]
    result: SimResult
    dropped: int
    flipped: int
    moved: int  # shifted to another event of the same tensor, or replaced by another tensor's action
    simulations: int
    seconds: float


def _try(sim: Simulator, actions: list[Action]) -> SimResult | None:
    try:
        return sim.run(actions)
    except ValueError:  # a move the simulator does not allow (an invalid action, a broken chain)
        return None


def valid_actions_by_tensor(sim: Simulator) -> dict[int, list[Action]]:
    """Every statically valid action of ``sim``'s trace, grouped by tensor (in event order)."""
    tensor_of = sim.trace.event_tensor
    valid = sim.valid_actions()
    out: dict[int, list[Action]] = {}
    for kind, mask in ((ActionKind.SWAP, valid.can_swap), (ActionKind.RECOMPUTE, valid.can_recompute)):
        for e in np.flatnonzero(mask):
            out.setdefault(int(tensor_of[e]), []).append(Action(int(e), int(tensor_of[e]), kind))
    return out


def polish(sim: Simulator, actions: list[Action] | tuple[Action, ...], *, max_rounds: int = 4,
           max_simulations: int | None = None, max_seconds: float | None = None) -> PolishResult:
    """Improve the feasible plan ``actions`` by dropping, flipping, shifting and replacing actions
    (module docstring).

    Args:
        sim: the simulator of the plan's trace, limit and profile.
        actions: a plan that fits under ``sim``'s limit.
        max_rounds: passes over the actions; a pass without an improvement ends the search.
        max_simulations: the budget; None: :func:`default_simulations` of the trace.  The best
            plan so far is returned when it runs out.
        max_seconds: an optional wall-clock cap as well (results then depend on the machine).

    Returns:
        :class:`PolishResult`; its ``result.makespan`` is at most the input plan's.
    """
    t0 = time.perf_counter()
    current = list(actions)
    best = sim.run(current)
    if not best.feasible:
        raise ValueError("polish needs a plan that fits the limit")
    by_tensor = valid_actions_by_tensor(sim)
    counts = {"drop": 0, "flip": 0, "move": 0}
    sims = 0
    budget = default_simulations(sim.trace.n_events) if max_simulations is None else int(max_simulations)
    # No plan is faster than the lower bound (the compute alone, or more): a plan that reaches it is
    # optimal, and the search, which keeps only strictly faster plans, has nothing left to find.
    optimal = sim.lower_bound * (1 + 1e-12)

    def out_of_time() -> bool:
        return (best.makespan <= optimal or sims >= budget
                or (max_seconds is not None and time.perf_counter() - t0 > max_seconds))

    def one_pass(wide: bool) -> bool:
        """One pass over the plan's actions; ``wide``: the replacement moves, else the other three."""
        nonlocal current, best, sims
        improved = False
        for action in list(current):
            if out_of_time():
                break
            if action not in current:
                continue
            rest = [a for a in current if a != action]
            if wide:
                used = {a.tensor for a in rest}
                trials = (("move", b) for t, acts in by_tensor.items() if t not in used and t != action.tensor
                          for b in acts)
            else:
                flip = Action(action.event, action.tensor, ActionKind(1 - int(action.kind)))
                shifts = [("move", b) for b in by_tensor.get(action.tensor, [])
                          if b.kind == action.kind and b != action]
                trials = iter([("drop", None), ("flip", flip), *shifts])
            for move, added in trials:
                trial = rest if added is None else rest + [added]
                if out_of_time():
                    break
                sims += 1
                res = _try(sim, trial)
                if res is not None and res.feasible and res.makespan < best.makespan * (1 - 1e-12):
                    current, best, improved = trial, res, True
                    counts[move] += 1
                    break
        return improved

    for _ in range(max_rounds):
        if out_of_time() or not (one_pass(wide=False) or one_pass(wide=True)):
            break
    return PolishResult(tuple(sorted(current)), best, counts["drop"], counts["flip"], counts["move"], sims,
                        time.perf_counter() - t0)


__all__ = ["EVENT_BUDGET", "PolishResult", "default_simulations", "polish", "valid_actions_by_tensor"]
