"""Static analysis of an action set (everything that does not need time): validation,
deduplication, what each op issues, recompute closures and the plan's memory need.

The reference version (:func:`analyse`), on Python lists; :mod:`dqn_swap.simulator.compiled`
ports it line by line to flat arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from ..plan import Action, ActionKind
from .index import IndexLists, TraceIndex

# One recompute step: (op, duration, bytes allocated, kernel scratch, bytes released after,
# swapped inputs to wait for).
Step = tuple[int, float, int, int, int, tuple[int, ...]]


@dataclass
class Analysis:
    """Per-run static analysis of an action set."""

    issues: dict[int, list[tuple[int, bool]]]  # op -> [(tensor, is_swap)] acted on when op ends
    special: dict[int, tuple[tuple[Step, ...], tuple[int, ...]]]  # op -> (recompute steps, prefetch waits)
    next_use: dict[int, int]  # swapped tensor -> op of its effective next use
    need: np.ndarray  # int64 per op: requirement under the plan (admission rule's need[j])
    ignored: list[Action] = field(default_factory=list)
    # op n -> the re-runs before it, as (producer ops in order, tensors made, last re-run reading
    # each transient input); :func:`dqn_swap.simulator.result._sequence_steps` makes the schedule's steps
    sequences: dict[int, tuple[list[int], set[int], dict[int, int]]] = field(default_factory=dict)


def analyse(index: TraceIndex, lists: IndexLists, actions: Iterable[Action], why_invalid) -> Analysis:  # noqa: ANN001, C901
    """Validate, deduplicate and analyse ``actions`` (module docstring of :mod:`dqn_swap.simulator`:
    at most one action per tensor, recompute closures, ``need``).  ``why_invalid(action)``
    words the ``ValueError`` of an invalid action.

    One function on purpose: the reference engine and its compiled port are read side by side, line by line
    (tests/test_simulator_engines.py compares them bit for bit), and the compiled loop keeps its state in
    locals Numba holds in registers; split, neither would read as the other."""
    L = lists
    ev_t, ev_op, ev_next = L.ev_tensor, L.ev_op, L.ev_next
    can_s, can_r = L.can_swap, L.can_rec
    n_e = index.n_events
    items: list[tuple[int, int, int]] = []
    for a in actions:
        e, t, k = a.event, a.tensor, a.kind
        try:
            ok = (0 <= e < n_e and ev_t[e] == t
                  and (can_s[e] if k == 0 else can_r[e] if k == 1 else False))
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"invalid action: {why_invalid(a)}")
        items.append((int(e), 1 if k == 1 else 0, int(t)))
    items.sort()

    nbytes, alloc, free, mal = L.nbytes, L.alloc, L.free, L.mal
    seen: set[int] = set()
    ignored: list[Action] = []
    issues: dict[int, list[tuple[int, bool]]] = {}
    swapped: dict[int, tuple[int, int]] = {}  # tensor -> (op i, trace next use)
    removed: dict[int, tuple[int, int]] = {}
    for e, k, t in items:
        if t in seen:
            ignored.append(Action(e, t, ActionKind(k)))
            continue
        seen.add(t)
        i = ev_op[e]
        if L.held[t] > i:
            i = L.held[t]
        (removed if k else swapped)[t] = (i, ev_next[e])
        issues.setdefault(i, []).append((t, not k))

    next_use = {t: n for t, (_, n) in swapped.items()}
    scr = L.scr
    sequences: dict[int, tuple[list[int], set[int], dict[int, int]]] = {}
    steps_at: dict[int, tuple[Step, ...]] = {}
    extra_need: dict[int, int] = {}  # op -> peak of its recompute sequence above what stays resident
    target_bytes: dict[int, int] = {}
    if removed:
        targets: dict[int, list[int]] = {}
        for t, (_, n) in removed.items():
            targets.setdefault(n, []).append(t)
        inputs, dur = L.inputs, L.dur
        for n, tg in targets.items():
            # Closure: everything that must be materialised before op n.
            need_set = set(tg)
            stack = list(tg)
            while stack:
                x = stack.pop()
                for y in inputs[alloc[x]]:
                    if y in need_set:
                        continue
                    r = removed.get(y)
                    fo = free[y]
                    if (r is not None and r[0] < n < r[1]) or (0 <= fo < n):
                        need_set.add(y)
                        stack.append(y)
            ops = sorted({alloc[x] for x in need_set})
            transient = need_set.difference(tg)
            last_reader: dict[int, int] = {}
            leaves_of: dict[int, list[int]] = {}
            for p in ops:
                for y in inputs[p]:
                    if y in transient:
                        last_reader[y] = p
                    else:
                        s = swapped.get(y)
                        if s is not None and s[0] < n < s[1]:
                            leaves_of.setdefault(p, []).append(y)
                            if n < next_use[y]:
                                next_use[y] = n
            freed_after: dict[int, int] = {}
            for y, p in last_reader.items():
                freed_after[p] = freed_after.get(p, 0) + nbytes[y]
            kept: dict[int, int] = {}
            for x in need_set:
                kept[alloc[x]] = kept.get(alloc[x], 0) + nbytes[x]
            cur = peak = 0
            steps = []
            for p in ops:
                cur += mal[p]
                if cur + scr[p] > peak:
                    peak = cur + scr[p]
                release = mal[p] - kept[p] + freed_after.get(p, 0)
                cur -= release
                steps.append((p, dur[p], mal[p], scr[p], release, tuple(leaves_of.get(p, ()))))
            steps_at[n] = tuple(steps)
            sequences[n] = (ops, need_set, last_reader)  # the schedule's steps, made when asked for
            extra_need[n] = peak
            target_bytes[n] = sum(nbytes[x] for x in tg)

    waits: dict[int, list[int]] = {}
    for t, n in next_use.items():
        waits.setdefault(n, []).append(t)
    special: dict[int, tuple[tuple[Step, ...], tuple[int, ...]]] = {}
    for n in set(steps_at) | set(waits):
        special[n] = (steps_at.get(n, ()), tuple(sorted(waits.get(n, ()))))

    # need[j]: memory during op j if swap-outs completed instantly.
    n_ops = index.n_ops
    away_from, away_to, away_bytes = [], [], []
    for t, (i, _) in swapped.items():
        away_from.append(i + 1), away_to.append(next_use[t]), away_bytes.append(nbytes[t])
    for t, (i, n) in removed.items():
        away_from.append(i + 1), away_to.append(n), away_bytes.append(nbytes[t])
    if away_bytes:
        w = np.asarray(away_bytes, dtype=np.float64)
        delta = (np.bincount(away_from, weights=w, minlength=n_ops + 1)
                 - np.bincount(away_to, weights=w, minlength=n_ops + 1))
        need = index.op_memory - np.cumsum(delta[:n_ops]).astype(np.int64)
    else:
        need = index.op_memory.copy()
    for n, extra in extra_need.items():
        before = int(need[n]) - mal[n] - scr[n] - target_bytes[n]
        if before + extra > need[n]:
            need[n] = before + extra
    return Analysis(issues, special, next_use, need, ignored, sequences)
