"""DYNPROG: the offloading paper's dynamic programme (Algorithm 1) with its discretisation.

Beaumont, Eyraud-Dubois and Shilova, "Optimal GPU-CPU offloading strategies
for DNN training" (Euro-Par 2020):

* Section 5 relaxes the problem so that a transfer may be interrupted but an
  activation is offloaded entirely or not at all.  For ordered, no-wait
  schedules, the idle time caused by the offloading decisions of
  ``x_0 .. x_{i-1}`` only depends on four numbers, ``M_{F_i}`` (device memory
  at the end of ``F_{i-1}``), ``Delta_{F_i}`` (offload backlog, or minus the
  idle link time), ``M_{B_i}`` and ``Delta_{B_i}`` (the same for the backward
  phase, seen from its end), with the recurrences (1)-(8); the idle time
  between the phases is (9)-(10).  Algorithm 1 keeps, for every reachable
  ``(M_F, Delta_F, Delta_B)``, the least idle time, and backtracks the
  decisions of the best final state.
* Section 5.3.2 discretises memory into ``S`` slots of ``M_GPU / S`` bytes
  (``S = 500``): ``ex`` and ``y`` are rounded up, the partial sums of
  ``u * beta`` rounded down, and the partial sums of ``|x_i|`` rounded up
  ("optimistic" rounding, which rounds some sizes down).  If the chosen
  activations do not give a feasible schedule, "the discretized value
  which is below, but closest to" its true size is increased by one slot
  and the programme runs again; we read this as the rounded-down size whose
  raise brings it closest to its true size, i.e. the one most below it.

We apply it to the chain of :mod:`.chain` and output swap actions for the
chosen activations, each acting at the activation's last forward use; the
simulator then runs the transfers no-wait and in order, as the paper's
DYNPROG does.  ``beta`` is the profile's slower copy direction; the model's
single link (assumption (B)) is kept even for duplex profiles, and the
per-copy latency is ignored (the paper's transfers cost ``|x| / beta``).

Departures:

* In our chain ``F_i`` no longer reads ``x_i`` (``x_i`` becomes free to
  offload when forward is done with it), so when ``x_i`` is offloaded, ``F_i``
  may also wait for ``x_i``'s own transfer: the memory test of Algorithm 1
  subtracts ``Delta_F^+ + |x_i|`` instead of ``Delta_F^+`` for that branch
  (the waiting time is equation (1) either way).  ``ex_i + |x_{i+1}|`` is the
  chain's ``need``, which counts ``x_{i+1}`` only while it is alive, and
  ``R_j`` of (9)-(10) is ``need_j - sum_{i > j} |x_i|`` accordingly.
* Feasibility is decided by our simulator, not by the chain model.  When a
  round is infeasible we raise ``2**round`` rounded-down sizes at once (the
  paper raises one per round), which bounds the rounds by ``log2 L``.
* When no rounded-down size is left and the simulator still refuses the
  plan -- the chain model misses costs the simulator has -- the programme's
  memory budget is lowered by the shortfall the simulator reports and the
  programme solved again (at most ``budget_rounds`` times).
* The hash tables are vectorised: each step keeps, per distinct
  ``(M_F, Delta_F, Delta_B)``, the state of least idle time.  Among equal
  idle times the fewest transfers win (our copies pay a latency the model
  omits), then the fewest bytes offloaded.
* The paper does not say which schedule to return when several final
  states reach the least total idle time; this is common (the model often
  predicts no idle time at all at generous limits).  We simulate up to
  ``ties`` of them and keep the best.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dqn_swap.plan import ActionKind

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts
from .chain import Chain, build_chain


@dataclass(frozen=True)
class Discrete:
    """A chain in memory slots; times as ``u * beta`` in slots (the paper's section 5.3.2)."""

    x: np.ndarray
    x_true: np.ndarray  # exact sizes in slots (floats), to know which were rounded down
    u_f: np.ndarray
    u_b: np.ndarray
    need_f: np.ndarray
    need_b: np.ndarray
    capacity: int

    @classmethod
    def of(cls, chain: Chain, memory: int, beta: float, slots: int) -> "Discrete":
        scale = slots / memory

        def partial_sums(values: np.ndarray, rounding: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
            """Values whose partial sums are the rounded partial sums of ``values``."""
            return np.diff(rounding(np.concatenate([[0.0], np.cumsum(values)]))).astype(np.int64)

        x_true = chain.x * scale
        return cls(x=partial_sums(x_true, np.ceil), x_true=x_true,
                   u_f=partial_sums(chain.u_f * beta * scale, np.floor),
                   u_b=partial_sums(chain.u_b * beta * scale, np.floor),
                   need_f=np.ceil(chain.need_f * scale).astype(np.int64),
                   need_b=np.ceil(chain.need_b * scale).astype(np.int64), capacity=slots)

    def raised(self, count: int) -> "Discrete | None":
        """The same chain with the ``count`` most rounded-down sizes raised by one slot."""
        deficit = self.x_true - self.x
        below = np.flatnonzero(deficit > 1e-9)
        if not len(below):
            return None
        pick = below[np.argsort(-deficit[below], kind="stable")[:count]]
        x = self.x.copy()
        x[pick] += 1
        return Discrete(x=x, x_true=self.x_true, u_f=self.u_f, u_b=self.u_b, need_f=self.need_f,
                        need_b=self.need_b, capacity=self.capacity)


def solve(d: Discrete, ties: int = 1) -> tuple[list[np.ndarray], int] | None:
    """Algorithm 1: offload decisions (bool per ``x_0 .. x_L``) of least total idle time.

    Returns the decisions of up to ``ties`` final states that reach the least
    total idle time (best tie-break first) and that idle time in slots (time
    times ``beta``), or ``None`` when no ordered schedule fits the capacity.
    """
    length = len(d.x) - 2
    cap = d.capacity
    # State arrays: M_F, Delta_F, Delta_B, idle and a tie-break among equal idle times: fewer
    # transfers (each costs a latency the model omits), then fewer slots offloaded.
    per_copy = int(d.x.sum()) + 1
    mf = np.array([d.x[0]], dtype=np.int64)
    df = np.zeros(1, dtype=np.int64)
    db = np.zeros(1, dtype=np.int64)
    idle = np.zeros(1, dtype=np.int64)
    off = np.zeros(1, dtype=np.int64)
    parents: list[np.ndarray] = []
    chose: list[np.ndarray] = []
    for i in range(length + 1):
        xi = int(d.x[i])
        dfp, dbp = np.maximum(df, 0), np.maximum(db, 0)
        mb = dbp + mf - dfp  # M_{B_i} = |y_i| + Delta_B^+ + M_F - Delta_F^+ (|y| is in need_b)
        over_f = mf + d.need_f[i] - cap  # M_F + ex + |x_{i+1}| - M_GPU
        over_b = mb + d.need_b[i] - cap
        fits_b = over_b - dbp <= 0
        eps_f, eps_b = np.maximum(0, over_f), np.maximum(0, over_b)  # (1), (6)
        t_f, t_b = eps_f + d.u_f[i], eps_b + d.u_b[i]
        step_idle = idle + eps_f + eps_b
        new = []
        keep = np.flatnonzero((over_f - dfp <= 0) & fits_b)  # x_i kept: (4), (5), (8)
        if len(keep):
            new.append((mf[keep] - np.minimum(dfp[keep], t_f[keep]), df[keep] - t_f[keep],
                        db[keep] - t_b[keep], step_idle[keep], off[keep], keep,
                        np.zeros(len(keep), dtype=bool)))
        if i >= 1 and xi > 0:  # x_i offloaded: (2), (3), (7); x_0 is the input, never offloaded
            # F_i does not read x_i in our chain (module docstring of .chain), so it may wait
            # for x_i's own transfer as well as for the backlog.
            go = np.flatnonzero((over_f - dfp - xi <= 0) & fits_b)
            if len(go):
                new.append((mf[go] - np.minimum(dfp[go] + xi, t_f[go]), dfp[go] + xi - t_f[go],
                            xi + np.maximum(0, db[go] - t_b[go]), step_idle[go], off[go] + per_copy + xi, go,
                            np.ones(len(go), dtype=bool)))
        if not new:
            return None
        mf, df, db, idle, off, parent, choice = (np.concatenate(c) for c in zip(*new))
        mf = mf + int(d.x[i + 1])
        # Keep the least idle (then least offloaded) state per (M_F, Delta_F, Delta_B).
        sel = _best_per_state(mf, df, db, idle, off)
        mf, df, db, idle, off, parent, choice = (a[sel] for a in (mf, df, db, idle, off, parent, choice))
        parents.append(parent)
        chose.append(choice)
    total = idle + _gap_idle(d, mf, df, db)
    order = np.lexsort((off, total))
    least = int(total[order[0]])
    out = []
    for k in order[:ties]:
        if total[k] != least:
            break
        decisions = np.zeros(length + 1, dtype=bool)
        for i in range(length, -1, -1):  # backtrack
            decisions[i] = chose[i][k]
            k = parents[i][k]
        out.append(decisions)
    return out, least


def _best_per_state(mf: np.ndarray, df: np.ndarray, db: np.ndarray, idle: np.ndarray,
                    off: np.ndarray) -> np.ndarray:
    """Indices of the least ``(idle, off)`` entry of every distinct ``(mf, df, db)`` (the hash tables)."""
    lows = [int(a.min()) for a in (mf, df, db, idle, off)]
    spans = [int(a.max()) - lo + 1 for a, lo in zip((mf, df, db, idle, off), lows)]
    if np.prod([float(x) for x in spans]) < 2.0**62:  # pack into one int64 key: one sort
        key = np.zeros(len(mf), dtype=np.int64)
        for a, lo, span in zip((mf, df, db, idle, off), lows, spans):
            key = key * span + (a - lo)
        order = np.argsort(key, kind="stable")
        state = key[order] // (spans[3] * spans[4])
        first = np.ones(len(order), dtype=bool)
        first[1:] = state[1:] != state[:-1]
        return order[first]
    order = np.lexsort((off, idle, db, df, mf))
    first = np.ones(len(order), dtype=bool)
    first[1:] = (np.diff(mf[order]) != 0) | (np.diff(df[order]) != 0) | (np.diff(db[order]) != 0)
    return order[first]


def _gap_idle(d: Discrete, mf: np.ndarray, df: np.ndarray, db: np.ndarray) -> np.ndarray:
    """``epsilon_G``, the idle time between ``F_L`` and ``B_L`` (equations (9) and (10)), in slots."""
    length = len(d.x) - 2
    cap = d.capacity
    # later[j] = sum_{i > j} |x_i| (the paper's sum over i > j + 1, plus x_{j+1}, which need_* holds)
    later = np.cumsum(d.x[::-1])[::-1][np.arange(length + 1) + 1]
    gap = np.zeros(len(mf), dtype=np.int64)
    both = (df > 0) & (db > 0)
    gap[both] = df[both] + db[both]
    for delta, avail_arr, u, r, mem in (
            (df, db, d.u_b, d.need_b - later, mf),  # (9): offloads still running, no prefetch due yet
            (db, df, d.u_f, d.need_f - later, mf + np.maximum(db, 0))):  # (10): prefetch during forward
        case = (delta > 0) & (avail_arr <= 0)
        if not case.any():
            continue
        avail = -avail_arr[case]
        # U_j = sum_{i=j+1}^{L} u_i is non-increasing in j; the steps run within Av are j >= j0.
        u_after = np.concatenate([np.cumsum(u[::-1])[::-1][1:], [0]])
        term = r - u_after
        suffix_max = np.maximum.accumulate(term[::-1])[::-1]
        j0 = length + 1 - np.searchsorted(u_after[::-1], avail, side="left")
        within = np.where(j0 <= length, suffix_max[np.minimum(j0, length)], np.iinfo(np.int64).min // 4)
        gap[case] = np.maximum.reduce([np.zeros(len(avail), dtype=np.int64), delta[case] - avail,
                                       within + mem[case] - cap])
    return gap


class DynProgPlanner(BasePlanner):
    """DYNPROG (offloading paper, Algorithm 1 and section 5.3): see the module docstring."""

    name = "dynprog"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"slots": 500, "budget_rounds": 4, "ties": 16}

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        chain = build_chain(facts)
        profile = evaluator.profile
        beta = min(profile.d2h_bandwidth, profile.h2d_bandwidth)
        slots = int(self.settings["slots"])
        budget = evaluator.memory_limit
        tried: list[ActionSet] = []
        info: dict[str, Any] = {"dp_budget": budget, "dp_idle_seconds": None, "dp_rounds": 0}
        for _ in range(int(self.settings["budget_rounds"]) + 1):
            disc: Discrete | None = Discrete.of(chain, budget, beta, slots)
            raise_count = 1
            while disc is not None:
                solved = solve(disc, int(self.settings["ties"]))
                info["dp_rounds"] += 1
                if solved is None:  # the chain model has no schedule at this budget
                    return self._fallback(facts, evaluator, tried), info
                tied, idle = solved
                candidates = [facts.activation_actions(chain.members[dec[1:]], ActionKind.SWAP) for dec in tied]
                tried += candidates
                info.update(dp_budget=budget, dp_idle_seconds=idle * budget / slots / beta, dp_ties=len(tied))
                actions = evaluator.best(candidates)
                result = evaluator.run(actions)
                if result.feasible:
                    return actions, info
                disc = disc.raised(raise_count)
                raise_count *= 2
            assert result.infeasible is not None
            budget -= max(int(result.infeasible.needed - result.infeasible.available), budget // slots)
            if budget <= 0:
                break
        return self._fallback(facts, evaluator, tried), info

    @staticmethod
    def _fallback(facts: TraceFacts, evaluator: Evaluator, tried: list[ActionSet]) -> ActionSet:
        """No feasible schedule found: the closest miss, or offloading everything if none was tried."""
        if not tried:
            tried.append(facts.activation_actions(range(facts.n_activations), ActionKind.SWAP))
        return evaluator.best(tried)
