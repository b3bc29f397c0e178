"""The compiled analysis of a plan: :func:`dqn_swap.simulator.analysis.analyse` ported line by line to
Numba (the representation is :mod:`.compiled`'s: CSR tables, arrays indexed by tensor or op), so
that it gives the same tables bit for bit; ``tests/test_simulator_engines.py`` checks it.

Compiled once per process, on first use, with ``cache=True``, as the engine's kernels are.
"""

from __future__ import annotations

from .numba_cache import ensure_cache_dir

ensure_cache_dir(__file__)  # before Numba reads its settings: a read-only install still caches its kernels

import numba  # noqa: E402
import numpy as np  # noqa: E402

_jit = numba.njit(cache=True, nogil=True)


@_jit
def analyse(ev_op, ev_next, held, nbytes, alloc, free, mal, scr, in_ptr, in_idx, op_memory,
            a_event, a_kind, a_tensor):
    """:func:`dqn_swap.simulator.analysis.analyse` on validated int64 action arrays.

    Returns the issues (CSR by op: tensor, is_swap), the prefetch waits (CSR by op, tensors
    ascending), the recompute groups (target op, steps as CSR: producer, bytes released,
    swapped leaves; the tensors made and the transient inputs' last readers, for the
    schedule), the ignored actions (positions, in event order), next use per tensor and need.

    One function on purpose: the reference engine and its compiled port are read side by side, line by line
    (tests/test_simulator_engines.py compares them bit for bit), and the compiled loop keeps its state in
    locals Numba holds in registers; split, neither would read as the other."""
    n_ops = len(mal)
    n_t = len(nbytes)
    n_a = len(a_event)
    order = np.argsort(a_event * 2 + a_kind, kind="mergesort")
    acted = np.zeros(n_t, dtype=np.bool_)
    is_removed = np.zeros(n_t, dtype=np.bool_)
    act_op = np.empty(n_t, dtype=np.int64)
    act_next = np.empty(n_t, dtype=np.int64)
    next_use = np.empty(n_t, dtype=np.int64)
    kept_t = np.empty(n_a, dtype=np.int64)
    ignored = np.empty(n_a, dtype=np.int64)
    n_kept = 0
    n_ign = 0
    n_swap = 0
    n_rem = 0
    for j in range(n_a):
        a = order[j]
        e, k, t = a_event[a], a_kind[a], a_tensor[a]
        if acted[t]:
            ignored[n_ign] = a
            n_ign += 1
            continue
        acted[t] = True
        i = ev_op[e]
        if held[t] > i:
            i = held[t]
        act_op[t] = i
        act_next[t] = ev_next[e]
        if k == 1:
            is_removed[t] = True
            n_rem += 1
        else:
            next_use[t] = ev_next[e]
            n_swap += 1
        kept_t[n_kept] = t
        n_kept += 1
    # Issues by op, in event order within an op (counting sort, stable).
    iss_ptr = np.zeros(n_ops + 1, dtype=np.int64)
    for j in range(n_kept):
        iss_ptr[act_op[kept_t[j]] + 1] += 1
    for k in range(n_ops):
        iss_ptr[k + 1] += iss_ptr[k]
    fill = iss_ptr[:-1].copy()
    iss_t = np.empty(n_kept, dtype=np.int64)
    iss_swap = np.empty(n_kept, dtype=np.bool_)
    for j in range(n_kept):
        t = kept_t[j]
        o = act_op[t]
        iss_t[fill[o]] = t
        iss_swap[fill[o]] = not is_removed[t]
        fill[o] += 1

    # Recompute groups: the removed tensors by target op n (their trace next use).
    rem_t = np.empty(n_rem, dtype=np.int64)
    r = 0
    for j in range(n_kept):
        if is_removed[kept_t[j]]:
            rem_t[r] = kept_t[j]
            r += 1
    rem_key = np.empty(n_rem, dtype=np.int64)
    for j in range(n_rem):
        rem_key[j] = act_next[rem_t[j]]
    rorder = np.argsort(rem_key, kind="mergesort")
    n_grp = 0
    for j in range(n_rem):
        if j == 0 or rem_key[rorder[j]] != rem_key[rorder[j - 1]]:
            n_grp += 1
    grp_n = np.empty(n_grp, dtype=np.int64)
    grp_step_ptr = np.zeros(n_grp + 1, dtype=np.int64)
    grp_made_ptr = np.zeros(n_grp + 1, dtype=np.int64)
    grp_lr_ptr = np.zeros(n_grp + 1, dtype=np.int64)
    grp_extra = np.zeros(n_grp, dtype=np.int64)
    grp_target_bytes = np.zeros(n_grp, dtype=np.int64)
    grp_of_op = np.full(n_ops, -1, dtype=np.int64)
    cap = 16
    step_p = np.empty(cap, dtype=np.int64)
    step_release = np.empty(cap, dtype=np.int64)
    step_leaf_ptr = np.zeros(cap + 1, dtype=np.int64)
    leaf_t = np.empty(cap, dtype=np.int64)
    made_t = np.empty(cap, dtype=np.int64)
    lr_y = np.empty(cap, dtype=np.int64)
    lr_p = np.empty(cap, dtype=np.int64)
    n_steps = 0
    n_leaves = 0
    n_made = 0
    n_lr = 0
    nt_g = n_t if n_grp else 0  # work tables, only when something is recomputed
    no_g = n_ops if n_grp else 0
    inset = np.full(nt_g, -1, dtype=np.int64)  # group stamp: in the closure
    target = np.full(nt_g, -1, dtype=np.int64)  # group stamp: a target of the group
    last_reader = np.empty(nt_g, dtype=np.int64)
    lr_seen = np.full(nt_g, -1, dtype=np.int64)
    op_stamp = np.full(no_g, -1, dtype=np.int64)
    kept_b = np.zeros(no_g, dtype=np.int64)
    freed_b = np.zeros(no_g, dtype=np.int64)
    stack = np.empty(nt_g, dtype=np.int64)
    members = np.empty(nt_g, dtype=np.int64)
    ops = np.empty(no_g, dtype=np.int64)
    lr_list = np.empty(nt_g, dtype=np.int64)
    g = -1
    j = 0
    while j < n_rem:
        g += 1
        n = rem_key[rorder[j]]
        j2 = j
        while j2 < n_rem and rem_key[rorder[j2]] == n:
            j2 += 1
        grp_n[g] = n
        grp_of_op[n] = g
        # Closure: everything that must be materialised before op n.
        n_mem = 0
        sp = 0
        tb = 0
        for q in range(j, j2):
            x = rem_t[rorder[q]]
            inset[x] = g
            target[x] = g
            members[n_mem] = x
            n_mem += 1
            stack[sp] = x
            sp += 1
            tb += nbytes[x]
        grp_target_bytes[g] = tb
        while sp > 0:
            sp -= 1
            x = stack[sp]
            p = alloc[x]
            for q in range(in_ptr[p], in_ptr[p + 1]):
                y = in_idx[q]
                if inset[y] == g:
                    continue
                fo = free[y]
                if (is_removed[y] and act_op[y] < n and n < act_next[y]) or (0 <= fo and fo < n):
                    inset[y] = g
                    members[n_mem] = y
                    n_mem += 1
                    stack[sp] = y
                    sp += 1
        # Producer ops in order, bytes kept per op.
        n_o = 0
        for q in range(n_mem):
            x = members[q]
            p = alloc[x]
            if op_stamp[p] != g:
                op_stamp[p] = g
                kept_b[p] = 0
                freed_b[p] = 0
                ops[n_o] = p
                n_o += 1
            kept_b[p] += nbytes[x]
        ops[:n_o].sort()
        # Last reader of each transient input, swapped leaves of each re-run.
        n_lrl = 0
        while n_steps + n_o > len(step_p):
            step_p = _grow(step_p, n_steps + n_o)
            step_release = _grow(step_release, n_steps + n_o)
            step_leaf_ptr = _grow(step_leaf_ptr, n_steps + n_o + 1)
        for oi in range(n_o):
            p = ops[oi]
            for q in range(in_ptr[p], in_ptr[p + 1]):
                y = in_idx[q]
                if inset[y] == g and target[y] != g:
                    if lr_seen[y] != g:
                        lr_seen[y] = g
                        lr_list[n_lrl] = y
                        n_lrl += 1
                    last_reader[y] = p
                elif acted[y] and not is_removed[y] and act_op[y] < n and n < act_next[y]:
                    if n_leaves >= len(leaf_t):
                        leaf_t = _grow(leaf_t, n_leaves + 1)
                    leaf_t[n_leaves] = y
                    n_leaves += 1
                    if n < next_use[y]:
                        next_use[y] = n
            step_leaf_ptr[n_steps + oi + 1] = n_leaves
        for q in range(n_lrl):
            y = lr_list[q]
            freed_b[last_reader[y]] += nbytes[y]
        cur = 0
        peak = 0
        for oi in range(n_o):
            p = ops[oi]
            cur += mal[p]
            if cur + scr[p] > peak:
                peak = cur + scr[p]
            release = mal[p] - kept_b[p] + freed_b[p]
            cur -= release
            step_p[n_steps] = p
            step_release[n_steps] = release
            n_steps += 1
        grp_step_ptr[g + 1] = n_steps
        grp_extra[g] = peak
        # For the schedule: the tensors made, the transient inputs' last readers.
        if n_made + n_mem > len(made_t):
            made_t = _grow(made_t, n_made + n_mem)
        made_t[n_made:n_made + n_mem] = members[:n_mem]
        n_made += n_mem
        grp_made_ptr[g + 1] = n_made
        if n_lr + n_lrl > len(lr_y):
            lr_y = _grow(lr_y, n_lr + n_lrl)
            lr_p = _grow(lr_p, n_lr + n_lrl)
        for q in range(n_lrl):
            lr_y[n_lr] = lr_list[q]
            lr_p[n_lr] = last_reader[lr_list[q]]
            n_lr += 1
        grp_lr_ptr[g + 1] = n_lr
        j = j2

    # Prefetch waits: swapped tensors by next use, ascending tensor within an op.
    wkey = np.empty(n_swap, dtype=np.int64)
    w = 0
    for q in range(n_kept):
        t = kept_t[q]
        if not is_removed[t]:
            wkey[w] = next_use[t] * n_t + t
            w += 1
    wkey.sort()
    wait_ptr = np.zeros(n_ops + 1, dtype=np.int64)
    wait_t = np.empty(n_swap, dtype=np.int64)
    for q in range(n_swap):
        wait_ptr[wkey[q] // n_t + 1] += 1
        wait_t[q] = wkey[q] % n_t
    for k in range(n_ops):
        wait_ptr[k + 1] += wait_ptr[k]

    # need[j]: memory during op j if swap-outs completed instantly.
    if n_kept:
        b_from = np.zeros(n_ops + 1, dtype=np.float64)
        b_to = np.zeros(n_ops + 1, dtype=np.float64)
        for q in range(n_kept):
            t = kept_t[q]
            if not is_removed[t]:
                b_from[act_op[t] + 1] += np.float64(nbytes[t])
                b_to[next_use[t]] += np.float64(nbytes[t])
        for q in range(n_kept):
            t = kept_t[q]
            if is_removed[t]:
                b_from[act_op[t] + 1] += np.float64(nbytes[t])
                b_to[act_next[t]] += np.float64(nbytes[t])
        need = np.empty(n_ops, dtype=np.int64)
        acc = 0.0
        for k in range(n_ops):
            acc += b_from[k] - b_to[k]
            need[k] = op_memory[k] - np.int64(acc)
    else:
        need = op_memory.copy()
    for gi in range(n_grp):
        n = grp_n[gi]
        before = need[n] - mal[n] - scr[n] - grp_target_bytes[gi]
        if before + grp_extra[gi] > need[n]:
            need[n] = before + grp_extra[gi]
    return (iss_ptr, iss_t, iss_swap, wait_ptr, wait_t, grp_n, grp_of_op, grp_step_ptr, step_p[:n_steps],
            step_release[:n_steps], step_leaf_ptr[:n_steps + 1], leaf_t[:n_leaves], grp_made_ptr,
            made_t[:n_made], grp_lr_ptr, lr_y[:n_lr], lr_p[:n_lr], ignored[:n_ign], next_use, need, n_swap)


@_jit
def _grow(a, need):
    out = np.empty(max(need, 2 * len(a)), dtype=a.dtype)
    out[:len(a)] = a
    return out
