"""The reference engine: the time loop of :mod:`dqn_swap.simulator` on Python numbers."""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from .analysis import Analysis
from .result import Infeasibility, SimResult, make_result

if TYPE_CHECKING:
    from .simulator import Simulator


class _Stuck(Exception):
    """Internal: the run cannot continue (becomes an :class:`Infeasibility`)."""

    def __init__(self, op: int, needed: int, available: int, reason: str, time: float) -> None:
        super().__init__(reason)
        self.op, self.needed, self.available, self.reason, self.time = op, needed, available, reason, time


def run_reference(sim: Simulator, prep: Analysis, want_timeline: bool,  # noqa: C901 (one hot loop)
                  overcommit: bool = False) -> SimResult:
    """Simulate an analysed plan: the reference engine, the model of :mod:`dqn_swap.simulator`
    written on Python numbers (one loop over ops that only does work where something happens, a
    few NumPy calls per prefetch for the admission rule).  The compiled engine
    (:mod:`dqn_swap.simulator.compiled`) is its line-by-line port.

    One function on purpose: the reference engine and its compiled port are read side by side, line by line
    (tests/test_simulator_engines.py compares them bit for bit), and the compiled loop keeps its state in
    locals Numba holds in registers; split, neither would read as the other."""
    INF = math.inf
    limit = sim.memory_limit
    L = sim.lists
    nbytes, tt_d2h, tt_h2d = L.nbytes, sim.tt_lists[0], sim.tt_lists[1]
    dur, mal, fre, phase, scr = L.dur, L.mal, L.fre, L.phase, L.scr
    n_ops = sim.index.n_ops
    BIG = n_ops + 1
    duplex = sim.profile.duplex
    # Prefetches start only where the runtime has control (Simulator.points); None: anywhere.
    points = sim.points.tolist() if sim.points is not None else None
    gated = points is not None
    horizon = sim.horizon.tolist() if gated else None
    inpt = True  # at a point: the runtime is in control, before the op's compute starts
    pt_time = 0.0  # when the last point was reached
    need_arr = prep.need.copy()  # raised below where a prefetch starts early; prep.need stays the plan's
    next_use = prep.next_use
    # One list lookup per op: (recompute steps and prefetch waits before it, actions after it).
    todo: list[Any] = [None] * n_ops
    for k, sp in prep.special.items():
        todo[k] = (sp, None)
    for k, iss in prep.issues.items():
        todo[k] = (todo[k][0] if todo[k] is not None else None, iss)
    maxacc = np.maximum.accumulate

    mem = sim.index.initial_bytes
    peak, peak_op = mem, 0
    pending = 0  # bytes whose D2H copy has not completed
    d2h_q: deque[tuple[float, int]] = deque()  # (completion time, tensor), FIFO = time order
    d2h_end: dict[int, float] = {}
    h2d_end: dict[int, float] = {}
    d2h_free = h2d_free = 0.0
    heap: list[tuple[int, int]] = []  # (next use, tensor): prefetch queue
    pf_time = INF  # when the head may start its H2D copy (INF: blocked)
    pf_gate = BIG  # op index at which a blocked head is re-examined
    nxt = INF  # earliest pending copy event: min(next D2H completion, pf_time)
    sm_tensor, sm_version, sm_rev = -1, -1, None
    version = 0  # bumps whenever need_arr changes (a prefetch started early)
    bytes_d2h = bytes_h2d = 0
    st_swap = st_pf = st_rec = 0.0
    ph_stall = [0.0, 0.0, 0.0]
    recompute_ops: list[int] = []
    running = 0  # scratch of the op (or re-run) on the compute stream now
    max_pending = 0  # most bytes in D2H copies at once
    prefetch_log: list[tuple[int, int]] = []  # (tensor, op running or next) per H2D start
    tl_t: list[float] | None = [0.0] if want_timeline else None
    op_starts: list[float] = []  # when each op started (timeline only)
    tl_b: list[int] = [mem]

    def eval_head(k0: int, now: float) -> None:
        """Recompute when the head of the prefetch queue may start (admission rule)."""
        nonlocal pf_time, pf_gate, nxt, sm_tensor, sm_version, sm_rev
        td = d2h_q[0][0] if d2h_q else INF
        if heap:
            n, y_t = heap[0]
            t = d2h_end[y_t]
            if t > now:
                # Its swap-out is still running: nothing to decide before it completes, and
                # every D2H completion re-evaluates the head (saves a scan per new swap).
                pf_time, pf_gate, nxt = INF, BIG, td
                return
            if gated and not inpt:
                # No control between points: examined again at the next point at or after k0.
                pf_time, pf_gate, nxt = INF, k0, td
                return
            y = nbytes[y_t]
            if n > k0:  # admission rule over ops k0 .. n-1
                thr = limit - pending - y
                if sm_tensor != y_t or sm_version != version:
                    # suffix maxima of need over [k0, n), reversed: sm_rev[n-1-j] = max(need[j:n]);
                    # valid for any later k0 while this head and need_arr stay the same.
                    sm_rev = maxacc(need_arr[k0:n][::-1])
                    sm_tensor, sm_version = y_t, version
                if sm_rev[n - 1 - k0] > thr:
                    # blocked until the first op j whose suffix maximum fits (or pending falls)
                    pf_time, nxt = INF, td
                    pf_gate = n - int(sm_rev.searchsorted(thr, "right"))
                    return
            if mem + running + y > limit:  # must fit now (implied by the rule when n > k0)
                pf_time, pf_gate, nxt = INF, k0 + 1, td
                return
            if gated:
                lf = h2d_free if duplex or h2d_free >= d2h_free else d2h_free
                if n > k0 and lf > pt_time + horizon[k0]:
                    # The link is busy past the next point: issued there (or at its use), not queued
                    # now, in an order a later swap-out may want to change.
                    pf_time, pf_gate, nxt = INF, k0 + 1, td
                    return
                t = now  # issued (allocated) now; its copy waits for the link (start_head)
            else:
                if t < h2d_free:
                    t = h2d_free
                if not duplex and t < d2h_free:
                    t = d2h_free
                if t < now:
                    t = now
            pf_time, pf_gate = t, BIG
            nxt = td if td < t else t
        else:
            pf_time, pf_gate, nxt = INF, BIG, td

    def start_head(k0: int, st: float) -> None:
        """Issue the head of the prefetch queue at ``st``: it is allocated now, and its H2D copy starts
        once the link is free (at ``st`` itself unless the run is gated: Simulator.points)."""
        nonlocal mem, peak, peak_op, h2d_free, d2h_free, bytes_h2d, version
        n, y_t = heapq.heappop(heap)
        y = nbytes[y_t]
        mem += y
        if mem + running > peak:
            peak, peak_op = mem + running, k0
        prefetch_log.append((y_t, k0))
        cs = st
        if cs < h2d_free:
            cs = h2d_free
        if not duplex and cs < d2h_free:
            cs = d2h_free
        e = cs + tt_h2d[y_t]
        h2d_end[y_t] = e
        h2d_free = e
        if not duplex:
            d2h_free = e
        bytes_h2d += y
        if n > k0:
            need_arr[k0:n] += y  # early: counts against every op before its use
            version += 1
        if tl_t is not None:
            tl_t.append(st), tl_b.append(mem + running)

    def advance(T: float, k0: int, incl: bool) -> None:
        """Process copy events before ``T`` (or at ``T`` if ``incl``); ``k0``: running or next op."""
        nonlocal mem, pending
        while True:
            td = d2h_q[0][0] if d2h_q else INF
            if td <= pf_time:  # a release first at equal times: it can only help
                if td > T or (td == T and not incl):
                    return
                x = d2h_q.popleft()[1]
                s = nbytes[x]
                mem -= s
                pending -= s
                if tl_t is not None:
                    tl_t.append(td), tl_b.append(mem + running)
                eval_head(k0, td)
            else:
                tp = pf_time
                if tp > T or (tp == T and not incl):
                    return
                if mem + running + nbytes[heap[0][1]] <= limit:
                    start_head(k0, tp)
                eval_head(k0, tp)

    first_stuck: list[_Stuck] = []

    def stuck_at(stuck: _Stuck, over: int) -> None:
        """Overcommit mode: remember the first point where the plan does not fit, and from
        then on simulate as if the device had ``over`` more bytes (never less than used)."""
        nonlocal limit
        if not first_stuck:
            first_stuck.append(stuck)
        if over > 0:
            limit += over

    def force_head(k: int, now: float) -> None:
        """Overcommit mode: start the head of the prefetch queue now, whatever the memory
        (the caller then raises the limit to what is allocated)."""
        st = max(now, h2d_free, d2h_end[heap[0][1]])
        if not duplex and d2h_free > st:
            st = d2h_free
        start_head(k, st)
        eval_head(k, now)

    def wait_memory(amount: int, k: int, t: float, what: str) -> float:
        """Wait for swap-outs until ``amount`` more bytes fit; returns the time reached."""
        while mem + amount > limit:
            if not d2h_q:
                stuck = _Stuck(k, amount, limit - mem, what, t)
                if not overcommit:
                    raise stuck
                stuck_at(stuck, mem + amount - limit)
                return t
            td = d2h_q[0][0]
            advance(td, k, True)
            if td > t:
                t = td
        return t

    def wait_prefetch(y_t: int, k: int, t: float) -> float:
        """Wait until swapped tensor ``y_t`` is back on the device; returns the time reached."""
        while y_t not in h2d_end:
            if nxt == INF:
                h = heap[0][1]
                stuck = _Stuck(k, nbytes[h], limit - mem, f"prefetching tensor {h}", t)
                if not overcommit:
                    raise stuck
                force_head(k, t)  # fetch it now, whatever the admission rule says
                stuck_at(stuck, mem - limit)
                continue
            tn = nxt
            advance(tn, k, True)
            if tn > t:
                t = tn
        e = h2d_end[y_t]
        if e > t:
            if nxt <= e:
                advance(e, k, True)
            t = e
        return t

    # The compute clock: t += duration op by op is bit-identical to trace.op_start (a sequential
    # cumsum) when nothing stalls, so a plan without stalls has makespan == compute_time exactly.
    t = 0.0
    try:
        if mem > limit:
            stuck = _Stuck(0, mem, limit, "the preexisting tensors (parameters, inputs)", 0.0)
            if not overcommit:
                raise stuck
            stuck_at(stuck, mem - limit)
        for k in range(n_ops):
            here = todo[k]
            inpt = not gated or points[k] or (here is not None and here[0] is not None)
            pt_time = t
            if k >= pf_gate and inpt:
                eval_head(k, t)
            if nxt <= t:
                advance(t, k, True)
            sp = here[0] if here is not None else None
            if sp is not None:
                # The op's own swapped inputs first: what its re-runs find resident is then what
                # the memory need (``need[k]``) counts, so feasibility stays exactly need <= limit.
                for y_t in sp[1]:
                    t2 = wait_prefetch(y_t, k, t)
                    if t2 > t:
                        st_pf += t2 - t
                        ph_stall[phase[k]] += t2 - t
                        t = t2
                for p, d, amount, scratch, release, leaves in sp[0]:
                    for y_t in leaves:
                        t2 = wait_prefetch(y_t, k, t)
                        if t2 > t:
                            st_pf += t2 - t
                            ph_stall[phase[k]] += t2 - t
                            t = t2
                    if mem + amount + scratch > limit:
                        t2 = wait_memory(amount + scratch, k, t, f"recomputing with {sim.trace.op_label(p)}")
                        st_swap += t2 - t
                        ph_stall[phase[k]] += t2 - t
                        t = t2
                    mem += amount
                    running = scratch  # the re-run's own scratch, until it ends
                    if mem + scratch > peak:
                        peak, peak_op = mem + scratch, k
                    if tl_t is not None:
                        tl_t.append(t), tl_b.append(mem + running)
                    t2 = t + d
                    if nxt < t2:
                        advance(t2, k, False)
                    st_rec += d
                    ph_stall[phase[k]] += d
                    recompute_ops.append(p)
                    t = t2
                    running = 0
                    mem -= release
                    if tl_t is not None:
                        tl_t.append(t), tl_b.append(mem)
                    eval_head(k, t)
            if gated and sp is not None and t > pt_time:
                # Its waits and re-runs are over: the runtime, at the node's next unpack, issues
                # what the link can take before the next point (its horizon counts from here).
                pt_time = t
                eval_head(k, t)
                if nxt <= t:
                    advance(t, k, True)
            m = mem + mal[k]
            scratch = scr[k]
            if m + scratch > limit:
                t2 = wait_memory(mal[k] + scratch, k, t,
                                 "allocating its outputs and scratch" if scratch else "allocating its outputs")
                st_swap += t2 - t
                ph_stall[phase[k]] += t2 - t
                t = t2
                m = mem + mal[k]
            mem = m
            running = scratch  # the kernel's scratch, until the op ends
            if m + scratch > peak:
                peak, peak_op = m + scratch, k
            te = t + dur[k]
            inpt = not gated  # the op's compute: no control until the next point
            if tl_t is not None:
                tl_t.append(t), tl_b.append(mem + running)
                op_starts.append(t)
            if nxt < te:
                advance(te, k, False)
            running = 0
            mem -= fre[k]
            iss = here[1] if here is not None else None
            if iss is not None:
                for x, is_swap in iss:
                    s = nbytes[x]
                    if is_swap:
                        st = te if te > d2h_free else d2h_free
                        if not duplex and h2d_free > st:
                            st = h2d_free
                        e = st + tt_d2h[x]
                        d2h_free = e
                        if not duplex:
                            h2d_free = e
                        d2h_q.append((e, x))
                        d2h_end[x] = e
                        pending += s
                        if pending > max_pending:
                            max_pending = pending
                        bytes_d2h += s
                        heapq.heappush(heap, (next_use[x], x))
                    else:
                        mem -= s
                eval_head(k + 1, te)
            t = te
            if tl_t is not None:
                tl_t.append(te), tl_b.append(mem)
    except _Stuck as stuck:
        return _result(sim, False, stuck.time, st_swap, st_pf, st_rec, ph_stall, recompute_ops,
                            bytes_d2h, bytes_h2d, peak, peak_op, prep,
                            Infeasibility(stuck.op, int(stuck.needed), int(stuck.available), stuck.reason),
                            tl_t, tl_b, prefetch_log=prefetch_log, max_pending=max_pending, op_starts=op_starts,
                            d2h_end=d2h_end)
    makespan = sim.compute_time + (t - L.oend[-1]) if n_ops else 0.0
    if first_stuck:  # overcommit mode: the whole iteration, but it did not fit
        stuck = first_stuck[0]
        return _result(sim, False, makespan, st_swap, st_pf, st_rec, ph_stall, recompute_ops,
                            bytes_d2h, bytes_h2d, peak, peak_op, prep,
                            Infeasibility(stuck.op, int(stuck.needed), int(stuck.available), stuck.reason),
                            tl_t, tl_b, whole=True, prefetch_log=prefetch_log, max_pending=max_pending, op_starts=op_starts,
                            d2h_end=d2h_end)
    return _result(sim, True, makespan, st_swap, st_pf, st_rec, ph_stall, recompute_ops,
                        bytes_d2h, bytes_h2d, peak, peak_op, prep, None, tl_t, tl_b,
                        prefetch_log=prefetch_log, max_pending=max_pending, op_starts=op_starts, d2h_end=d2h_end)



def _result(sim: Simulator, feasible: bool, makespan: float, st_swap: float, st_pf: float, st_rec: float,
            ph_stall: list[float], recompute_ops: list[int], bytes_d2h: int, bytes_h2d: int,
            peak: int, peak_op: int, prep: Analysis, infeasible: Infeasibility | None,
            tl_t: list[float] | None, tl_b: list[int], whole: bool = False,
            prefetch_log: list[tuple[int, int]] | None = None, max_pending: int = 0,
            op_starts: list[float] | None = None, d2h_end: dict[int, float] | None = None) -> SimResult:
    timeline = op_start = None
    if tl_t is not None:
        times, values = np.asarray(tl_t, dtype=np.float64), np.asarray(tl_b, dtype=np.int64)
        keep = np.ones(len(values), dtype=bool)
        keep[1:-1] = values[1:-1] != values[:-2]  # drop points that change nothing; keep the end
        timeline = (times[keep], values[keep])
        op_start = np.asarray(op_starts, dtype=np.float64)
    r = make_result(feasible, whole, makespan, sim.compute_time, st_swap, st_pf, st_rec, ph_stall,
                    bytes_d2h, bytes_h2d, peak, peak_op, sim.memory_limit, sim.lower_bound, infeasible,
                    timeline, op_start, tuple(prep.ignored), tuple(recompute_ops), prep.need,
                    (prefetch_log or (), prep.sequences, max_pending, sim.lists.alloc))
    if tl_t is not None and d2h_end is not None:
        r.__dict__["swap_out_end"] = dict(d2h_end)
    return r
