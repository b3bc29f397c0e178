"""Locally adaptive window scheduling (the nnabla out-of-core paper, section 3).

"Out-of-core training for extremely large-scale neural networks with
adaptive window-based scheduling", section 3: functions ``f_1 .. f_n`` run in
topological order; the *variable-sequence* lists, function by function, the
variables each one uses, and the distance between two uses is the bytes of
the variable-sequence between them (Fig. 1).  A *schedule-window* of fixed
size in bytes slides along the variable-sequence.  At ``f_i`` the scheduler
(a) swaps in the variables that enter the window and are on the host,
(b) if that exceeds the memory budget, waits for the oldest scheduled
swap-outs to complete, and (c) schedules a swap-out after ``f_i`` of the
variables ``f_i`` used -- skipping those never used again or used again
within the window (Fig. 2d).  The window size is the single hyperparameter;
the swap-in distance adapts to the memory budget by itself.

Mapping onto our simulator.  Steps (a) and (b) are the simulator's own
prefetch rule -- bring swapped tensors back earliest reuse first, as soon as
they fit under the limit -- so the window only decides (c), *which* uses end
in a swap-out: those of a tensor whose next read lies beyond the window, in
variable-sequence bytes (:func:`use_gaps`).  Our plans hold one action per
tensor, so a tensor is swapped once, after the use that opens its widest
gap; it is swapped exactly when that gap exceeds the window.  The plans
therefore form a nested family -- shrinking the window adds the tensors with
the next-widest gaps -- and the window that the memory budget "requires" is
found by binary search for the widest window whose plan the simulator finds
feasible; a few narrower windows are simulated too, and the feasible plan of
least makespan is kept.  Like nnabla, any variable may be swapped, not only
saved activations: here every tensor the simulator allows (saved
activations and temporaries).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dqn_swap.plan import Action, ActionKind
from dqn_swap.trace import EventKind, Role

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts, smallest_feasible


def variable_sequence_offsets(facts: TraceFacts) -> np.ndarray:
    """``C[k]``: bytes of the variable-sequence before op ``k`` (``n_ops + 1`` values)."""
    tr = facts.trace
    use = tr.event_kind != EventKind.FREE
    pairs = np.unique(np.stack([tr.event_op[use], tr.event_tensor[use]]), axis=1)
    per_op = np.zeros(tr.n_ops, dtype=np.int64)
    np.add.at(per_op, pairs[0], tr.tensor_nbytes[pairs[1]])
    return np.concatenate([[0], np.cumsum(per_op)])


def use_gaps(facts: TraceFacts, can_swap: np.ndarray) -> list[tuple[int, int, int]]:
    """``(gap_bytes, event, tensor)``: each tensor's widest gap between a use and its next use.

    The gap is the bytes of the variable-sequence strictly between the two
    functions (the window paper's distance, Fig. 1); the event is the
    tensor's last event in the function before the gap, where a swap-out
    acts, and only gaps where ``can_swap`` allows a swap count.  Gaps of zero
    bytes (used again by the very next function) are left out: no window,
    however small, swaps there.
    """
    tr = facts.trace
    offsets = variable_sequence_offsets(facts)
    movable = tr.movable | (tr.tensor_role == Role.TEMPORARY)
    out = []
    for t in np.flatnonzero(movable).tolist():
        best: tuple[int, int] | None = None
        for op in np.unique(tr.event_op[facts.events_of(t)]).tolist():
            nxt = facts.next_use_op(t, op)
            if nxt < 0:
                continue
            gap = int(offsets[nxt] - offsets[op + 1])
            event = facts.last_event_at(t, op)
            if gap > 0 and can_swap[event] and (best is None or gap > best[0]):
                best = (gap, event)
        if best is not None:
            out.append((best[0], best[1], t))
    out.sort(key=lambda g: (-g[0], g[1], g[2]))
    return out


class WindowPlanner(BasePlanner):
    """Window-based swap scheduling; the window size is tuned to the memory limit by simulation."""

    name = "window"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"window_bytes": None, "refine": 6}

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        gaps = use_gaps(facts, evaluator.can_swap)
        widths = np.array([g[0] for g in gaps], dtype=np.int64)
        # Window sizes that give distinct plans: each gap value, from the widest down.
        distinct = np.unique(widths)[::-1]
        counts = np.searchsorted(-widths, -distinct, side="right")  # tensors with gap >= value

        def plan_of(j: int) -> ActionSet:
            """Plan ``j``: 0 swaps nothing, ``j >= 1`` the gaps of ``distinct[j - 1]`` bytes or more."""
            n = 0 if j == 0 else int(counts[j - 1])
            return tuple(sorted(Action(e, t, ActionKind.SWAP) for _, e, t in gaps[:n]))

        def window_of(j: int) -> int | None:
            return None if j == 0 else int(distinct[j - 1]) - 1

        fixed = self.settings["window_bytes"]
        if fixed is not None:
            j = int(np.sum(distinct > int(fixed)))
            return plan_of(j), {"window_bytes": int(fixed), "swapped": len(plan_of(j))}
        last = len(distinct)
        first = smallest_feasible(evaluator, plan_of, 0, last + 1)
        tried = [min(first, last)]
        step = 1
        for _ in range(self.settings["refine"]):  # narrower windows: more swaps, maybe fewer stalls
            if first + step > last:
                break
            tried.append(first + step)
            step *= 2
        best = min(tried, key=lambda j: evaluator.rank(plan_of(j)))
        return plan_of(best), {"window_bytes": window_of(best), "swapped": len(plan_of(best)),
                               "widest_feasible_window": window_of(first) if first <= last else None}
