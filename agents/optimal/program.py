r"""The mixed-integer program behind the ``optimal`` planner.

The program is the simulator's model (:mod:`dqn_swap.simulator`) with the
event-by-event schedule replaced by linear conditions that every schedule the
simulator can produce satisfies.  Its optimum is therefore a lower bound on the
simulated makespan of every plan, and the solver's dual bound -- a bound on
that optimum, valid whenever the solver stops -- is a *certified* lower bound.
Its solution is a plan, which the planner replays in the simulator (the ruler).

Candidates
    Every tensor with a valid action (one event: its last forward use ``a_i``;
    its next use ``n_i``; ``b_i`` bytes; ``tau_out_i``, ``tau_in_i`` the copy
    times ``latency + b_i / bandwidth`` of :meth:`DeviceProfile.transfer_time`)
    whose window ``a_i < k < n_i`` contains an op ``k`` over the limit.
    Actions outside every over-limit op only cost time, so no optimal plan
    takes them.

Checkpoints
    ``K``: ops over the limit at which memory is enforced.  An op ``k`` needs
    ``E_k = op_memory[k] - limit`` bytes away from the device.  The planner
    starts with the *critical* ops (per run of over-limit ops covered by the
    same candidates, the busiest) of largest excess and adds every op at which
    a replayed plan runs out of memory or stalls (row generation: a program
    with fewer checkpoints is a relaxation of one with more, so every round's
    dual bound is valid).

Variables (binaries ``o_i``, ``r_i``, ``w_ik``; everything else continuous)
    ``o_i``        tensor ``i`` is swapped out after ``a_i``;
    ``r_i``        tensor ``i`` is dropped after ``a_i`` and recomputed before ``n_i``
                   (only where the simulator allows it); ``o_i + r_i <= 1``;
    ``w_ik``       swapped ``i`` is off the device while checkpoint ``k`` runs:
                   its copy-out finished before ``k`` started and its copy-back
                   starts after ``k`` ended; ``w_ik <= o_i``;
    ``G_p, S_p``   at time points ``p`` (checkpoints, the op after each, every
                   ``a_i + 1`` and every ``n_i``): when op ``p - 1`` ended and
                   when op ``p`` started (in ms);
    ``q_pn``       producer ``p`` is re-run before op ``n``, in ``[0, 1]``;
    ``M``          the makespan, ``M = S_N`` (``N`` the number of ops).

Objective: minimise ``M``.

Constraints
    (memory)   :math:`\sum_{i: a_i<k<n_i} b_i (w_{ik} + r_i) \ge E_k` for ``k`` in ``K``.
    (compute)  :math:`G_{p'} \ge S_p + \sum_{p\le j<p'} d_j` for consecutive points,
               :math:`S_n \ge G_n + \sum_p d_p q_{pn}`: ops run in order and the
               re-runs before ``n`` run between them.
    (re-runs)  :math:`q_{pn} \ge r_x` for every producer ``p`` of the static
               closure of ``x`` before ``n = n_x`` (``x``'s producer and,
               recursively, the producers of its inputs that the trace frees
               before ``n``); and :math:`q_{pn} \ge r_x + r_y - 1` where the
               closure reads a dropped candidate ``y`` still away at ``n``
               (chains up to depth ``chain_depth``).  These are the
               simulator's re-run sequences, which also re-run a dropped input.
    (copy-out) The D2H engine copies one tensor at a time, each released at
               ``G_{a_i+1}``.  Horn's energy condition for one machine with
               release times: for every release point ``r`` and checkpoint
               ``k``, the copies released at or after ``r`` that must finish
               before ``k`` fit between: :math:`\sum \tau^{out}_i y_{ik} \le
               S_k - G_r`, where ``y_ik`` is ``o_i`` for ``n_i <= k`` (its copy
               must be back by then) and, for ``a_i < k < n_i``, whether its
               copy-out must have finished before ``k``.  The simulator's D2H
               queue is first in, first out, so ``w_jk = 1`` forces every copy
               issued before ``j`` (and still relevant at ``k``) to have finished:
               ``P_jk`` is monotone along the issue order, ``P_jk >= w_jk`` and
               ``y_ik >= P_ik + o_i - 1``.
    (copy-in)  The H2D engine: the copy-backs that start after ``k`` ended
               (``w_ik``, or ``o_i`` if ``a_i >= k``) and are due by ``n_i <= h``
               fit between: :math:`\sum \tau^{in}_i \le S_h - G_{k+1}`.
    (one copy) :math:`S_{n_i} - G_{a_i+1} \ge (\tau^{out}_i + \tau^{in}_i) o_i`.
    (inputs of re-runs) A swapped ``j`` that a re-run before ``n`` reads (through
               a chain ``C`` of dropped tensors) is back before that re-run and
               stays: with :math:`\chi = o_j + \sum_{z \in C} r_z - |C|`,
               :math:`S_n - G_{a_j+1} \ge (\tau^{out}_j + \tau^{in}_j + d_p)\chi`,
               :math:`S_n - G_{k+1} \ge (\tau^{in}_j + d_p)(w_{jk} + \ldots)` for
               checkpoints ``k < n``, and ``w_jk = 0`` for ``k >= n`` when it applies
               (``d_p``: the shortest re-run that reads it).
    (re-run memory) At the ops ``n`` in ``rerun_points``: while producer ``p`` of a
               dropped ``x`` re-runs, the memory before ``n`` (targets not yet
               back) plus ``p``'s outputs and scratch, its inputs the trace freed,
               and every dropped input it reads (:math:`b_y (r_x + r_y - 1)`) fit,
               with binaries ``v_in`` for swapped tensors away during the re-runs.
    (cuts)     Each plan in ``exclude`` is cut off (a no-good inequality on the
               ``o`` and ``r`` binaries).  The planner excludes plans it has
               already replayed, so ``min(simulated makespan of the excluded,
               the program's bound)`` stays a valid bound and the rounds can
               walk past plans that the simulator charges more than the program.
    Without duplex copy engines (one engine for both directions) the copy-out
    and copy-back of every swap released after ``k`` and due by ``h`` share
    ``[G_{k+1}, S_h]``.  The sums over ``r`` (and ``h``) are kept linear in
    size with cumulative auxiliaries ``Y_rk = Y_{r'k} + \sum_{i released at r}``.

What it assumes that the simulator does not (all relaxations, so the bound stays valid):
    * copies are preemptive and ordered freely within the energy conditions
      (the simulator copies back in order of next use, each as one piece);
    * memory is enforced only at the checkpoints, and during re-runs only at the
      ``rerun_points`` and only at the re-run of each target's own producer
      (the other targets of the same op are taken as not yet re-created);
    * the prefetch admission rule (a copy-back starts only when every op up to
      its use still fits) is not modelled: the program only asks that a tensor
      is back by its use;
    * the D2H order is first in, first out; copy-backs are ordered freely;
    * the re-run chains are followed ``chain_depth`` dropped tensors deep: a
      deeper chain is charged as if it stopped there.

Where the simulator charges a plan more than the program did (the admission
rule, an eager prefetch that makes a later op wait), the planner's rounds add
checkpoints and cut the plan off; on tiny traces this reaches the optimum of
exhaustive enumeration (``tests/agents/test_optimal.py``).

This is not Checkmate's or POET's stage-indexed program (a binary per op and
tensor: quadratic in the number of ops): its binaries are per candidate and
checkpoint it covers, which is what keeps ResNet-50 b64 (944 ops, about 400
candidates) at a few thousand binaries.  The linearised step durations follow
OffMate's idea (compute plus bytes over bandwidth), sharpened into energy
conditions over release and due times.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import Simulator

MS = 1e3  # seconds -> milliseconds: the program's time unit
GIB = float(2**30)  # bytes -> GiB: the program's memory unit


@dataclass(frozen=True)
class Candidate:
    """One tensor the program may swap or drop (see the module docstring)."""

    tensor: int
    event: int
    act_op: int  # a_i: the action's op (the tensor leaves after it)
    next_use: int  # n_i: back (or recomputed) before this op
    nbytes: int
    can_recompute: bool
    t_out: float  # copy-out time, ms
    t_in: float  # copy-back time, ms


def candidates(sim: Simulator) -> list[Candidate]:
    """The tensors whose action window covers an op over the limit, in issue order."""
    over = sim.op_memory > sim.memory_limit
    over_cum = np.concatenate(([0], np.cumsum(over)))
    can_swap, can_rec = sim.valid_actions()
    trace = sim.trace
    ev = np.flatnonzero(can_swap)
    out: list[Candidate] = []
    seen: set[int] = set()
    ete, eop, nxt = trace.event_tensor, trace.event_op, sim.event_next_use
    nbytes = trace.tensor_nbytes
    for e in ev[::-1].tolist():  # the last valid event of each tensor
        t = int(ete[e])
        if t in seen:
            continue
        seen.add(t)
        a, n = int(eop[e]), int(nxt[e])
        if n <= a + 1 or over_cum[n] - over_cum[a + 1] == 0:
            continue
        b = int(nbytes[t])
        out.append(Candidate(t, int(e), a, n, b, bool(can_rec[e]),
                             float(sim.profile.transfer_time(b, "d2h")) * MS,
                             float(sim.profile.transfer_time(b, "h2d")) * MS))
    out.sort(key=lambda c: c.event)
    return out


def critical_ops(sim: Simulator, cands: Sequence[Candidate]) -> list[int]:
    """Per run of over-limit ops covered by the same candidates, its busiest op (by excess, largest first)."""
    n_ops = sim.trace.n_ops
    cut = np.zeros(n_ops + 1, dtype=bool)
    for c in cands:
        cut[c.act_op + 1] = True
        cut[c.next_use] = True
    over = sim.op_memory > sim.memory_limit
    seg = np.cumsum(cut[:n_ops])
    best: dict[int, int] = {}
    mem = sim.op_memory
    for k in np.flatnonzero(over).tolist():
        s = int(seg[k])
        if s not in best or mem[k] > mem[best[s]]:
            best[s] = k
    return sorted(best.values(), key=lambda k: -int(mem[k]))


class _Rows:
    """A sparse constraint matrix built row by row: ``lo <= A x <= hi``."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, terms: Iterable[tuple[int, float]], lo: float = -math.inf, hi: float = math.inf) -> None:
        i = len(self.lo)
        for c, v in terms:
            self.r.append(i), self.c.append(c), self.v.append(v)
        self.lo.append(lo), self.hi.append(hi)

    def matrix(self, n_vars: int) -> sparse.csr_array:
        return sparse.csr_array((self.v, (self.r, self.c)), shape=(len(self.lo), n_vars))


@dataclass(frozen=True)
class ProgramSize:
    """How big a program is: variables, binaries, constraints, nonzeros."""

    variables: int
    binaries: int
    constraints: int
    nonzeros: int
    candidates: int
    checkpoints: int
    time_points: int


class SwapProgram:
    """The program of the module docstring for one trace, limit and set of checkpoints.

    Args:
        sim: the simulator of the trace, limit and profile (its facts are the program's data).
        cands: :func:`candidates` of ``sim``.
        checkpoints: ops over the limit at which memory is enforced.
        chain_depth: how many dropped tensors a re-run chain rule may link.
        fifo: model the D2H queue's first-in-first-out order (tighter, exact for the simulator).
    """

    def __init__(self, sim: Simulator, cands: Sequence[Candidate], checkpoints: Iterable[int], *,
                 rerun_points: Iterable[int] = (), exclude: Iterable[Iterable[Action]] = (),
                 chain_depth: int = 3, fifo: bool = True) -> None:
        self.sim, self.cands = sim, list(cands)
        trace = sim.trace
        n_ops = trace.n_ops
        limit = sim.memory_limit
        ks = sorted({int(k) for k in checkpoints if sim.op_memory[k] > limit})
        dur_ms = trace.op_duration.astype(np.float64) * MS
        self._cum = np.concatenate(([0.0], np.cumsum(dur_ms)))
        cands = self.cands
        nc = len(cands)

        n_var = 0
        lb: list[float] = []
        ub: list[float] = []
        integ: list[int] = []
        cost: list[float] = []

        def var(lo: float = 0.0, hi: float = math.inf, binary: bool = False) -> int:
            nonlocal n_var
            lb.append(lo), ub.append(hi), integ.append(1 if binary else 0), cost.append(0.0)
            n_var += 1
            return n_var - 1

        rows = _Rows()
        o = [var(0, 1, True) for _ in cands]
        r = [var(0, 1, True) if c.can_recompute else -1 for c in cands]
        self.o, self.r = o, r
        for i, c in enumerate(cands):
            if r[i] >= 0:
                rows.add([(o[i], 1.0), (r[i], 1.0)], hi=1.0)

        # Plans already replayed (their simulated cost is known): no-good cuts, one per plan.
        by_tensor = {c.tensor: i for i, c in enumerate(cands)}
        for plan in exclude:
            chosen = {by_tensor[a.tensor]: a.kind for a in plan if a.tensor in by_tensor}
            terms, ones = [], 0
            for i in range(len(cands)):
                kind = chosen.get(i)
                for v, on in ((o[i], kind == ActionKind.SWAP), (r[i], kind == ActionKind.RECOMPUTE)):
                    if v < 0:
                        continue
                    terms.append((v, -1.0 if on else 1.0))
                    ones += on
            rows.add(terms, lo=1.0 - ones)

        # Time points and their G (end of the previous op) and S (start of the op).
        pts = {0, n_ops}
        pts.update(ks)
        pts.update(k + 1 for k in ks)
        pts.update(c.act_op + 1 for c in cands)
        pts.update(c.next_use for c in cands)
        points = sorted(p for p in pts if 0 <= p <= n_ops)
        G = {p: var() for p in points}
        S = {p: var() for p in points}
        cost[S[n_ops]] = 1.0  # the makespan
        for p, p2 in zip(points, points[1:]):
            rows.add([(G[p2], 1.0), (S[p], -1.0)], lo=float(self._cum[p2] - self._cum[p]))

        # Re-runs: q[p, n] >= r_x over x's static closure, chained through dropped inputs.
        free = trace.tensor_free_op.tolist()
        alloc = trace.tensor_alloc_op.tolist()
        inputs = sim.op_inputs
        q: dict[tuple[int, int], int] = {}
        chain_rows: set[tuple[int, int, tuple[int, ...]]] = set()

        def static_closure(x: int, n: int) -> tuple[set[int], dict[int, float]]:
            """Producers that must re-run to re-create ``x`` before ``n``, and the candidate
            inputs they read (resident unless dropped) with the least duration of a reader."""
            ops, seen, stack, dropped = set(), {x}, [x], {}
            while stack:
                z = stack.pop()
                p = alloc[z]
                ops.add(p)
                for y in inputs[p]:
                    if y in seen:
                        continue
                    seen.add(y)
                    if 0 <= free[y] < n:
                        stack.append(y)
                    elif y in by_tensor:
                        dropped[y] = min(dropped.get(y, math.inf), float(dur_ms[p]))
            return ops, dropped

        def rerun_rows(n: int, chain: tuple[int, ...], x: int) -> None:
            ops, dropped = static_closure(x, n)
            for p in ops:
                key = (p, n, chain)
                if key in chain_rows:
                    continue
                chain_rows.add(key)
                if (p, n) not in q:
                    q[p, n] = var(0.0, 1.0)
                rows.add([(q[p, n], 1.0)] + [(r[j], -1.0) for j in chain], lo=-(len(chain) - 1.0))
            for y, d_read in dropped.items():
                j = by_tensor[y]
                cy = cands[j]
                if not (cy.act_op < n < cy.next_use) or j in chain:
                    continue
                # a swapped input of the re-runs is back before them: by n, not by its own next use
                link = [(r[z], -1.0) for z in chain]
                leaf_rows.append((j, n, link, d_read))
                if r[j] >= 0 and len(chain) < chain_depth:
                    rerun_rows(n, chain + (j,), y)

        #: (swapped input j, n, the dropped chain that reads it, least duration of a reading re-run)
        leaf_rows: list[tuple[int, int, list[tuple[int, float]], float]] = []

        for i, c in enumerate(cands):
            if r[i] >= 0:
                rerun_rows(c.next_use, (i,), c.tensor)
        seen_leaf: set[tuple[int, int, tuple[int, ...]]] = set()
        for j, n, link, d_read in leaf_rows:
            key = (j, n, tuple(v for v, _ in link))
            if key in seen_leaf:
                continue
            seen_leaf.add(key)
            c = cands[j]
            # o_j + sum(r_chain) - len(chain) <= 0 unless the round trip and then the re-run reading it fit before n
            t = c.t_out + c.t_in + d_read
            rows.add([(S[n], 1.0), (G[c.act_op + 1], -1.0), (o[j], -t)] + [(v, -t) for v, _ in link],
                     lo=-t * len(link))
        reruns_at: dict[int, list[tuple[int, float]]] = {}
        for (p, n), v in q.items():
            reruns_at.setdefault(n, []).append((v, float(dur_ms[p])))
        for p in points:
            rows.add([(S[p], 1.0), (G[p], -1.0)] + [(v, -d) for v, d in reruns_at.get(p, ())], lo=0.0)

        # Off the device at checkpoints, and memory there.
        cover: dict[int, list[int]] = {k: [] for k in ks}
        for i, c in enumerate(cands):
            lo_k, hi_k = np.searchsorted(ks, c.act_op, "right"), np.searchsorted(ks, c.next_use, "left")
            for k in ks[lo_k:hi_k]:
                cover[k].append(i)
        w: dict[tuple[int, int], int] = {}
        for k in ks:
            for i in cover[k]:
                w[i, k] = var(0, 1, True)
                rows.add([(w[i, k], 1.0), (o[i], -1.0)], hi=0.0)
            excess = float(sim.op_memory[k] - limit) / GIB
            terms = [(w[i, k], cands[i].nbytes / GIB) for i in cover[k]]
            terms += [(r[i], cands[i].nbytes / GIB) for i in cover[k] if r[i] >= 0]
            rows.add(terms, lo=excess)
        for j, n, link, d_read in leaf_rows:
            c = cands[j]
            for k in ks:
                if (j, k) not in w:
                    continue
                if k >= n:  # ... and stays from n on: not away at checkpoints in [n, n_j)
                    rows.add([(w[j, k], 1.0)] + [(v, 1.0) for v, _ in link], hi=float(len(link)))
                else:  # away at k: its copy-back runs between k and n
                    t = c.t_in + d_read
                    rows.add([(S[n], 1.0), (G[k + 1], -1.0), (w[j, k], -t)] + [(v, -t) for v, _ in link],
                             lo=-t * len(link))
        ks_of: dict[int, list[int]] = {}
        for (i, k) in w:
            ks_of.setdefault(i, []).append(k)
        for i in range(nc):  # a swap that is never away at a checkpoint only costs time
            rows.add([(o[i], 1.0)] + [(w[i, k], -1.0) for k in ks_of.get(i, ())], hi=0.0)

        def energy(steps: Iterable[tuple[list[tuple[int, float]], int, int]]) -> None:
            """Horn's condition for one copy engine over nested windows: ``steps`` run from the
            innermost window ``[G, S]`` outwards with the copies (variable, time) each adds; the
            copies of a window and of every window inside it fit in it.  A cumulative auxiliary
            per window keeps this linear in size."""
            acc = -1
            for terms, start, end in steps:
                if not terms and acc < 0:
                    continue
                total = var()
                rows.add([(total, 1.0)] + ([(acc, -1.0)] if acc >= 0 else []) + [(v, -t) for v, t in terms], lo=0.0)
                rows.add([(total, 1.0), (start, 1.0), (end, -1.0)], hi=0.0)
                acc = total

        # "Copy-out finished before k": y[i, k].
        yv: dict[tuple[int, int], int] = {}
        for k in ks:
            order = cover[k]  # issue order (cands are sorted by event)
            if fifo:
                prev = -1
                for i in order:
                    P = var(0.0, 1.0)
                    rows.add([(P, 1.0), (w[i, k], -1.0)], lo=0.0)
                    if prev >= 0:
                        rows.add([(prev, 1.0), (P, -1.0)], lo=0.0)
                    prev = P
                    yv[i, k] = var(0.0, 1.0)
                    rows.add([(yv[i, k], 1.0), (P, -1.0), (o[i], -1.0)], lo=-1.0)
            else:
                for i in order:
                    yv[i, k] = w[i, k]

        # Copy-out energy: per checkpoint k, cumulative over release points r (latest first).
        by_release: dict[int, list[int]] = {}
        for i, c in enumerate(cands):
            by_release.setdefault(c.act_op + 1, []).append(i)
        releases = sorted(by_release)
        for k in ks:
            energy(([(o[i], cands[i].t_out) if cands[i].next_use <= k else (yv[i, k], cands[i].t_out)
                     for i in by_release[rp] if cands[i].next_use <= k or (i, k) in yv], G[rp], S[k])
                   for rp in reversed(releases) if rp <= k)

        # Copy-back energy: per checkpoint k, cumulative over due points h (earliest first).
        by_due: dict[int, list[int]] = {}
        for i, c in enumerate(cands):
            by_due.setdefault(c.next_use, []).append(i)
        dues = sorted(by_due)
        for k in ks:
            energy(([(o[i], cands[i].t_in) if cands[i].act_op >= k else (w[i, k], cands[i].t_in)
                     for i in by_due[h] if cands[i].act_op >= k or (i, k) in w], G[k + 1], S[h])
                   for h in dues if h > k)

        # Memory while the re-runs before n run (only at the ops given: added where a replay needed it).
        mal = sim.op_malloc.tolist()
        scr = trace.op_scratch.tolist()
        targets_at: dict[int, list[int]] = {}
        for i, c in enumerate(cands):
            if r[i] >= 0:
                targets_at.setdefault(c.next_use, []).append(i)
        for n in sorted({int(n) for n in rerun_points}):
            tg = targets_at.get(n, [])
            if not tg:
                continue
            covering = [i for i, c in enumerate(cands) if c.act_op < n < c.next_use]
            away = {}
            for i in covering:  # swapped i is away during the re-runs: its copy-out ended before S_n
                away[i] = var(0, 1, True)
                rows.add([(away[i], 1.0), (o[i], -1.0)], hi=0.0)
                rows.add([(S[n], 1.0), (G[cands[i].act_op + 1], -1.0), (away[i], -cands[i].t_out)], lo=0.0)
            for j, n2, link, _ in leaf_rows:  # a swapped input of these re-runs is on the device for them
                if n2 == n and j in away:
                    rows.add([(away[j], 1.0)] + [(v, 1.0) for v, _ in link], hi=float(len(link)))
            base = float(sim.op_memory[n] - mal[n] - scr[n] - limit) / GIB
            relief = [(away[i], -cands[i].nbytes / GIB) for i in covering]
            relief += [(r[i], -cands[i].nbytes / GIB) for i in covering if r[i] >= 0]
            for x in tg:
                p = alloc[cands[x].tensor]
                # the targets are not on the device before their re-runs (x is in p's outputs below)
                others = [(r[t], -cands[t].nbytes / GIB) for t in tg]
                # while p re-runs: its outputs and scratch, and every input it reads that is away
                extra = [(r[x], (mal[p] + scr[p]) / GIB)]
                lo_terms: dict[int, float] = {}
                for yv_t in inputs[p]:
                    if 0 <= free[yv_t] < n:  # freed by the trace: re-created whenever x is
                        extra.append((r[x], float(trace.tensor_nbytes[yv_t]) / GIB))
                    elif yv_t in by_tensor:
                        j = by_tensor[yv_t]
                        cj = cands[j]
                        if r[j] >= 0 and cj.act_op < n < cj.next_use and j != x:
                            lo_terms[j] = cj.nbytes / GIB
                if lo_terms:
                    # b_y (r_x + r_y - 1): y is re-created (and so on the device) when both are dropped
                    chain = [(r[j], b) for j, b in lo_terms.items()] + [(r[x], sum(lo_terms.values()))]
                    rows.add(relief + others + extra + chain, hi=-base + sum(lo_terms.values()))
                else:
                    rows.add(relief + others + extra, hi=-base)

        # Each swap's own round trip, and one shared engine where copies are not duplex.
        for i, c in enumerate(cands):
            rows.add([(S[c.next_use], 1.0), (G[c.act_op + 1], -1.0), (o[i], -(c.t_out + c.t_in))], lo=0.0)
        if not sim.profile.duplex:
            for s0 in sorted({0} | {k + 1 for k in ks}):
                energy(([(o[i], cands[i].t_out + cands[i].t_in) for i in by_due[h] if cands[i].act_op + 1 >= s0],
                        G[s0], S[h]) for h in dues if h > s0)

        self.c = np.asarray(cost)
        self.lb, self.ub = np.asarray(lb), np.asarray(ub)
        self.integrality = np.asarray(integ)
        self.A = rows.matrix(n_var)
        self.row_lo, self.row_hi = np.asarray(rows.lo), np.asarray(rows.hi)
        self.size = ProgramSize(n_var, int(self.integrality.sum()), len(rows.lo), int(self.A.nnz),
                                nc, len(ks), len(points))

    # ------------------------------------------------------------------ reading
    def makespan_seconds(self, objective_ms: float) -> float:
        """The program's objective (ms from the start) as a makespan in the trace's seconds."""
        return self.sim.compute_time + (objective_ms - float(self._cum[-1])) / MS

    def actions(self, x: np.ndarray) -> tuple[Action, ...]:
        """The plan of a solution vector: swap where ``o_i``, recompute where ``r_i``."""
        out = []
        for i, c in enumerate(self.cands):
            if x[self.o[i]] > 0.5:
                out.append(Action(c.event, c.tensor, ActionKind.SWAP))
            elif self.r[i] >= 0 and x[self.r[i]] > 0.5:
                out.append(Action(c.event, c.tensor, ActionKind.RECOMPUTE))
        return tuple(out)

    def fix(self, actions: Iterable[Action]) -> tuple[np.ndarray, np.ndarray]:
        """Variable bounds that fix the program's actions to ``actions`` (others: keep)."""
        lb, ub = self.lb.copy(), self.ub.copy()
        chosen = {a.tensor: a.kind for a in actions}
        for i, c in enumerate(self.cands):
            kind = chosen.get(c.tensor)
            lb[self.o[i]] = ub[self.o[i]] = 1.0 if kind == ActionKind.SWAP else 0.0
            if self.r[i] >= 0:
                lb[self.r[i]] = ub[self.r[i]] = 1.0 if kind == ActionKind.RECOMPUTE else 0.0
        return lb, ub
