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
trials); passes repeat up to ``max_rounds``, until a pass finds nothing, until the plan
reaches the simulator's lower bound (nothing can be faster), or until the budget is spent.  Every
move kept is judged by the same simulator as the plan, so the result fits and is never slower.

**Most trials are not simulated.**  A plan fits exactly when no op's memory need exceeds the
limit (``need <= limit``, the property in :mod:`dqn_swap.simulator`'s docstring;
:meth:`~dqn_swap.simulator.Simulator.memory_need`), and a swap changes the need by its tensor's
bytes over its window only: from the op after its action (or after the op that holds the tensor
longer, ``Trace.held_op``) to the op before its next use.  So the need of a move that takes a swap
out and puts one in is the plan's need plus one window minus the other, and whether it fits is a
test over one window (:func:`window_of`).  Taking action ``a`` out raises the need where ``a`` was
away; the ops where that exceeds the limit (the *hot* ops) must then all lie in the window of the
action put in, which must free at least the largest excess there -- a test in O(1) per candidate,
exact for swaps and a necessary condition for a recompute (a removal frees its bytes over the same
window at most; its re-runs only add need).  Where a recompute is involved (taking one out, or
putting one in that passes that test), or a swapped tensor is an input of a re-run (its window
then ends at that re-run), the need of the whole trial comes from ``memory_need``, which costs a
fraction of a simulation.  A trial that does not fit is rejected on the need alone; only trials
that fit are simulated, and a move that makes an action equivalent to the one it replaces (same
tensor, kind, op and next use) is not tried.  These shortcuts reject exactly what the simulator
would reject, so the search takes the same path as one that simulates every trial, in fewer
simulations.

The budget is a number of simulations, so that a plan is the same on every machine and under any
load; :func:`default_simulations` scales it to the trace (a simulation costs time in proportion
to the trace's events).  ``patience`` ends a pass after that many simulated trials in a row that
did not improve the plan (the rest of the pass is then skipped; ``None``: never).  ``max_seconds``
adds a wall-clock cap for users who prefer one, at the price of reproducibility.

This is ours, not the DQN paper's: the paper decodes greedily and stops (section 4.9).  It is
the improvement step that follows a constructive heuristic in local search, with the agent's
plan as the construction; the effect is in the README ("Learning plans").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from dqn_swap.plan import Action, ActionKind
from dqn_swap.progress import Progress
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
    """The polished actions, their simulation, and what the search did.

    ``simulations``: trials simulated (the budget's unit); ``need_checks``: trials whose fit was
    decided by a whole-plan :meth:`~dqn_swap.simulator.Simulator.memory_need`; ``rejected``:
    trials rejected as not fitting without a simulation; ``last_improvement``: the simulation
    count when the plan last got faster."""

    actions: tuple[Action, ...]
    result: SimResult
    dropped: int
    flipped: int
    moved: int  # shifted to another event of the same tensor, or replaced by another tensor's action
    simulations: int
    seconds: float
    need_checks: int = 0
    rejected: int = 0
    last_improvement: int = 0
    stopped: str = "converged"


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


def window_of(sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    """Per event ``e``, the ops ``[lo[e], hi[e])`` during which an action at ``e`` keeps its tensor
    off the device when nothing re-runs before its next use: ``lo`` the op after the action's op
    (or after the op holding the tensor longer, ``Trace.held_op``), ``hi`` its next use
    (``sim.index.event_return_op``).  A swap at ``e`` lowers :meth:`Simulator.memory_need` by its
    tensor's bytes over exactly these ops (the simulator's need, "if every swap-out completed
    at once")."""
    trace = sim.trace
    t = trace.event_tensor.astype(np.int64)
    lo = np.maximum(sim.index.event_op, sim.index.tensor_held_op[t]) + 1
    return lo, sim.index.event_return_op.copy()


def add_window(need: np.ndarray, lo: int, hi: int, nbytes: int) -> None:
    """``need`` (in place) with ``nbytes`` kept away over ops ``[lo, hi)`` (``nbytes < 0``: brought
    back), as :meth:`Simulator.memory_need` counts a window (an empty one, ``lo > hi``, counts
    the other way, as its cumulative sum does)."""
    if lo <= hi:
        need[lo:hi] -= nbytes
    else:
        need[hi:lo] += nbytes


class NeedTest:
    """Whether plans one move away from a feasible plan fit, mostly without simulating (module
    docstring).  ``need`` is the plan's :meth:`Simulator.memory_need`; ``recomputed_inputs`` the
    tensors read by its re-runs (a swapped one may come back early for them, so its window is not
    the static one)."""

    def __init__(self, sim: Simulator, lo: np.ndarray, hi: np.ndarray, nbytes: list[int]) -> None:
        self.sim, self.lo, self.hi, self.nbytes = sim, lo, hi, nbytes
        self.limit = sim.memory_limit
        self.checks = 0  # whole-plan memory_need calls
        self.need = np.zeros(0, np.int64)
        self.recomputed_inputs: set[int] = set()

    def reset(self, actions: list[Action], result: SimResult) -> None:
        """The plan is now ``actions``, simulated as ``result``."""
        need = result.memory_need
        self.need = (np.asarray(need, dtype=np.int64) if need is not None
                     else np.asarray(self.sim.memory_need(actions), dtype=np.int64))
        inputs = self.sim.index.op_inputs
        self.recomputed_inputs = {y for p in set(result.recompute_ops) for y in inputs[p]}

    def exact_window(self, action: Action) -> bool:
        """Whether ``action``'s effect on the need is its static window (a swap whose tensor no
        re-run of the plan reads)."""
        return action.kind == ActionKind.SWAP and action.tensor not in self.recomputed_inputs

    def without(self, rest: list[Action], action: Action) -> tuple[int, int, int]:
        """Where the plan without ``action`` (``rest``) exceeds the limit: ``(first hot op, last hot
        op, largest excess)``, the excess ``<= 0`` when it fits."""
        if self.exact_window(action):
            lo, hi = int(self.lo[action.event]), int(self.hi[action.event])
            if lo <= hi:
                over = self.need[lo:hi] + self.nbytes[action.tensor] - self.limit
                hot = np.flatnonzero(over > 0)
                if not len(hot):
                    return 0, -1, 0
                return lo + int(hot[0]), lo + int(hot[-1]), int(over[hot].max())
        self.checks += 1
        need = np.asarray(self.sim.memory_need(rest), dtype=np.int64)
        hot = np.flatnonzero(need > self.limit)
        if not len(hot):
            return 0, -1, 0
        return int(hot[0]), int(hot[-1]), int(need[hot].max() - self.limit)

    def fits(self, trial: list[Action], added: Action | None, hot_lo: int, hot_hi: int, excess: int) -> bool:
        """Whether ``trial`` (the plan without one action, plus ``added``) fits, given what
        :meth:`without` said of the plan without that action."""
        if excess <= 0 and (added is None or self.exact_window(added)):
            return True  # without the action it fits, and a swap only lowers the need
        if added is None:
            return False
        if excess > 0:
            # every hot op must be in the added action's window, which must free the largest excess
            # (exact for a swap with its static window; necessary for anything else)
            lo, hi = int(self.lo[added.event]), int(self.hi[added.event])
            if not (lo <= hot_lo and hot_hi < hi and self.nbytes[added.tensor] >= excess):
                return False
            if self.exact_window(added):
                return True
        self.checks += 1
        try:
            return int(np.max(self.sim.memory_need(trial))) <= self.limit
        except ValueError:  # an action the simulator does not allow (a flip to an invalid recompute)
            return False


def polish(sim: Simulator, actions: list[Action] | tuple[Action, ...], *, max_rounds: int = 4,
           max_simulations: int | None = None, max_seconds: float | None = None, patience: int | None = None,
           progress: Progress | None = None, label: str = "polishing",
           deadline: Callable[[], bool] | None = None, screen: bool = True) -> PolishResult:
    """Improve the feasible plan ``actions`` by dropping, flipping, shifting and replacing actions
    (module docstring).

    Args:
        sim: the simulator of the plan's trace, limit and profile.
        actions: a plan that fits under ``sim``'s limit.
        max_rounds: passes over the actions; a pass without an improvement ends the search.
        max_simulations: the budget; None: :func:`default_simulations` of the trace.  The best
            plan so far is returned when it runs out.
        max_seconds: an optional wall-clock cap as well (results then depend on the machine).
        patience: end a pass after this many simulated trials in a row without an improvement
            (None: never).
        progress: where to report (:mod:`dqn_swap.progress`); ``label`` names this search there.
        deadline: a function that says when the caller's time is up (results then depend on the
            machine).
        screen: reject trials that do not fit on their memory need, unsimulated (False: simulate
            every trial; the same search, for comparisons).

    Returns:
        :class:`PolishResult`; its ``result.makespan`` is at most the input plan's.
    """
    search = _Search(sim, actions, max_simulations, max_seconds, patience, progress, label, deadline, screen)
    for _ in range(max_rounds):
        if search.out_of_time() or not (search.one_pass(wide=False) or search.one_pass(wide=True)):
            break
    else:
        search.stopped = "rounds"
    if progress is not None:
        progress(search.report)
    return search.result()


class _Search:
    """The state of one :func:`polish`: the plan so far and its simulation, the budget spent, and
    why the search stopped."""

    def __init__(self, sim: Simulator, actions: list[Action] | tuple[Action, ...], max_simulations: int | None,
                 max_seconds: float | None, patience: int | None, progress: Progress | None, label: str,
                 deadline: Callable[[], bool] | None, screen: bool) -> None:
        self.t0 = time.perf_counter()
        self.sim, self.max_seconds, self.patience, self.progress, self.label = sim, max_seconds, patience, progress, label
        self.deadline, self.screen = deadline, screen
        self.current = list(actions)
        self.start = self.best = sim.run(self.current)
        if not self.best.feasible:
            raise ValueError("polish needs a plan that fits the limit")
        self.by_tensor = valid_actions_by_tensor(sim)
        self.lo, self.hi = window_of(sim)
        self.test = NeedTest(sim, self.lo, self.hi, sim.trace.tensor_nbytes.astype(np.int64).tolist())
        self.test.reset(self.current, self.best)
        self.op_of = sim.trace.event_op
        self.counts = {"drop": 0, "flip": 0, "move": 0}
        self.sims = self.rejected = self.last_improvement = 0
        self.stopped = "converged"
        self.budget = default_simulations(sim.trace.n_events) if max_simulations is None else int(max_simulations)
        # No plan is faster than the lower bound (the compute alone, or more): a plan that reaches it is
        # optimal, and the search, which keeps only strictly faster plans, has nothing left to find.
        self.optimal = sim.lower_bound * (1 + 1e-12)

    def out_of_time(self) -> bool:
        if self.best.makespan <= self.optimal:
            self.stopped = "lower bound"
        elif self.sims >= self.budget:
            self.stopped = "simulations"
        elif ((self.max_seconds is not None and time.perf_counter() - self.t0 > self.max_seconds)
              or (self.deadline is not None and self.deadline())):
            self.stopped = "time"
        else:
            return False
        return True

    def report(self) -> str:
        gain = self.best.makespan / self.start.makespan - 1
        return (f"{self.label}, {self.sims:,} simulations ({self.rejected:,} trials rejected unsimulated), "
                f"best {self.best.makespan:.4g} s ({100 * gain:+.1f} %)")

    def same(self, a: Action, b: Action) -> bool:
        """Whether ``b`` acts exactly as ``a`` does: same tensor and kind, from the same op to the
        same next use (another event of the same op)."""
        lo, hi = self.lo, self.hi
        return (a.kind == b.kind and self.op_of[a.event] == self.op_of[b.event] and lo[a.event] == lo[b.event]
                and hi[a.event] == hi[b.event])

    def trials(self, action: Action, rest: list[Action], wide: bool) -> Iterator[tuple[str, Action | None]]:
        """The moves tried for ``action``: ``wide``, the replacements by another tensor's actions;
        else dropping it, flipping its kind, and shifting it to another of its tensor's events."""
        if wide:
            used = {a.tensor for a in rest}
            return (("move", b) for t, acts in self.by_tensor.items() if t not in used and t != action.tensor
                    for b in acts)
        flip = Action(action.event, action.tensor, ActionKind(1 - int(action.kind)))
        shifts = [("move", b) for b in self.by_tensor.get(action.tensor, [])
                  if b.kind == action.kind and b != action and not self.same(action, b)]
        return iter([("drop", None), ("flip", flip), *shifts])

    def one_pass(self, wide: bool) -> bool:
        """One pass over the plan's actions; ``wide``: the replacement moves, else the other three."""
        improved = False
        idle = 0  # simulated trials since the last improvement in this pass
        patience = self.patience
        for action in list(self.current):
            if self.out_of_time() or (patience is not None and idle >= patience):
                break
            if action not in self.current:
                continue
            rest = [a for a in self.current if a != action]
            hot_lo, hot_hi, excess = self.test.without(rest, action)
            for move, added in self.trials(action, rest, wide):
                if self.out_of_time() or (patience is not None and idle >= patience):
                    break
                trial = rest if added is None else rest + [added]
                if self.progress is not None:
                    self.progress(self.report)
                if self.screen and not self.test.fits(trial, added, hot_lo, hot_hi, excess):
                    self.rejected += 1
                    continue
                self.sims += 1
                idle += 1
                res = _try(self.sim, trial)
                if res is not None and res.feasible and res.makespan < self.best.makespan * (1 - 1e-12):
                    self.current, self.best, improved = trial, res, True
                    self.test.reset(self.current, self.best)
                    self.counts[move] += 1
                    self.last_improvement, idle = self.sims, 0
                    break
        return improved

    def result(self) -> PolishResult:
        c = self.counts
        return PolishResult(tuple(sorted(self.current)), self.best, c["drop"], c["flip"], c["move"], self.sims,
                            time.perf_counter() - self.t0, self.test.checks, self.rejected, self.last_improvement,
                            self.stopped)


__all__ = ["EVENT_BUDGET", "NeedTest", "PolishResult", "add_window", "default_simulations", "polish",
           "valid_actions_by_tensor", "window_of"]
