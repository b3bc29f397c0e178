r"""The mixed-integer program behind the ``optimal`` planner.

The program is a *relaxation* of the simulator (:mod:`dqn_swap.simulator`):
every plan the simulator runs to the end gives a solution of the program -- its
actions, and times read off the simulated run -- whose objective is that plan's
simulated makespan ("Why it is a relaxation", below, rule by rule).  So the
program's optimum is at most the simulated makespan of every plan, and the
solver's dual bound -- a bound on that optimum, valid whenever the solver stops
-- is a *certified* lower bound.  Its solution is a plan, which the planner
replays in the simulator (the ruler).  ``tests/agents/test_optimal_bound.py``
and ``benchmarks/bench_bound.py`` check this against every plan of small random
traces.

Candidates
    Every tensor with a valid action (one event; ``a_i`` the op after which it
    leaves: its action's op, or later where a holder outside autograd keeps it,
    :attr:`Trace.leave_op`; its next use ``n_i``; ``b_i`` bytes; ``tau_out_i``,
    ``tau_in_i`` the copy times ``latency + b_i / bandwidth`` of
    :meth:`DeviceProfile.transfer_time`) whose window ``a_i < k < n_i``
    contains an op ``k`` over the limit: the only tensors that can be away at
    such an op.  A program with cuts gives every tensor with a valid action its
    variables (see "cuts").

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
    ``w_ik``       one per *instant* ``T_k`` of checkpoint ``k``: its start ``S_k``
                   and its end ``G_{k+1}``.  Swapped ``i`` is away then: its copy
                   out finished by ``T_k`` and its copy back had not started;
                   ``w_ik <= o_i``;
    ``G_p, S_p``   at time points ``p`` (checkpoints, the op after each, every
                   ``a_i + 1`` and every ``n_i``): when op ``p - 1`` ended and
                   when op ``p`` started (in ms);
    ``q_pn``       producer ``p`` is re-run before op ``n``, in ``[0, 1]``;
    ``M``          the makespan, ``M = S_N`` (``N`` the number of ops).

Objective: minimise ``M``.

Constraints (each at both instants of a checkpoint where it names ``w`` or ``T_k``)
    (memory)   :math:`\sum_{i: a_i<k<n_i} b_i (w_{ik} + r_i) \ge E_k` for ``k`` in ``K``.
    (compute)  :math:`G_{p'} \ge S_p + \sum_{p\le j<p'} d_j` for consecutive points,
               :math:`S_n \ge G_n + \sum_p d_p q_{pn}`: ops run in order and the
               re-runs before ``n`` run between them.
    (re-runs)  :math:`q_{pn} \ge r_x` for every producer ``p`` of the static
               closure of ``x`` before ``n = n_x`` (``x``'s producer and,
               recursively, the producers of its inputs that the trace frees
               before ``n``); and :math:`q_{pn} \ge r_x + r_y - 1` where the
               closure reads a dropped candidate ``y`` still away at ``n``
               (chains up to depth ``chain_depth``).
    (copy-out) Horn's energy condition for one machine with release times: for
               every release point ``r`` and checkpoint ``k``, the copies out
               released at or after ``G_r`` that must be finished at ``T_k`` fit
               between: :math:`\sum \tau^{out}_i y_{ik} \le T_k - G_r`, where
               ``y_ik`` is ``o_i`` for ``n_i <= k`` (back by then, so copied out)
               and, for ``a_i < k < n_i``, whether its copy out finished by
               ``T_k``.  The D2H queue is first in, first out, so ``w_jk = 1``
               forces every copy requested before ``j`` (and covering ``k``) to
               have finished: ``P_jk`` is monotone along the request order,
               ``P_jk >= w_jk`` and ``y_ik >= P_ik + o_i - 1``.
    (copy-in)  The copies back not started at ``T_k`` (``w_ik``, or ``o_i`` if
               ``a_i >= k``) and due by ``n_i <= h`` fit between:
               :math:`\sum \tau^{in}_i \le S_h - T_k`.
    (one copy) :math:`S_{n_i} - G_{a_i+1} \ge (\tau^{out}_i + \tau^{in}_i) o_i`.
    (inputs of re-runs) A swapped ``j`` that a re-run before ``n`` reads (through
               a chain ``C`` of dropped tensors) is back before that re-run and
               stays: with :math:`\chi = o_j + \sum_{z \in C} r_z - |C|`,
               :math:`S_n - G_{a_j+1} \ge (\tau^{out}_j + \tau^{in}_j + d_p)\chi`,
               :math:`S_n - T_k \ge (\tau^{in}_j + d_p)(w_{jk} + \ldots)` for
               checkpoints ``k < n``, and ``w_jk = 0`` for ``k >= n``
               (``d_p``: the shortest re-run that reads it).
    (re-run memory) At the ops ``n`` in ``rerun_points``: while producer ``p`` of a
               dropped ``x`` re-runs, the memory before ``n`` (targets not yet
               back) plus ``p``'s outputs and scratch, its inputs the trace freed,
               and every dropped input it reads (:math:`b_y (r_x + r_y - 1)`)
               fit.  Binaries ``v_in <= o_i`` count a swapped ``i`` away when its
               copy out finished by ``S_n``; one that ``p`` reads counts as
               present when ``x`` is dropped (``u >= v_jn + r_x - 1``, ``+b_j u``).
    (shared engine) Without duplex copy engines (one engine for both
               directions) the copy out and copy back of every swap released
               after ``k`` and due by ``h`` share ``[G_{k+1}, S_h]``.
    (cuts)     Each plan in ``exclude`` is cut off (a no-good inequality on the
               ``o`` and ``r`` binaries).  The planner excludes plans it has
               already replayed, so ``min(simulated makespan of the excluded,
               the program's bound)`` stays a valid bound.  For that a cut must
               remove that plan only: with cuts, every tensor with a valid action
               has its binaries, so two plans that differ anywhere differ in the
               program (a plan that adds an action outside every checkpoint's
               window to a cut plan, e.g. dropping the other output of a re-run
               producer, is a different plan).
    The sums over ``r`` (and ``h``) are kept linear in size with cumulative
    auxiliaries ``Y_rk = Y_{r'k} + \sum_{i released at r}``.

Why it is a relaxation
    Take a plan the simulator runs to the end.  Set ``o_i``, ``r_i`` from its
    actions (a candidate it does not act on: 0); ``S_p`` and ``G_p`` to when op
    ``p`` started and op ``p - 1`` ended in the run, ``M`` to the makespan;
    ``q_pn = 1`` where it re-ran ``p`` before ``n``; ``w_ik`` to whether ``i``
    was away at ``S_k`` (after ``k``'s allocation) and just before ``G_{k+1}``;
    ``P``, ``y``, ``v``, ``u`` and the cumulative sums as their rows define them.
    Every row holds, by the simulator's rules (its module docstring; the model
    of Beaumont, Eyraud-Dubois and Shilova, "Optimal GPU-CPU offloading
    strategies for DNN training", section 3.1, and the DQN paper's prefetch and
    re-run rules, section 4.5):

    1. *Ops run in order on one stream, op k for d_k*; everything else that
       happens on it (prefetch waits, re-runs, waits for memory) happens
       between one op's end and the next op's start: (compute) asks only
       ``G_{p'} - S_p >= sum d`` and ``S_n - G_n >=`` the re-runs' time.
    2. *Memory is allocated when an op starts* (outputs and scratch) and must
       fit: at ``S_k`` the trace's memory during ``k`` minus what is away fits,
       so the bytes away cover ``E_k``.  Only tensors with a valid action can
       be away; at an op over the limit only candidates (their window holds
       it); a removed candidate is away from ``a_i + 1`` up to its re-run just
       before ``n_i`` (re-created inputs of earlier re-runs are transient):
       (memory) at ``S_k``.
    3. *A copy back may start at any instant*, also while an op runs (when a
       copy out completes during it, the head of the queue starts if it fits
       beside the op's memory and scratch).  Every start is checked, and copy
       outs completing only release memory, so at every instant of ``k`` the
       bytes away cover ``E_k``; in particular just before ``G_{k+1}``:
       (memory) at ``G_{k+1}``.  A tensor can be away at one instant and not
       the other (its copy out completes, or its copy back starts, while ``k``
       runs); neither row asks for a tensor away for the whole op, and no row
       asks a swapped tensor to be away at some checkpoint: a swap that frees
       nothing at any checkpoint is a plan the simulator runs too.
       (A program that counted a tensor away at ``k`` only if its copy back
       started after ``k`` ended, and forbade swaps away at no checkpoint,
       charged such plans a stall the simulator does not have: a plan that
       swaps three tensors, the second coming back inside the op over the
       limit once the third's copy out completes, was charged as if it came
       back after the op.)
    4. *Swap-outs are requested when op a_i ends* (a held tensor: when its
       holder's op ends, hence ``a_i`` is the leave op), *copied one at a time,
       first in first out, for tau_out*, and release memory when complete: the
       copies that must be complete at ``T_k`` (away then, or back by ``k``)
       ran one after another inside ``[G_r, T_k]`` (copy-out); if ``j`` was
       away at ``T_k`` its copy out and every earlier one were complete
       (the ``P`` chain, in the simulator's request order: leave op, then
       event).  A copy out completing exactly at ``G_{k+1}`` is processed
       after op ``k`` ends, so it is not counted away at ``k``'s end.
    5. *Copies back run one at a time for tau_in, after the tensor's copy out,
       and end before its next use starts* (or before the re-run that reads
       it): the copies not started at ``T_k`` and due by ``h`` ran inside
       ``[T_k, S_h]`` (copy-in); each swap's two copies lie inside
       ``[G_{a_i+1}, S_{n_i}]`` (one copy).  A copy back starting at the very
       instant op ``k`` starts is allocated before ``k``'s outputs: present at
       ``S_k`` (``w = 0``), nothing asked of it.  *Which tensor comes back
       first (next use order, the head blocking the queue) and the admission
       rule* (no prefetch may cause an excess before its use) only delay
       copies back; the program does not model them.
    6. *One engine for both directions* (``duplex=False``): the two copies of
       every swap released after ``k`` and due by ``h`` ran one after another
       inside ``[G_{k+1}, S_h]`` (shared engine).
    7. *Re-runs happen just before the next use n of a removed tensor*: the
       closure of producers, each once, in trace order, including producers
       of inputs the trace freed before ``n`` and of removed tensors away at
       ``n``: the producers the program's ``q_pn >= r_x`` (static closure) and
       chain rows name are among them (chains deeper than ``chain_depth`` and
       removed non-candidates are not followed: fewer re-runs charged).
    8. *A re-run waits for its swapped inputs*, which then stay until their
       trace free: (inputs of re-runs).
    9. *A re-run's outputs and scratch must fit when it starts*: the rows at
       ``rerun_points`` count at most what is on the device then: every
       target of ``n`` as not yet re-created, a swapped tensor copied out by
       ``S_n`` as away (the ones away during the re-run are among them), one
       that the re-run of ``p`` reads as present (the simulator waits for it),
       an input the trace freed or a dropped input that ``p`` reads as
       re-created, and every tensor without variables whose window reaches
       ``n`` as away.
    10. *Actions the program has no variables for* (a tensor whose window
        holds no checkpoint) only add copies, re-runs and stalls; they cannot
        be away at an op over the limit.  Leaving them out keeps every row.
    11. *Cuts* remove only the plans already replayed (see "cuts").
    Solver tolerances only loosen rows.  Hence the objective of this solution is
    the simulated makespan, and the optimum is at most it.

What it assumes that the simulator does not (where the bound may be below the optimum):
    * copies are preemptive and ordered freely within the energy conditions
      (the simulator copies back in order of next use, each as one piece);
    * memory is enforced only at the checkpoints, at their two instants, and
      during re-runs only at the ``rerun_points`` and only at the re-run of
      each target's own producer;
    * the prefetch admission rule is not modelled;
    * the re-run chains are followed ``chain_depth`` dropped tensors deep.

Where the simulator charges a plan more than the program did (the admission
rule, an eager prefetch that makes a later op wait), the planner's rounds add
checkpoints and cut the plan off; on tiny traces this reaches the optimum of
exhaustive enumeration (:mod:`.exhaustive`).

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

import numpy as np

from dqn_swap.plan import Action, ActionKind
from dqn_swap.simulator import Simulator

from .candidates import MS, Candidate, actionable_windows, candidates
from .rows import Columns, ProgramSize, Rows

GIB = float(2**30)  # bytes -> GiB: the program's memory unit


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
        exclude = [tuple(plan) for plan in exclude]
        if exclude:
            # A cut must exclude one plan, not every plan that acts the same on the candidates:
            # give every tensor with a valid action its variables.
            known = {c.tensor for c in self.cands}
            self.cands += [c for c in candidates(sim, every=True) if c.tensor not in known]
            self.cands.sort(key=lambda c: (c.act_op, c.event))
        self._ks = sorted({int(k) for k in checkpoints if sim.index.op_memory[k] > sim.memory_limit})
        self._dur_ms = sim.trace.op_duration.astype(np.float64) * MS
        self._cum = np.concatenate(([0.0], np.cumsum(self._dur_ms)))
        self._cols, self._rows = Columns(), Rows()
        # the trace's tensor facts as lists, read by the re-run rows and the re-run memory rows
        self._free, self._alloc = sim.trace.tensor_free_op.tolist(), sim.trace.tensor_alloc_op.tolist()
        self._by_tensor = {c.tensor: i for i, c in enumerate(self.cands)}
        # The rows, in the order of the module docstring's constraints.
        self._actions_and_cuts(exclude)
        self._time_points()
        leaf_rows = self._reruns(chain_depth)
        self._checkpoint_memory(leaf_rows)
        self._copy_energy(fifo)
        self._rerun_memory(rerun_points)
        self._round_trips()

        cols, rows = self._cols, self._rows
        self.c = np.asarray(cols.cost)
        self.lb, self.ub = np.asarray(cols.lb), np.asarray(cols.ub)
        self.integrality = np.asarray(cols.integ)
        self.A = rows.matrix(len(cols))
        self.row_lo, self.row_hi = np.asarray(rows.lo), np.asarray(rows.hi)
        self.size = ProgramSize(len(cols), int(self.integrality.sum()), len(rows.lo), int(self.A.nnz),
                                len(self.cands), len(self._ks), len(self._points))

    # ------------------------------------------------------------------ building
    def _actions_and_cuts(self, exclude: list[tuple[Action, ...]]) -> None:
        """``o_i``, ``r_i`` with ``o_i + r_i <= 1``, and (cuts): plans already replayed (their simulated
        cost is known) cut off by one no-good row each."""
        new, rows, cands = self._cols.new, self._rows, self.cands
        o = [new(0, 1, True) for _ in cands]
        r = [new(0, 1, True) if c.can_recompute else -1 for c in cands]
        self.o, self.r = o, r
        for i in range(len(cands)):
            if r[i] >= 0:
                rows.add([(o[i], 1.0), (r[i], 1.0)], hi=1.0)
        self._excluded: set[frozenset[tuple[int, int]]] = set()
        for plan in exclude:
            chosen = {self._by_tensor[a.tensor]: a.kind for a in plan if a.tensor in self._by_tensor}
            self._excluded.add(frozenset((i, int(kind)) for i, kind in chosen.items()))
            terms, ones = [], 0
            for i in range(len(cands)):
                kind = chosen.get(i)
                for v, on in ((o[i], kind == ActionKind.SWAP), (r[i], kind == ActionKind.RECOMPUTE)):
                    if v < 0:
                        continue
                    terms.append((v, -1.0 if on else 1.0))
                    ones += on
            rows.add(terms, lo=1.0 - ones)

    def _time_points(self) -> None:
        """Time points and their ``G`` (end of the previous op) and ``S`` (start of the op); (compute)
        between consecutive points; the objective ``M = S_N``."""
        n_ops, ks, new = self.sim.trace.n_ops, self._ks, self._cols.new
        pts = {0, n_ops}
        pts.update(ks)
        pts.update(k + 1 for k in ks)
        pts.update(c.act_op + 1 for c in self.cands)
        pts.update(c.next_use for c in self.cands)
        self._points = points = sorted(p for p in pts if 0 <= p <= n_ops)
        self._G = {p: new() for p in points}
        self._S = {p: new() for p in points}
        self._cols.cost[self._S[n_ops]] = 1.0  # the makespan
        for p, p2 in zip(points, points[1:]):
            self._rows.add([(self._G[p2], 1.0), (self._S[p], -1.0)], lo=float(self._cum[p2] - self._cum[p]))

    def _reruns(self, chain_depth: int) -> list[tuple[int, int, list[tuple[int, float]], float]]:
        """(re-runs): ``q[p, n] >= r_x`` over ``x``'s static closure, chained through dropped inputs
        up to ``chain_depth`` deep; (compute) of the re-runs before each point; the first row of
        (inputs of re-runs).  Returns those inputs' rows to complete at the checkpoints: (swapped
        input ``j``, ``n``, the dropped chain that reads it, least duration of a reading re-run)."""
        sim, cands, rows, new = self.sim, self.cands, self._rows, self._cols.new
        o, r, S, G, by_tensor, dur_ms = self.o, self.r, self._S, self._G, self._by_tensor, self._dur_ms
        free, alloc, inputs = self._free, self._alloc, sim.index.op_inputs
        q: dict[tuple[int, int], int] = {}
        chain_rows: set[tuple[int, int, tuple[int, ...]]] = set()
        leaf_rows: list[tuple[int, int, list[tuple[int, float]], float]] = []

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
                    q[p, n] = new(0.0, 1.0)
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
        for p in self._points:
            rows.add([(S[p], 1.0), (G[p], -1.0)] + [(v, -d) for v, d in reruns_at.get(p, ())], lo=0.0)
        return leaf_rows

    def _checkpoint_memory(self, leaf_rows: list[tuple[int, int, list[tuple[int, float]], float]]) -> None:
        """Off the device at checkpoints, and memory there (memory); the rest of (inputs of re-runs).

        Memory is checked when an op starts and whenever a copy back starts while it runs, so at each
        checkpoint k the bytes away cover its excess at two instants: when k starts (w_s: copied out by
        S_k, copied back after S_k) and when it ends (w_e: copied out by G_{k+1}, copied back from
        G_{k+1}).  A tensor may be away at one and not the other (its copy out ends, or its copy back
        starts, while k runs)."""
        sim, cands, rows, new, ks, o, r = self.sim, self.cands, self._rows, self._cols.new, self._ks, self.o, self.r
        S, G = self._S, self._G
        self._cover = cover = {k: [] for k in ks}
        for i, c in enumerate(cands):
            lo_k, hi_k = np.searchsorted(ks, c.act_op, "right"), np.searchsorted(ks, c.next_use, "left")
            for k in ks[lo_k:hi_k]:
                cover[k].append(i)
        # instant (name, its time variable at k, the time variable copies back start after)
        self._instants = instants = (("start", lambda k: S[k]), ("end", lambda k: G[k + 1]))
        ws: dict[str, dict[tuple[int, int], int]] = {name: {} for name, _ in instants}
        for k in ks:
            excess = float(sim.index.op_memory[k] - sim.memory_limit) / GIB
            for name, _ in instants:
                w = ws[name]
                for i in cover[k]:
                    w[i, k] = new(0, 1, True)
                    rows.add([(w[i, k], 1.0), (o[i], -1.0)], hi=0.0)
                terms = [(w[i, k], cands[i].nbytes / GIB) for i in cover[k]]
                terms += [(r[i], cands[i].nbytes / GIB) for i in cover[k] if r[i] >= 0]
                rows.add(terms, lo=excess)
        self.w = ws
        for j, n, link, d_read in leaf_rows:
            c = cands[j]
            for k in ks:
                for name, at in instants:
                    w = ws[name]
                    if (j, k) not in w:
                        continue
                    if k >= n:  # ... and stays from n on: not away at checkpoints in [n, n_j)
                        rows.add([(w[j, k], 1.0)] + [(v, 1.0) for v, _ in link], hi=float(len(link)))
                    else:  # away at k: its copy back starts after that instant and ends before its re-run
                        t = c.t_in + d_read
                        rows.add([(S[n], 1.0), (at(k), -1.0), (w[j, k], -t)] + [(v, -t) for v, _ in link],
                                 lo=-t * len(link))

    def _energy(self, steps: Iterable[tuple[list[tuple[int, float]], int, int]]) -> None:
        """Horn's condition for one copy engine over nested windows: ``steps`` run from the
        innermost window ``[G, S]`` outwards with the copies (variable, time) each adds; the
        copies of a window and of every window inside it fit in it.  A cumulative auxiliary
        per window keeps this linear in size."""
        acc = -1
        for terms, start, end in steps:
            if not terms and acc < 0:
                continue
            total = self._cols.new()
            self._rows.add([(total, 1.0)] + ([(acc, -1.0)] if acc >= 0 else []) + [(v, -t) for v, t in terms], lo=0.0)
            self._rows.add([(total, 1.0), (start, 1.0), (end, -1.0)], hi=0.0)
            acc = total

    def _copy_energy(self, fifo: bool) -> None:
        """(copy-out), with the D2H queue's first-in-first-out order where ``fifo``, and (copy-in),
        at both instants of every checkpoint."""
        cands, rows, new, ks, o, G, S = self.cands, self._rows, self._cols.new, self._ks, self.o, self._G, self._S
        by_release: dict[int, list[int]] = {}
        for i, c in enumerate(cands):
            by_release.setdefault(c.act_op + 1, []).append(i)
        releases = sorted(by_release)
        self._by_due = by_due = {}
        for i, c in enumerate(cands):
            by_due.setdefault(c.next_use, []).append(i)
        self._dues = dues = sorted(by_due)
        for name, at in self._instants:
            w = self.w[name]
            # "Copy-out finished by the instant": y[i, k].
            yv: dict[tuple[int, int], int] = {}
            for k in ks:
                order = self._cover[k]  # issue order (cands are sorted by leave op, then event)
                if fifo:
                    prev = -1
                    for i in order:
                        P = new(0.0, 1.0)
                        rows.add([(P, 1.0), (w[i, k], -1.0)], lo=0.0)
                        if prev >= 0:
                            rows.add([(prev, 1.0), (P, -1.0)], lo=0.0)
                        prev = P
                        yv[i, k] = new(0.0, 1.0)
                        rows.add([(yv[i, k], 1.0), (P, -1.0), (o[i], -1.0)], lo=-1.0)
                else:
                    for i in order:
                        yv[i, k] = w[i, k]
            # Copy-out energy: per checkpoint k, cumulative over release points r (latest first).
            for k in ks:
                self._energy(([(o[i], cands[i].t_out) if cands[i].next_use <= k else (yv[i, k], cands[i].t_out)
                               for i in by_release[rp] if cands[i].next_use <= k or (i, k) in yv], G[rp], at(k))
                             for rp in reversed(releases) if rp <= k)
            # Copy-back energy: per checkpoint k, cumulative over due points h (earliest first).
            for k in ks:
                self._energy(([(o[i], cands[i].t_in) if cands[i].act_op >= k else (w[i, k], cands[i].t_in)
                               for i in by_due[h] if cands[i].act_op >= k or (i, k) in w], at(k), S[h])
                             for h in dues if h > k)

    def _rerun_memory(self, rerun_points: Iterable[int]) -> None:
        """(re-run memory): memory while the re-runs before ``n`` run, only at the ops given (the
        planner adds those where a replay needed it)."""
        sim, cands, rows, new, o, r = self.sim, self.cands, self._rows, self._cols.new, self.o, self.r
        G, S, trace, by_tensor, inputs = self._G, self._S, sim.trace, self._by_tensor, sim.index.op_inputs
        free, alloc = self._free, self._alloc
        mal = sim.index.op_malloc.tolist()
        scr = trace.op_scratch.tolist()
        targets_at: dict[int, list[int]] = {}
        for i, c in enumerate(cands):
            if r[i] >= 0:
                targets_at.setdefault(c.next_use, []).append(i)
        windows = [wd for wd in actionable_windows(sim) if wd[0] not in by_tensor]
        self.away: dict[tuple[int, int], int] = {}
        for n in sorted({int(n) for n in rerun_points}):
            tg = targets_at.get(n, [])
            if not tg:
                continue
            covering = [i for i, c in enumerate(cands) if c.act_op < n < c.next_use]
            away = {}
            for i in covering:  # swapped i may be away during the re-runs: its copy-out ended before S_n
                away[i] = self.away[i, n] = new(0, 1, True)
                rows.add([(away[i], 1.0), (o[i], -1.0)], hi=0.0)
                rows.add([(S[n], 1.0), (G[cands[i].act_op + 1], -1.0), (away[i], -cands[i].t_out)], lo=0.0)
            # Tensors the program has no variable for (their window covers no checkpoint) may be away
            # too, or not yet re-created if they are targets at n: taken as away.
            others_away = sum(int(trace.tensor_nbytes[t]) for t, a, nu in windows if a < n <= nu)
            base = float(sim.index.op_memory[n] - mal[n] - scr[n] - sim.memory_limit - others_away) / GIB
            relief = [(away[i], -cands[i].nbytes / GIB) for i in covering]
            relief += [(r[i], -cands[i].nbytes / GIB) for i in covering if r[i] >= 0]
            for x in tg:
                p = alloc[cands[x].tensor]
                # the targets are not on the device before their re-runs (x is in p's outputs below)
                others = [(r[t], -cands[t].nbytes / GIB) for t in tg]
                # while p re-runs: its outputs and scratch, and every input it reads that is away
                extra = [(r[x], (mal[p] + scr[p]) / GIB)]
                lo_terms: dict[int, float] = {}
                back: list[tuple[int, float]] = []
                for yv_t in inputs[p]:
                    if 0 <= free[yv_t] < n:  # freed by the trace: re-created whenever x is
                        extra.append((r[x], float(trace.tensor_nbytes[yv_t]) / GIB))
                    elif yv_t in by_tensor:
                        j = by_tensor[yv_t]
                        cj = cands[j]
                        if j == x or not (cj.act_op < n < cj.next_use):
                            continue
                        if r[j] >= 0:
                            lo_terms[j] = cj.nbytes / GIB
                        # swapped, it is back before p re-runs (the simulator waits for it): no relief
                        # then, u >= away_j + r_x - 1
                        u = new(0.0, 1.0)
                        rows.add([(u, 1.0), (away[j], -1.0), (r[x], -1.0)], lo=-1.0)
                        back.append((u, cj.nbytes / GIB))
                if lo_terms:
                    # b_y (r_x + r_y - 1): y is re-created (and so on the device) when both are dropped
                    chain = [(r[j], b) for j, b in lo_terms.items()] + [(r[x], sum(lo_terms.values()))]
                    rows.add(relief + others + extra + back + chain, hi=-base + sum(lo_terms.values()))
                else:
                    rows.add(relief + others + extra + back, hi=-base)

    def _round_trips(self) -> None:
        """(one copy): each swap's own round trip; (shared engine) where copies are not duplex."""
        cands, G, S = self.cands, self._G, self._S
        for i, c in enumerate(cands):
            self._rows.add([(S[c.next_use], 1.0), (G[c.act_op + 1], -1.0), (self.o[i], -(c.t_out + c.t_in))], lo=0.0)
        if not self.sim.profile.duplex:
            by_due = self._by_due
            for s0 in sorted({0} | {k + 1 for k in self._ks}):
                self._energy(([(self.o[i], cands[i].t_out + cands[i].t_in) for i in by_due[h]
                               if cands[i].act_op + 1 >= s0], G[s0], S[h]) for h in self._dues if h > s0)

    # ------------------------------------------------------------------ reading
    def makespan_seconds(self, objective_ms: float) -> float:
        """The program's objective (ms from the start) as a makespan in the trace's seconds."""
        return self.sim.compute_time + (objective_ms - float(self._cum[-1])) / MS

    def actions(self, x: np.ndarray) -> tuple[Action, ...]:
        """The plan of a solution vector: swap where ``o_i``, recompute where ``r_i``.

        A swap the solution never counts away (at no checkpoint, and during no re-runs) only costs
        time in the program (setting its ``o_i`` to 0 keeps every row satisfied and the objective
        no higher), so it is left out, unless that gives back a plan the program excludes.
        """
        useful: set[int] = set()
        for w in self.w.values():
            useful.update(i for (i, _), v in w.items() if x[v] > 0.5)
        useful.update(i for (i, _), v in self.away.items() if x[v] > 0.5)
        chosen: dict[int, int] = {}
        dropped = False
        for i in range(len(self.cands)):
            if x[self.o[i]] > 0.5:
                if i in useful:
                    chosen[i] = int(ActionKind.SWAP)
                else:
                    dropped = True
            elif self.r[i] >= 0 and x[self.r[i]] > 0.5:
                chosen[i] = int(ActionKind.RECOMPUTE)
        if dropped and frozenset(chosen.items()) in self._excluded:
            chosen.update((i, int(ActionKind.SWAP)) for i in range(len(self.cands)) if x[self.o[i]] > 0.5)
        out = []
        for i, c in enumerate(self.cands):
            kind = chosen.get(i)
            if kind is not None:
                out.append(Action(c.event, c.tensor, ActionKind(kind)))
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
