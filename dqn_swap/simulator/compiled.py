"""The compiled engine: :func:`dqn_swap.simulator.analysis.analyse` (in
:mod:`.compiled_analysis`) and :func:`dqn_swap.simulator.engine.run_reference` ported line by line
to Numba.

Same model, same decisions, same float operations in the same order, so the same results
bit for bit (``tests/test_simulator_engines.py`` checks it on random traces and plans).  What
changes is the representation:

* per-op lists become CSR tables (``ptr[k]:ptr[k + 1]`` into a flat array), dicts become
  arrays indexed by tensor or op (marks stamped per recompute target group, so nothing is
  cleared between groups);
* the prefetch queue is a binary heap of int64 keys ``next_use * n_tensors + tensor`` (the
  reference's ``(next_use, tensor)`` tuples in the same order), the device-to-host queue a
  FIFO array with a head pointer;
* the reference's closures over ``nonlocal`` state become functions over two small state
  vectors (``S``: int64, ``F``: float64), and its ``_Stuck`` exception a recorded stuck point
  (op, bytes needed and available, a reason code turned into the reference's words by
  :func:`reason_text`) plus a halt flag that unwinds the loop at once.

Functions are compiled once per process, on first use, with ``cache=True`` (a second process
loads the machine code from ``__pycache__``); every call passes the same dtypes (int64,
float64, bool arrays; Python ints, floats and bools), so each compiles to one signature.
"""

from __future__ import annotations

from .numba_cache import ensure_cache_dir

ensure_cache_dir(__file__)  # before Numba reads its settings: a read-only install still caches its kernels

import numba  # noqa: E402
import numpy as np  # noqa: E402

INF = np.inf

# Int state S
MEM, PEAK, PEAK_OP, PENDING, PF_GATE, RUNNING, VERSION, SM_T, SM_V, SM_LEN, LIMIT, BYTES_D2H, BYTES_H2D, \
    MAX_PENDING, HEAP_N, QH, QT, PLOG_N, STUCK, ST_OP, ST_NEEDED, ST_AVAIL, ST_CODE, ST_ARG, HALT, REC_N, \
    IGN_N, GATED, INPT, N_S = range(30)
# Float state F (the clock and the stalls too: what the engine returns); PH_STALL: 3 slots, by phase
PF_TIME, NXT, D2H_FREE, H2D_FREE, ST_TIME, CLOCK, ST_SWAP, ST_PF, ST_REC, PT_TIME, PH_STALL = range(11)
N_F = PH_STALL + 3

# Why an allocation could not fit (the reference's reason strings, :func:`reason_text`).
PREEXISTING, PREFETCHING, RECOMPUTING, OUTPUTS_AND_SCRATCH, OUTPUTS = range(5)


def reason_text(code: int, arg: int, trace) -> str:  # noqa: ANN001
    """The reference engine's words for a stuck point's reason code (``arg``: tensor or op)."""
    if code == PREEXISTING:
        return "the preexisting tensors (parameters, inputs)"
    if code == PREFETCHING:
        return f"prefetching tensor {arg}"
    if code == RECOMPUTING:
        return f"recomputing with {trace.op_label(arg)}"
    if code == OUTPUTS_AND_SCRATCH:
        return "allocating its outputs and scratch"
    return "allocating its outputs"


_jit = numba.njit(cache=True, nogil=True)
# Helpers allocate nothing: compiled without reference counting, a call then costs nanoseconds (with it,
# each array argument costs two atomic operations per call, most of a run's time).
_helper = numba.njit(cache=True, nogil=True, _nrt=False)

# The analysis kernel, ported from dqn_swap.simulator.analysis, is in its own room; the engine reads it from here.
from .compiled_analysis import analyse  # noqa: E402,F401


# ---------------------------------------------------------------------------------- time loop
@_helper
def _heap_push(heap, S, key):
    i = S[HEAP_N]
    S[HEAP_N] = i + 1
    heap[i] = key
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = key


@_helper
def _heap_pop(heap, S):
    top = heap[0]
    n = S[HEAP_N] - 1
    S[HEAP_N] = n
    if n > 0:
        last = heap[n]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and heap[c + 1] < heap[c]:
                c += 1
            if heap[c] >= last:
                break
            heap[i] = heap[c]
            i = c
        heap[i] = last
    return top


@_helper
def _eval_head(S, F, k0, now, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon):
    """Recompute when the head of the prefetch queue may start (admission rule)."""
    td = q_time[S[QH]] if S[QH] < S[QT] else INF
    if S[HEAP_N] > 0:
        key = heap[0]
        n = key // stride
        y_t = key % stride
        t = d2h_end[y_t]
        if t > now:
            # Its swap-out is still running: every D2H completion re-evaluates the head.
            F[PF_TIME] = INF
            S[PF_GATE] = big
            F[NXT] = td
            return
        if S[GATED] and not S[INPT]:
            # No control between points: examined again at the next point at or after k0.
            F[PF_TIME] = INF
            S[PF_GATE] = k0
            F[NXT] = td
            return
        y = nbytes[y_t]
        if n > k0:  # admission rule over ops k0 .. n-1
            thr = S[LIMIT] - S[PENDING] - y
            if S[SM_T] != y_t or S[SM_V] != S[VERSION]:
                # suffix maxima of need over [k0, n), reversed: sm_rev[n-1-j] = max(need[j:n])
                m = need_arr[n - 1]
                sm_rev[0] = m
                for i in range(1, n - k0):
                    v = need_arr[n - 1 - i]
                    if v > m:
                        m = v
                    sm_rev[i] = m
                S[SM_LEN] = n - k0
                S[SM_T] = y_t
                S[SM_V] = S[VERSION]
            if sm_rev[n - 1 - k0] > thr:
                F[PF_TIME] = INF
                F[NXT] = td
                lo = 0
                hi = S[SM_LEN]
                while lo < hi:  # searchsorted(sm_rev, thr, "right")
                    mid = (lo + hi) >> 1
                    if sm_rev[mid] <= thr:
                        lo = mid + 1
                    else:
                        hi = mid
                S[PF_GATE] = n - lo
                return
        if S[MEM] + S[RUNNING] + y > S[LIMIT]:  # must fit now
            F[PF_TIME] = INF
            S[PF_GATE] = k0 + 1
            F[NXT] = td
            return
        if S[GATED]:
            lf = F[H2D_FREE] if duplex or F[H2D_FREE] >= F[D2H_FREE] else F[D2H_FREE]
            if n > k0 and lf > F[PT_TIME] + horizon[k0]:
                # The link is busy past the next point: issued there (or at its use).
                F[PF_TIME] = INF
                S[PF_GATE] = k0 + 1
                F[NXT] = td
                return
            t = now  # issued (allocated) now; its copy waits for the link (_start_head)
        else:
            if t < F[H2D_FREE]:
                t = F[H2D_FREE]
            if not duplex and t < F[D2H_FREE]:
                t = F[D2H_FREE]
            if t < now:
                t = now
        F[PF_TIME] = t
        S[PF_GATE] = big
        F[NXT] = td if td < t else t
    else:
        F[PF_TIME] = INF
        S[PF_GATE] = big
        F[NXT] = td


@_helper
def _start_head(S, F, k0, st, heap, stride, nbytes, tt_h2d, h2d_end, h2d_set, need_arr, plog_t, plog_k, duplex):
    """Issue the head of the prefetch queue at ``st``: allocated now, its H2D copy starts once the
    link is free."""
    key = _heap_pop(heap, S)
    n = key // stride
    y_t = key % stride
    y = nbytes[y_t]
    S[MEM] += y
    if S[MEM] + S[RUNNING] > S[PEAK]:
        S[PEAK] = S[MEM] + S[RUNNING]
        S[PEAK_OP] = k0
    plog_t[S[PLOG_N]] = y_t
    plog_k[S[PLOG_N]] = k0
    S[PLOG_N] += 1
    cs = st
    if cs < F[H2D_FREE]:
        cs = F[H2D_FREE]
    if not duplex and cs < F[D2H_FREE]:
        cs = F[D2H_FREE]
    e = cs + tt_h2d[y_t]
    h2d_end[y_t] = e
    h2d_set[y_t] = True
    F[H2D_FREE] = e
    if not duplex:
        F[D2H_FREE] = e
    S[BYTES_H2D] += y
    if n > k0:
        for j in range(k0, n):
            need_arr[j] += y  # early: counts against every op before its use
        S[VERSION] += 1


@_helper
def _advance(S, F, T, k0, incl, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set,
             need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon):
    """Process copy events before ``T`` (or at ``T`` if ``incl``); ``k0``: running or next op."""
    while True:
        td = q_time[S[QH]] if S[QH] < S[QT] else INF
        if td <= F[PF_TIME]:  # a release first at equal times: it can only help
            if td > T or (td == T and not incl):
                return
            x = q_tensor[S[QH]]
            S[QH] += 1
            s = nbytes[x]
            S[MEM] -= s
            S[PENDING] -= s
            _eval_head(S, F, k0, td, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon)
        else:
            tp = F[PF_TIME]
            if tp > T or (tp == T and not incl):
                return
            if S[MEM] + S[RUNNING] + nbytes[heap[0] % stride] <= S[LIMIT]:
                _start_head(S, F, k0, tp, heap, stride, nbytes, tt_h2d, h2d_end, h2d_set, need_arr, plog_t,
                            plog_k, duplex)
            _eval_head(S, F, k0, tp, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon)


@_helper
def _stuck(S, F, op, needed, available, code, arg, time):
    """Remember the first point where the plan does not fit."""
    if S[STUCK] == 0:
        S[STUCK] = 1
        S[ST_OP] = op
        S[ST_NEEDED] = needed
        S[ST_AVAIL] = available
        S[ST_CODE] = code
        S[ST_ARG] = arg
        F[ST_TIME] = time


@_helper
def first_invalid(ev_tensor, can_swap, can_rec, a_event, a_kind, a_tensor):
    """The position of the first invalid action (the reference's check), -1 when all are valid."""
    n_e = len(ev_tensor)
    for j in range(len(a_event)):
        e, k = a_event[j], a_kind[j]
        if not (0 <= e < n_e and ev_tensor[e] == a_tensor[j]
                and (can_swap[e] if k == 0 else (can_rec[e] if k == 1 else False))):
            return j
    return -1


def pack_tables(ev_op, ev_next, ev_tensor, held, nbytes, alloc, free, mal, scr, fre, phase, op_memory,
                tt_d2h, tt_h2d, can_swap, can_rec) -> tuple:  # noqa: ANN001
    """The static tables as :func:`simulate` takes them, a few 2-d arrays whose rows are the
    tables (one argument per table costs its unboxing on every call): ``(ev_tab, t_tab, op_tab,
    tt, ok)``, rows ``(ev_op, ev_next, ev_tensor)``, ``(held, nbytes, alloc, free)``, ``(mal,
    scr, fre, phase, op_memory)`` (int64), ``(tt_d2h, tt_h2d)`` (float64), ``(can_swap,
    can_rec)`` (bool)."""
    return (np.ascontiguousarray(np.stack([ev_op, ev_next, ev_tensor]), dtype=np.int64),
            np.ascontiguousarray(np.stack([held, nbytes, alloc, free]), dtype=np.int64),
            np.ascontiguousarray(np.stack([mal, scr, fre, phase, op_memory]), dtype=np.int64),
            np.ascontiguousarray(np.stack([tt_d2h, tt_h2d]), dtype=np.float64),
            np.ascontiguousarray(np.stack([can_swap, can_rec]), dtype=np.bool_))


@_jit
def simulate(ev_tab, t_tab, op_tab, tt, ok, in_ptr, in_idx, dur, initial, limit, duplex, overcommit,
             a_event, a_kind, a_tensor, pts, gated, horizon):
    """Check and analyse int64 action arrays and run the time loop of
    :func:`dqn_swap.simulator.engine.run_reference`; the static tables as :func:`pack_tables`
    makes them.

    Returns ``(bad, S, F, need, log)``: ``bad`` the first invalid action (-1: none; nothing
    else is then meaningful), the final state vectors (``F`` holds the clock and the stalls),
    the plan's need, and in ``log`` one after the other the re-run ops in order
    (``S[REC_N]``), the prefetch starts' tensors and ops (``S[PLOG_N]`` each) and the ignored
    actions' positions (``S[IGN_N]``): one array to return instead of four.

    One function on purpose: the reference engine and its compiled port are read side by side, line by line
    (tests/test_simulator_engines.py compares them bit for bit), and the compiled loop keeps its state in
    locals Numba holds in registers; split, neither would read as the other."""
    ev_op, ev_next, ev_tensor = ev_tab[0], ev_tab[1], ev_tab[2]
    held, nbytes, alloc, free = t_tab[0], t_tab[1], t_tab[2], t_tab[3]
    mal, scr, fre, phase, op_memory = op_tab[0], op_tab[1], op_tab[2], op_tab[3], op_tab[4]
    tt_d2h, tt_h2d = tt[0], tt[1]
    can_swap, can_rec = ok[0], ok[1]
    bad = first_invalid(ev_tensor, can_swap, can_rec, a_event, a_kind, a_tensor)
    if bad >= 0:
        e0 = np.zeros(0, dtype=np.int64)
        return bad, np.zeros(N_S, dtype=np.int64), np.zeros(N_F, dtype=np.float64), e0, e0
    an = analyse(ev_op, ev_next, held, nbytes, alloc, free, mal, scr, in_ptr, in_idx, op_memory,
                 a_event, a_kind, a_tensor)
    (iss_ptr, iss_t, iss_swap, wait_ptr, wait_t, grp_n, grp_of_op, grp_step_ptr, step_p, step_release,
     step_leaf_ptr, leaf_t, _made_ptr, _made, _lr_ptr, _lr_y, _lr_p, ignored, next_use, need, n_swap) = an
    n_ops = len(mal)
    n_t = len(nbytes)
    big = n_ops + 1
    stride = n_t
    need_arr = need.copy()  # raised where a prefetch starts early; need stays the plan's
    S = np.zeros(N_S, dtype=np.int64)
    F = np.zeros(N_F, dtype=np.float64)
    heap = np.empty(max(n_swap, 1), dtype=np.int64)
    q_time = np.empty(max(n_swap, 1), dtype=np.float64)
    q_tensor = np.empty(max(n_swap, 1), dtype=np.int64)
    plog_t = np.empty(max(n_swap, 1), dtype=np.int64)
    plog_k = np.empty(max(n_swap, 1), dtype=np.int64)
    d2h_end = np.empty(n_t, dtype=np.float64)
    h2d_end = np.empty(n_t, dtype=np.float64)
    h2d_set = np.zeros(n_t, dtype=np.bool_)
    sm_rev = np.empty(max(n_ops, 1), dtype=np.int64)
    rec_ops = np.empty(max(len(step_p), 1), dtype=np.int64)
    S[MEM] = initial
    S[PEAK] = initial
    S[PF_GATE] = big
    S[SM_T] = -1
    S[SM_V] = -1
    S[LIMIT] = limit
    S[GATED] = 1 if gated else 0
    S[INPT] = 1
    F[PF_TIME] = INF
    F[NXT] = INF
    st_swap = 0.0
    st_pf = 0.0
    st_rec = 0.0
    ph_stall = F[PH_STALL:PH_STALL + 3]

    t = 0.0
    if S[MEM] > S[LIMIT]:
        _stuck(S, F, 0, S[MEM], S[LIMIT], PREEXISTING, 0, 0.0)
        if not overcommit:
            S[HALT] = 1
        else:
            S[LIMIT] += S[MEM] - S[LIMIT]
    for k in range(n_ops):
        if S[HALT]:
            break
        S[INPT] = 1 if (not gated or pts[k] or wait_ptr[k + 1] > wait_ptr[k] or grp_of_op[k] >= 0) else 0
        F[PT_TIME] = t
        if k >= S[PF_GATE] and S[INPT]:
            _eval_head(S, F, k, t, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon)
        if F[NXT] <= t:
            _advance(S, F, t, k, True, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set,
                     need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
        # The op's own swapped inputs first, then its re-runs.
        for j in range(wait_ptr[k], wait_ptr[k + 1]):
            t2 = _wait_prefetch(S, F, wait_t[j], k, t, overcommit, heap, stride, d2h_end, q_time, q_tensor,
                                nbytes, tt_h2d, h2d_end, h2d_set, need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
            if S[HALT]:
                break
            if t2 > t:
                st_pf += t2 - t
                ph_stall[phase[k]] += t2 - t
                t = t2
        if S[HALT]:
            break
        g = grp_of_op[k]
        if g >= 0:
            for s in range(grp_step_ptr[g], grp_step_ptr[g + 1]):
                p = step_p[s]
                d = dur[p]
                amount = mal[p]
                scratch = scr[p]
                for j in range(step_leaf_ptr[s], step_leaf_ptr[s + 1]):
                    t2 = _wait_prefetch(S, F, leaf_t[j], k, t, overcommit, heap, stride, d2h_end, q_time,
                                        q_tensor, nbytes, tt_h2d, h2d_end, h2d_set, need_arr, sm_rev, plog_t,
                                        plog_k, duplex, big, horizon)
                    if S[HALT]:
                        break
                    if t2 > t:
                        st_pf += t2 - t
                        ph_stall[phase[k]] += t2 - t
                        t = t2
                if S[HALT]:
                    break
                if S[MEM] + amount + scratch > S[LIMIT]:
                    t2 = _wait_memory(S, F, amount + scratch, k, t, RECOMPUTING, p, overcommit, heap, stride,
                                      d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set, need_arr,
                                      sm_rev, plog_t, plog_k, duplex, big, horizon)
                    if S[HALT]:
                        break
                    st_swap += t2 - t
                    ph_stall[phase[k]] += t2 - t
                    t = t2
                S[MEM] += amount
                S[RUNNING] = scratch  # the re-run's own scratch, until it ends
                if S[MEM] + scratch > S[PEAK]:
                    S[PEAK] = S[MEM] + scratch
                    S[PEAK_OP] = k
                t2 = t + d
                if F[NXT] < t2:
                    _advance(S, F, t2, k, False, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end,
                             h2d_set, need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
                st_rec += d
                ph_stall[phase[k]] += d
                rec_ops[S[REC_N]] = p
                S[REC_N] += 1
                t = t2
                S[RUNNING] = 0
                S[MEM] -= step_release[s]
                _eval_head(S, F, k, t, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon)
            if S[HALT]:
                break
        if gated and (wait_ptr[k + 1] > wait_ptr[k] or g >= 0) and t > F[PT_TIME]:
            # Its waits and re-runs are over: the horizon counts from here.
            F[PT_TIME] = t
            _eval_head(S, F, k, t, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon)
            if F[NXT] <= t:
                _advance(S, F, t, k, True, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set,
                         need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
        m = S[MEM] + mal[k]
        scratch = scr[k]
        if m + scratch > S[LIMIT]:
            t2 = _wait_memory(S, F, mal[k] + scratch, k, t, OUTPUTS_AND_SCRATCH if scratch else OUTPUTS, 0,
                              overcommit, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end,
                              h2d_set, need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
            if S[HALT]:
                break
            st_swap += t2 - t
            ph_stall[phase[k]] += t2 - t
            t = t2
            m = S[MEM] + mal[k]
        S[MEM] = m
        S[RUNNING] = scratch  # the kernel's scratch, until the op ends
        if m + scratch > S[PEAK]:
            S[PEAK] = m + scratch
            S[PEAK_OP] = k
        te = t + dur[k]
        S[INPT] = 0 if gated else 1  # the op's compute: no control until the next point
        if F[NXT] < te:
            _advance(S, F, te, k, False, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set,
                     need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
        S[RUNNING] = 0
        S[MEM] -= fre[k]
        if iss_ptr[k + 1] > iss_ptr[k]:
            for j in range(iss_ptr[k], iss_ptr[k + 1]):
                x = iss_t[j]
                s = nbytes[x]
                if iss_swap[j]:
                    st = te if te > F[D2H_FREE] else F[D2H_FREE]
                    if not duplex and F[H2D_FREE] > st:
                        st = F[H2D_FREE]
                    e = st + tt_d2h[x]
                    F[D2H_FREE] = e
                    if not duplex:
                        F[H2D_FREE] = e
                    q_time[S[QT]] = e
                    q_tensor[S[QT]] = x
                    S[QT] += 1
                    d2h_end[x] = e
                    S[PENDING] += s
                    if S[PENDING] > S[MAX_PENDING]:
                        S[MAX_PENDING] = S[PENDING]
                    S[BYTES_D2H] += s
                    _heap_push(heap, S, next_use[x] * stride + x)
                else:
                    S[MEM] -= s
            _eval_head(S, F, k + 1, te, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon)
        t = te
    F[CLOCK] = t
    F[ST_SWAP] = st_swap
    F[ST_PF] = st_pf
    F[ST_REC] = st_rec
    n_rec, n_pf, n_ign = S[REC_N], S[PLOG_N], len(ignored)
    S[IGN_N] = n_ign
    log = np.empty(n_rec + 2 * n_pf + n_ign, dtype=np.int64)
    log[:n_rec] = rec_ops[:n_rec]
    log[n_rec:n_rec + n_pf] = plog_t[:n_pf]
    log[n_rec + n_pf:n_rec + 2 * n_pf] = plog_k[:n_pf]
    log[n_rec + 2 * n_pf:] = ignored
    return -1, S, F, need, log


@_helper
def _wait_memory(S, F, amount, k, t, code, arg, overcommit, heap, stride, d2h_end, q_time, q_tensor, nbytes,
                 tt_h2d, h2d_end, h2d_set, need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon):
    """Wait for swap-outs until ``amount`` more bytes fit; returns the time reached."""
    while S[MEM] + amount > S[LIMIT]:
        if S[QH] >= S[QT]:
            _stuck(S, F, k, amount, S[LIMIT] - S[MEM], code, arg, t)
            if not overcommit:
                S[HALT] = 1
                return t
            over = S[MEM] + amount - S[LIMIT]
            if over > 0:
                S[LIMIT] += over
            return t
        td = q_time[S[QH]]
        _advance(S, F, td, k, True, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set,
                 need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
        if td > t:
            t = td
    return t


@_helper
def _wait_prefetch(S, F, y_t, k, t, overcommit, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end,
                   h2d_set, need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon):
    """Wait until swapped tensor ``y_t`` is back on the device; returns the time reached."""
    while not h2d_set[y_t]:
        if F[NXT] == INF:
            h = heap[0] % stride
            needed = nbytes[h]
            available = S[LIMIT] - S[MEM]
            if not overcommit:
                _stuck(S, F, k, needed, available, PREFETCHING, h, t)
                S[HALT] = 1
                return t
            # fetch it now, whatever the admission rule says
            st = t
            if F[H2D_FREE] > st:
                st = F[H2D_FREE]
            if d2h_end[h] > st:
                st = d2h_end[h]
            if not duplex and F[D2H_FREE] > st:
                st = F[D2H_FREE]
            _start_head(S, F, k, st, heap, stride, nbytes, tt_h2d, h2d_end, h2d_set, need_arr, plog_t, plog_k,
                        duplex)
            _eval_head(S, F, k, t, heap, stride, d2h_end, q_time, nbytes, need_arr, sm_rev, duplex, big, horizon)
            _stuck(S, F, k, needed, available, PREFETCHING, h, t)
            over = S[MEM] - S[LIMIT]
            if over > 0:
                S[LIMIT] += over
            continue
        tn = F[NXT]
        _advance(S, F, tn, k, True, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set,
                 need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
        if tn > t:
            t = tn
    e = h2d_end[y_t]
    if e > t:
        if F[NXT] <= e:
            _advance(S, F, e, k, True, heap, stride, d2h_end, q_time, q_tensor, nbytes, tt_h2d, h2d_end, h2d_set,
                     need_arr, sm_rev, plog_t, plog_k, duplex, big, horizon)
        t = e
    return t
