"""The program's candidates: the tensors whose action window covers an op over the limit, each with
the op after which it may leave, the op it is needed back by, and its copy times
(:mod:`.program` states the program over them); and the ops whose memory the program checks first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dqn_swap.simulator import Simulator

MS = 1e3  # seconds -> milliseconds: the program's time unit


@dataclass(frozen=True)
class Candidate:
    """One tensor the program may swap or drop (see the module docstring)."""

    tensor: int
    event: int
    act_op: int  # a_i: the op after which it leaves (its action's op, or the op a holder outside autograd keeps it to)
    next_use: int  # n_i: back (or recomputed) before this op
    nbytes: int
    can_recompute: bool
    t_out: float  # copy-out time, ms
    t_in: float  # copy-back time, ms


def candidates(sim: Simulator, every: bool = False) -> list[Candidate]:
    """The tensors whose action window covers an op over the limit (``every``: all tensors with a
    valid action), in the simulator's order of swap requests (leave op, then event)."""
    over = sim.index.op_memory > sim.memory_limit
    over_cum = np.concatenate(([0], np.cumsum(over)))
    can_swap, can_rec = sim.valid_actions()
    trace = sim.trace
    ev = np.flatnonzero(can_swap)
    out: list[Candidate] = []
    seen: set[int] = set()
    ete, eop, nxt = trace.event_tensor, trace.event_op, sim.index.event_return_op
    nbytes = trace.tensor_nbytes
    held = trace.held_op
    for e in ev[::-1].tolist():  # the last valid event of each tensor
        t = int(ete[e])
        if t in seen:
            continue
        seen.add(t)
        # it leaves when its action's op ends, or when a holder outside autograd lets it go
        a, n = max(int(eop[e]), int(held[t])), int(nxt[e])
        if not every and (n <= a + 1 or over_cum[n] - over_cum[a + 1] == 0):
            continue
        b = int(nbytes[t])
        out.append(Candidate(t, int(e), a, n, b, bool(can_rec[e]),
                             float(sim.profile.transfer_time(b, "d2h")) * MS,
                             float(sim.profile.transfer_time(b, "h2d")) * MS))
    out.sort(key=lambda c: (c.act_op, c.event))  # the simulator's order of swap requests
    return out


def actionable_windows(sim: Simulator) -> list[tuple[int, int, int]]:
    """``(tensor, leave op, next use)`` of every tensor with a valid action (its last valid event)."""
    can_swap, _ = sim.valid_actions()
    trace = sim.trace
    held = trace.held_op
    out: dict[int, tuple[int, int, int]] = {}
    for e in np.flatnonzero(can_swap).tolist():
        t = int(trace.event_tensor[e])
        out[t] = (t, max(int(trace.event_op[e]), int(held[t])), int(sim.index.event_return_op[e]))
    return list(out.values())


def critical_ops(sim: Simulator, cands: Sequence[Candidate]) -> list[int]:
    """Per run of over-limit ops covered by the same candidates, its busiest op (by excess, largest first)."""
    n_ops = sim.trace.n_ops
    cut = np.zeros(n_ops + 1, dtype=bool)
    for c in cands:
        cut[c.act_op + 1] = True
        cut[c.next_use] = True
    over = sim.index.op_memory > sim.memory_limit
    seg = np.cumsum(cut[:n_ops])
    best: dict[int, int] = {}
    mem = sim.index.op_memory
    for k in np.flatnonzero(over).tolist():
        s = int(seg[k])
        if s not in best or mem[k] > mem[best[s]]:
            best[s] = k
    return sorted(best.values(), key=lambda k: -int(mem[k]))


__all__ = ["Candidate", "actionable_windows", "candidates", "critical_ops"]
