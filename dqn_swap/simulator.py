"""The simulator: the ruler every plan is measured with.

Given a :class:`~dqn_swap.trace.Trace`, a memory limit, a device profile and a
set of actions (:class:`~dqn_swap.plan.Action`: swap or recompute a tensor
right after an op that touches it), :meth:`Simulator.run` replays the
iteration and returns its makespan, stalls by cause and phase, transferred
bytes, peak memory, or the first point where the plan cannot fit.  It
implements sections 4.5-4.7 of the DQN paper (Chen, "GPU memory management for
neural networks using deep Q-network": actions are the first phase only;
prefetch and recompute timing is fixed by rules; the reward is the overhead)
with the memory and transfer model of Beaumont, Eyraud-Dubois and Shilova,
"Optimal GPU-CPU offloading strategies for DNN training" (section 3.1,
assumptions (C)-(E): a copy takes ``bytes / bandwidth``, copies overlap
compute, memory is released when an offload completes and reserved when a
prefetch starts) and its no-wait policy (Proposition 1: everything happens
as early as its constraints allow).

Model
=====

**Streams.**  One compute stream runs the trace's ops in order, op ``k``
taking ``trace.op_duration[k]``.  Copies run on copy engines: with
``profile.duplex`` one device-to-host (D2H) and one host-to-device (H2D)
engine run concurrently; otherwise a single engine serves both directions.
A copy of ``n`` bytes takes ``profile.transfer_time(n, direction)``.

**Memory.**  Allocated bytes start at the trace's preexisting tensors.  When
op ``k`` starts it allocates its outputs (its ``malloc`` events, all at once)
and its inputs must be resident; its ``free`` events release memory when it
ends.  Nothing else changes memory except the plan:

* **swap** (action after op ``i`` on tensor ``X``): when op ``i`` ends a D2H
  copy of ``X`` is requested; D2H copies run one at a time in request order
  (FIFO).  ``X``'s memory is released only when its copy completes.
* **prefetch** (not an action, DQN paper 4.5): swapped tensors come back in
  order of their *next use* (earliest first; ties by tensor id), one H2D copy
  at a time, strictly in that order (the head blocks the queue).  ``X``'s
  next use is the first op after ``i`` that reads or writes it, or an earlier
  recomputation that needs it as an input (below).  The head ``Y``, needed by
  op ``n``, starts its H2D copy (and is allocated) at the first instant when
  all of these hold:

  1. its D2H copy has completed and the H2D engine is idle;
  2. it fits now: ``allocated + |Y| <= limit``;
  3. **admission rule** -- it cannot cause an excess before its use: for every
     op ``j`` from the running (or next) op up to ``n - 1``,
     ``need[j] + early[j] + pending + |Y| <= limit``.  ``need[j]`` is what op
     ``j`` requires under the plan if every swap-out completed instantly:
     the trace's memory during ``j`` minus the tensors the plan keeps away
     during ``j`` (a swapped or removed tensor is away from the op after its
     action to the op before its next use), and, for an op preceded by
     recomputations, the peak of those too.  ``early[j]`` counts tensors
     already prefetched (or in flight) whose use comes after ``j``;
     ``pending`` the bytes of swap-outs not yet completed.  This is the DQN
     paper's "if swapping in a variable does not cause any excess of memory
     usage until [its use], we will begin to prefetch the variable", made
     exact.  When op ``n`` is next the rule is void and only 1-2 apply.

  *Why no prefetch can make an op impossible:* every admitted prefetch keeps
  ``need[j] + early[j] <= limit`` for all ops up to its use, and what op
  ``j`` (or a recomputation before it) finds allocated once all pending
  swap-outs have completed is at most ``need[j] + early[j]``.  So an
  allocation that does not fit can always wait for pending swap-outs and
  then fit, unless ``need[j] > limit``: **a plan is infeasible exactly when
  some op's need exceeds the limit** (tested as a property).  An op may
  still wait for a swap-out that a concurrent prefetch's memory made
  necessary; that wait counts as ``swap_out``.

  An op that reads a swapped tensor waits until its H2D copy completes
  (stall ``"prefetch"``).  A tensor that is prefetched stays resident until
  its trace ``free``; it is not swapped again (one action per tensor).  A
  tensor needed before its swap-out completed waits for the swap-out, then
  comes back (the runtime frees the device copy when the D2H copy ends).
* **recompute** (action after op ``i`` on ``X``, DQN paper 4.5 "removing"):
  ``X`` is freed when op ``i`` ends.  Right before the next op ``n`` that
  reads ``X`` (just in time, which holds the least memory) the compute stream
  re-runs ``X``'s producer ``p = trace.tensor_alloc_op[X]`` for
  ``op_duration[p]`` seconds (stall ``"recompute"``, added to
  ``recompute_time``).  A re-run needs its inputs resident:

  - an input that is swapped out is prefetched for it (the re-run is its next
    use; it then stays resident);
  - an input that is not alive at ``n`` -- freed by the trace, or removed by
    the plan and not yet recomputed -- is recomputed recursively the same
    way, *transiently*.

  All re-runs needed before op ``n`` form one sequence: the closure of the
  producers, each run once, in trace order.  A re-run allocates all of its
  op's outputs afresh (``malloc`` bytes of ``p``, like the original run),
  keeps the outputs that are needed and frees the others when it ends; a
  transient input is freed right after the last re-run that reads it; the
  recomputed targets read by ``n`` stay resident until their trace ``free``.
  A re-run whose allocation does not fit waits for swap-outs (``"swap_out"``).

**Ties.**  At equal times a swap-out completion comes before a prefetch
start; an op's frees and swap requests happen when it ends, before a
prefetch at that instant (whose rule then starts at the next op); a
prefetch possible at the instant an op starts starts before the op's
allocation (the rule has already reserved room for it).  With one shared
engine a swap-out requested at the same instant as a possible prefetch goes
first, and a prefetch never overtakes swap-outs already queued.

**Stalls.**  Before op ``k`` the compute stream waits for prefetches of its
inputs (``"prefetch"``), runs recomputations, then waits for its allocations
to fit (``"swap_out"``: waiting for memory released by D2H copies).  Stalls are
charged to ``k``'s phase.  ``sum(stall.values()) == makespan - compute_time``
(up to rounding), and ``overhead = (makespan - compute_time) / compute_time``
(the DQN paper's reward is minus this overhead).

**Infeasible plans.**  If an allocation cannot fit even after every pending
swap-out has completed, the run stops: ``feasible`` is false, ``infeasible``
names the op, the bytes it needed and the bytes available (limit minus what
stays allocated), and ``makespan`` is the time reached when it got stuck.
Neither is comparable with a feasible plan's: ``overhead`` is then the
overhead accrued before getting stuck (stalls so far over ``compute_time``,
finite and ``>= 0``, so a step-by-step environment can difference it), and
``makespan_over_lower_bound`` is ``inf`` (``None`` in :meth:`SimResult.figures`).
The limit is never exceeded: in a feasible result ``peak_bytes <=
memory_limit`` (in an infeasible one too).  With no actions and a limit ``>=``
the trace's peak, ``makespan == compute_time`` exactly.

**Validity** (static, per event, :meth:`Simulator.valid_actions`).  An action
``(event e, tensor X)`` is valid only if ``e`` is a ``read`` or ``write`` of
``X``; ``X`` is a tensor autograd saves for backward (:attr:`Trace.movable`:
a saved activation, or an input the runtime can borrow; never a temporary,
parameter, gradient or optimizer state: the runtime moves tensors through
autograd's saved-tensor hooks); ``X`` is read or written by a later op.
Recompute additionally needs: ``X`` produced by a forward op ``p`` and never
written in place afterwards; ``p`` writes nothing in place but its own
outputs (re-running it must have no side effect); and every input of ``p``
either stays alive and unmodified from ``p`` to ``X``'s next use, or is itself
recomputable by the same rule (recursively; a temporary may be re-created this
way).  :meth:`Simulator.run` raises
``ValueError`` on an invalid action.  **At most one action per tensor**:
``run`` keeps the first action of a tensor in event order (a swap before a
recompute at the same event) and reports the others in
``SimResult.ignored_actions``; :func:`simulate` given a saved
:class:`~dqn_swap.plan.Plan` raises ``ValueError`` instead, since a plan file
should not carry dead actions.

Speed: :class:`Simulator` precomputes per-op and per-tensor tables once;
``run`` is a loop over ops on plain Python numbers that only does work at ops
where something happens (an action, a use of an acted-on tensor, a copy
event), plus a few NumPy calls per prefetch for the admission rule.
"""

from __future__ import annotations

import heapq
import math
import os
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, NamedTuple

import numpy as np

from .cost import DeviceProfile, profile_of
from .lower_bound import lower_bound
from .plan import Action, ActionKind, Plan, RecomputeStep, Schedule
from .trace import EventKind, Phase, Role, Trace, format_bytes

STALL_CAUSES = ("swap_out", "prefetch", "recompute")
PHASES = tuple(p.name.lower() for p in Phase)
# Only Trace.movable tensors (saved activations, saved inputs) are acted on; temporaries can
# still be re-created on the way to a recomputed tensor (the runtime replays the ops that made them).
_RECOMPUTABLE_INPUT_ROLES = (Role.SAVED, Role.TEMPORARY)


@dataclass(frozen=True)
class Infeasibility:
    """Where a plan could not fit.

    ``op``: the op that could not run; ``needed``: bytes the blocked allocation
    asked for (the op's outputs, a recompute re-run's outputs, or a prefetch
    for it); ``available``: the limit minus what stayed allocated after every
    pending swap-out had completed (``needed - available`` more bytes must go);
    ``reason``: which allocation.
    """

    op: int
    needed: int
    available: int
    reason: str

    def message(self, trace: Trace) -> str:
        """One line naming the op, e.g. for CLI errors and plan reports."""
        return (f"{trace.op_label(self.op)}: {self.reason} needs {format_bytes(self.needed)}, "
                f"only {format_bytes(self.available)} available after all pending swap-outs")


def _sequence_steps(ops: list[int], made: set[int], last_reader: dict[int, int],
                    alloc: list[int]) -> tuple[RecomputeStep, ...]:
    """The re-runs of one sequence as schedule steps: each op, what it keeps, what it releases after."""
    kept_by: dict[int, list[int]] = {}
    for x in made:
        kept_by.setdefault(alloc[x], []).append(x)
    released_by: dict[int, list[int]] = {}
    for y, p in last_reader.items():
        released_by.setdefault(p, []).append(y)
    none: tuple[int, ...] = ()
    steps = []
    for p in ops:
        keep = kept_by[p]
        release = released_by.get(p)
        steps.append(RecomputeStep(p, tuple(keep) if len(keep) == 1 else tuple(sorted(keep)),
                                   none if release is None else tuple(sorted(release))))
    return tuple(steps)


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated iteration; see the module docstring for the model.

    Times in seconds, sizes in bytes.  ``makespan``: end of the last op
    (feasible) or the time the run got stuck; ``compute_time``: the trace's
    sum of op durations; ``overhead``: ``(makespan - compute_time) /
    compute_time`` (stalls accrued so far when infeasible); ``stall``: by
    cause (``swap_out``, ``prefetch``, ``recompute``); ``stall_by_phase``: by
    the phase of the delayed op; ``recompute_time``: total re-run time
    (``recompute_ops`` lists the re-run ops in order); ``bytes_d2h`` /
    ``bytes_h2d``: bytes copied each way; ``peak_bytes`` / ``peak_op``: the
    highest allocation reached and the op running (or about to run) then;
    ``lower_bound``: :func:`dqn_swap.lower_bound.lower_bound` for this trace,
    limit and profile; ``infeasible``: where it got stuck; ``timeline``:
    ``(times, bytes)`` after each change of allocated memory (a step curve,
    several points may share a time), only with ``run(..., timeline=True)``;
    ``op_start``: when each op started (after its stalls and re-runs; the ops
    reached, so shorter than ``n_ops`` when infeasible), also only with it;
    ``ignored_actions``: duplicate actions on an already acted-on tensor;
    ``memory_need``: bytes each op needs under the plan if every swap-out
    completed at once (int64 per op, see :meth:`Simulator.memory_need`);
    ``schedule``: the prefetch starts and re-runs decided (a plan's
    :class:`~dqn_swap.plan.Schedule`; complete when the plan is feasible).
    """

    feasible: bool
    makespan: float
    compute_time: float
    overhead: float
    stall: dict[str, float]
    stall_by_phase: dict[str, float]
    recompute_time: float
    bytes_d2h: int
    bytes_h2d: int
    peak_bytes: int
    peak_op: int
    memory_limit: int
    lower_bound: float
    makespan_over_lower_bound: float
    infeasible: Infeasibility | None = None
    timeline: tuple[np.ndarray, np.ndarray] | None = None
    op_start: np.ndarray | None = field(default=None, repr=False, compare=False)
    ignored_actions: tuple[Action, ...] = ()
    recompute_ops: tuple[int, ...] = ()
    memory_need: np.ndarray | None = field(default=None, repr=False, compare=False)
    # what the schedule is made of: (prefetch starts, re-run sequences by op, most bytes in copies out)
    schedule_parts: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def schedule(self) -> Schedule | None:
        """The :class:`~dqn_swap.plan.Schedule` of this run, made when first asked for (most runs of
        a planner's search never need it)."""
        if self.schedule_parts is None:
            return None
        prefetch, sequences, inflight, alloc = self.schedule_parts
        return Schedule(prefetch=tuple(prefetch),
                        recompute=tuple((n, _sequence_steps(*sequences[n], alloc)) for n in sorted(sequences)),
                        max_inflight_d2h_bytes=int(inflight))


    def figures(self) -> dict[str, Any]:
        """JSON-friendly scalar figures (plan files, ``--json``); non-finite floats become ``None``."""

        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        return {
            "feasible": self.feasible,
            "makespan": num(self.makespan),
            "compute_time": num(self.compute_time),
            "overhead": num(self.overhead),
            "stall": {k: float(v) for k, v in self.stall.items()},
            "stall_by_phase": {k: float(v) for k, v in self.stall_by_phase.items()},
            "recompute_time": float(self.recompute_time),
            "recompute_runs": len(self.recompute_ops),
            "bytes_d2h": int(self.bytes_d2h),
            "bytes_h2d": int(self.bytes_h2d),
            "peak_bytes": int(self.peak_bytes),
            "peak_op": int(self.peak_op),
            "memory_limit": int(self.memory_limit),
            "lower_bound": num(self.lower_bound),
            "makespan_over_lower_bound": num(self.makespan_over_lower_bound),
            "infeasible": None if self.infeasible is None else {
                "op": self.infeasible.op, "needed": self.infeasible.needed,
                "available": self.infeasible.available, "reason": self.infeasible.reason},
            "n_ignored_actions": len(self.ignored_actions),
        }


class ValidActions(NamedTuple):
    """Static validity per event: ``can_swap[e]``, ``can_recompute[e]`` (boolean arrays)."""

    can_swap: np.ndarray
    can_recompute: np.ndarray


class _Stuck(Exception):
    """Internal: the run cannot continue (becomes an :class:`Infeasibility`)."""

    def __init__(self, op: int, needed: int, available: int, reason: str, time: float) -> None:
        super().__init__(reason)
        self.op, self.needed, self.available, self.reason, self.time = op, needed, available, reason, time


# One recompute step: (op, duration, bytes allocated, kernel scratch, bytes released after,
# swapped inputs to wait for).
_Step = tuple[int, float, int, int, int, tuple[int, ...]]


@dataclass
class _Prepared:
    """Per-run static analysis of an action set."""

    issues: dict[int, list[tuple[int, bool]]]  # op -> [(tensor, is_swap)] acted on when op ends
    special: dict[int, tuple[tuple[_Step, ...], tuple[int, ...]]]  # op -> (recompute steps, prefetch waits)
    next_use: dict[int, int]  # swapped tensor -> op of its effective next use
    need: np.ndarray  # int64 per op: requirement under the plan (admission rule's need[j])
    ignored: list[Action] = field(default_factory=list)
    # op n -> the re-runs before it, as (producer ops in order, tensors made, last re-run reading
    # each transient input); :func:`_sequence_steps` turns it into the schedule's steps
    sequences: dict[int, tuple[list[int], set[int], dict[int, int]]] = field(default_factory=dict)


class Simulator:
    """Simulates plans on one trace under one memory limit; construct once, :meth:`run` many times."""

    def __init__(self, trace: Trace, memory_limit: int, profile: DeviceProfile | None = None) -> None:
        profile = profile_of(trace, profile)
        self.trace = trace
        self.memory_limit = int(memory_limit)
        self.profile = profile
        self.compute_time = trace.compute_time
        self.lower_bound = lower_bound(trace, self.memory_limit, profile)

        n_ops, n_t, n_e = trace.n_ops, trace.n_tensors, trace.n_events
        kind, eop, ete = trace.event_kind, trace.event_op.astype(np.int64), trace.event_tensor.astype(np.int64)
        nbytes = trace.tensor_nbytes.astype(np.int64)
        alloc, free = trace.tensor_alloc_op.astype(np.int64), trace.tensor_free_op.astype(np.int64)
        is_malloc, is_free = kind == EventKind.MALLOC, kind == EventKind.FREE
        is_write = kind == EventKind.WRITE
        is_use = (kind == EventKind.READ) | is_write

        # Per-op bytes allocated at start / released at end (float sums of ints < 2**53 are exact).
        mal = np.bincount(eop[is_malloc], weights=nbytes[ete[is_malloc]], minlength=n_ops).astype(np.int64)
        fre = np.bincount(eop[is_free], weights=nbytes[ete[is_free]], minlength=n_ops).astype(np.int64)
        self._initial = int(trace.initial_bytes)
        #: bytes each op allocates for its outputs (int64 per op)
        self.op_malloc = mal
        after = self._initial + np.cumsum(mal - fre)
        # bytes allocated while op k runs, its kernel's scratch included, no plan (== trace.op_memory)
        self.op_memory = after + fre + trace.op_scratch.astype(np.int64)

        # Next op after each event's op that reads or writes the event's tensor (-1: none).
        stride = n_ops + 1
        key = ete * stride + eop
        ukeys = np.unique(key[is_use])
        idx = np.searchsorted(ukeys, key, side="right")
        cand = ukeys[np.minimum(idx, max(len(ukeys) - 1, 0))] if len(ukeys) else np.zeros(n_e, np.int64)
        same = (idx < len(ukeys)) & (cand // stride == ete)
        self.event_next_use = np.where(same, cand % stride, -1).astype(np.int64)

        # A plan acts on a saved activation right after its last forward use (Trace.action_window):
        # the runtime moves tensors through autograd's saved-tensor hooks, and the forward code holds
        # a tensor until its last forward use.  It must be back for its return op, which is the
        # first op after that reading it, or the op before which backward unpacks it if earlier
        # (Trace.saved_unpack_op: a node unpacks what it saved before its first op).
        action_op, return_op = trace.action_window
        at_action = (action_op[ete] >= 0) & (eop == action_op[ete]) & (self.event_next_use >= 0)
        self.event_next_use = np.where(at_action, np.minimum(self.event_next_use, return_op[ete]),
                                       self.event_next_use)
        can_swap = is_use & (action_op[ete] >= 0) & (eop == action_op[ete]) & (self.event_next_use >= 0)
        self._rec_limit = self._recompute_limits(kind, eop, ete, alloc, free,
                                                 np.isin(trace.tensor_role, _RECOMPUTABLE_INPUT_ROLES))
        can_rec = can_swap & (self.event_next_use <= self._rec_limit[ete])
        self._valid = ValidActions(can_swap, can_rec)

        # Plain-Python tables for the hot loop (list indexing beats NumPy scalar access).
        self._n_ops, self._n_events = n_ops, n_e
        self._ev_tensor = ete.tolist()
        self._ev_op = eop.tolist()
        self._ev_next = self.event_next_use.tolist()
        self._can_swap = can_swap.tolist()
        self._can_rec = can_rec.tolist()
        self._nbytes = nbytes.tolist()
        self._alloc = alloc.tolist()
        self._free = free.tolist()
        # Where a holder outside autograd keeps a tensor past its action, the action frees it only
        # when that holder lets it go (Trace.leave_op): its swap-out starts, and its removal takes
        # effect, after that op.
        self._held = trace.held_op.tolist()
        self._mal = mal.tolist()
        self._scr = trace.op_scratch.astype(np.int64).tolist()
        self._fre = fre.tolist()
        self._dur = trace.op_duration.tolist()
        self._oend = (trace.op_start + trace.op_duration).tolist()
        self._phase = trace.op_phase.astype(np.int64).tolist()
        self._tt_d2h = np.asarray(profile.transfer_time(nbytes, "d2h"), dtype=np.float64).tolist()
        self._tt_h2d = np.asarray(profile.transfer_time(nbytes, "h2d"), dtype=np.float64).tolist()
        # Inputs of each op (tensors it reads and did not allocate itself), for recompute closures.
        reads = kind == EventKind.READ
        order = np.argsort(eop[reads], kind="stable")
        r_op, r_t = eop[reads][order], ete[reads][order]
        bounds = np.searchsorted(r_op, np.arange(n_ops + 1))
        r_t_l, alloc_l = r_t.tolist(), self._alloc
        #: per op, the tensors it reads and did not allocate itself (a re-run's inputs)
        self.op_inputs: list[tuple[int, ...]] = [
            tuple(t for t in r_t_l[bounds[p]:bounds[p + 1]] if alloc_l[t] != p) for p in range(n_ops)]

    # ------------------------------------------------------------- validity
    @staticmethod
    def _stable_tensors(kind: np.ndarray, eop: np.ndarray, ete: np.ndarray, alloc: np.ndarray,
                        n_t: int) -> np.ndarray:
        """Tensors never written after the op that allocated them."""
        w = kind == EventKind.WRITE
        later = w & (eop != alloc[ete])
        stable = np.ones(n_t, dtype=bool)
        stable[ete[later]] = False
        return stable

    def _recompute_limits(self, kind: np.ndarray, eop: np.ndarray, ete: np.ndarray, alloc: np.ndarray,
                          free: np.ndarray, role_ok: np.ndarray) -> np.ndarray:
        """Per tensor, the last op ``n`` before which it can be recomputed (-1: never).

        ``rec(T, n)`` (module docstring) is monotone in ``n``: inputs alive at a
        later op are alive at an earlier one.  So it is ``n <= limit[T]``, with
        ``limit[T] = min over inputs Y of producer p of
        max(min(free_op[Y], next write of Y after p), limit[Y])``.
        """
        trace = self.trace
        n_ops, n_t = trace.n_ops, trace.n_tensors
        big = n_ops + 1
        stable = self._stable_tensors(kind, eop, ete, alloc, n_t)
        w = kind == EventKind.WRITE
        # Ops writing something they did not allocate have side effects: never re-run them.
        side_effect = np.zeros(n_ops, dtype=bool)
        side_effect[eop[w & (alloc[ete] != eop)]] = True
        # Next write of each tensor after each read event's op.
        stride = n_ops + 1
        wkeys = np.unique(ete[w] * stride + eop[w])
        reads = np.flatnonzero(kind == EventKind.READ)
        rkey = ete[reads] * stride + eop[reads]
        j = np.searchsorted(wkeys, rkey, side="right")
        wc = wkeys[np.minimum(j, max(len(wkeys) - 1, 0))] if len(wkeys) else np.zeros(len(reads), np.int64)
        next_write = np.where((j < len(wkeys)) & (wc // stride == ete[reads]), wc % stride, big)
        alive_lim = np.where(free < 0, big, free)
        leaf_lim = np.minimum(alive_lim[ete[reads]], next_write)  # Y usable as a leaf at n <= this

        producer_ok = (trace.op_phase == Phase.FORWARD) & ~side_effect
        produced = alloc >= 0
        base_ok = role_ok & stable & produced
        base_ok[produced] &= producer_ok[alloc[produced]]

        # Per producer op: min over its inputs; tensors processed in producer order (inputs come first).
        limit = np.full(n_t, -1, dtype=np.int64)
        r_ops = eop[reads].tolist()
        r_ts = ete[reads].tolist()
        leaf_l = leaf_lim.tolist()
        alloc_l = alloc.tolist()
        # Group reads by op (events are in op order already).
        by_op: dict[int, list[tuple[int, int]]] = {}
        for o, t, lf in zip(r_ops, r_ts, leaf_l):
            if alloc_l[t] != o and producer_ok[o]:
                by_op.setdefault(o, []).append((t, lf))
        limit_l = limit.tolist()
        outputs_by_op: dict[int, list[int]] = {}
        for t in np.flatnonzero(base_ok).tolist():
            outputs_by_op.setdefault(alloc_l[t], []).append(t)
        for p in sorted(outputs_by_op):
            b = big
            for t, lf in by_op.get(p, ()):
                v = lf if lf > limit_l[t] else limit_l[t]
                if v < b:
                    b = v
            for t in outputs_by_op[p]:
                limit_l[t] = b
        return np.asarray(limit_l, dtype=np.int64)

    def valid_actions(self) -> ValidActions:
        """Static validity of actions per event (the DQN environment's mask).

        ``can_swap[e]`` / ``can_recompute[e]``: whether swapping / removing
        ``trace.event_tensor[e]`` right after ``trace.event_op[e]`` is valid
        (module docstring, "Validity").  The at-most-one-action-per-tensor rule
        is dynamic and not part of this mask.
        """
        return self._valid

    def why_invalid(self, action: Action) -> str | None:
        """``None`` if ``action`` is valid, else a one-line reason."""
        e, t, k = action.event, action.tensor, action.kind
        trace = self.trace
        if k not in (ActionKind.SWAP, ActionKind.RECOMPUTE):
            return f"{action}: unknown action kind {k!r}"
        if not isinstance(e, (int, np.integer)) or not 0 <= e < trace.n_events:
            return f"{action}: event {e} is outside the trace (0..{trace.n_events - 1})"
        if not isinstance(t, (int, np.integer)) or self._ev_tensor[e] != t:
            return f"{action}: event {e} touches tensor {self._ev_tensor[e]}, not {t}"
        name = "swap" if k == ActionKind.SWAP else "recompute"
        ok = self._can_swap[e] if k == ActionKind.SWAP else self._can_rec[e]
        if ok:
            return None
        where = f"{action}: cannot {name} tensor {t} after {trace.op_label(self._ev_op[e])}"
        ek = EventKind(trace.event_kind[e])
        if ek not in (EventKind.READ, EventKind.WRITE):
            return f"{where}: event {e} is a {ek.name.lower()}, not a read or write"
        role = Role(trace.tensor_role[t])
        if not trace.movable[t]:
            return f"{where}: it is a {role.name.lower()} (only tensors autograd saves for backward move)"
        if self._ev_next[e] < 0:
            return f"{where}: it is not used again"
        action_op = int(trace.action_window[0][t])
        if action_op < 0:
            return f"{where}: it has no forward use a plan could act after"
        if self._ev_op[e] != action_op:
            return (f"{where}: a plan acts on a saved activation only after its last forward use, "
                    f"{trace.op_label(action_op)}")
        p = self._alloc[t]
        if p < 0:
            return f"{where}: it existed before the iteration, nothing can recompute it"
        if trace.op_phase[p] != Phase.FORWARD:
            return f"{where}: its producer {trace.op_label(p)} is not a forward op"
        return (f"{where}: re-running {trace.op_label(p)} before op #{self._ev_next[e]} would not give "
                "the same value (it or an input is modified in place, or an input is gone and "
                "cannot be recomputed)")

    # -------------------------------------------------------------- prepare
    def _prepare(self, actions: Iterable[Action]) -> _Prepared:
        """Validate, deduplicate and analyse an action set (everything that does not need time)."""
        ev_t, ev_op, ev_next = self._ev_tensor, self._ev_op, self._ev_next
        can_s, can_r = self._can_swap, self._can_rec
        n_e = self._n_events
        items: list[tuple[int, int, int]] = []
        for a in actions:
            e, t, k = a.event, a.tensor, a.kind
            try:
                ok = (0 <= e < n_e and ev_t[e] == t
                      and (can_s[e] if k == 0 else can_r[e] if k == 1 else False))
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(f"invalid action: {self.why_invalid(a)}")
            items.append((int(e), 1 if k == 1 else 0, int(t)))
        items.sort()

        nbytes, alloc, free, mal = self._nbytes, self._alloc, self._free, self._mal
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
            if self._held[t] > i:
                i = self._held[t]
            (removed if k else swapped)[t] = (i, ev_next[e])
            issues.setdefault(i, []).append((t, not k))

        next_use = {t: n for t, (_, n) in swapped.items()}
        scr = self._scr
        sequences: dict[int, tuple[list[int], set[int], dict[int, int]]] = {}
        steps_at: dict[int, tuple[_Step, ...]] = {}
        extra_need: dict[int, int] = {}  # op -> peak of its recompute sequence above what stays resident
        target_bytes: dict[int, int] = {}
        if removed:
            targets: dict[int, list[int]] = {}
            for t, (_, n) in removed.items():
                targets.setdefault(n, []).append(t)
            inputs, dur = self.op_inputs, self._dur
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
        special: dict[int, tuple[tuple[_Step, ...], tuple[int, ...]]] = {}
        for n in set(steps_at) | set(waits):
            special[n] = (steps_at.get(n, ()), tuple(sorted(waits.get(n, ()))))

        # need[j]: memory during op j if swap-outs completed instantly.
        n_ops = self._n_ops
        away_from, away_to, away_bytes = [], [], []
        for t, (i, _) in swapped.items():
            away_from.append(i + 1), away_to.append(next_use[t]), away_bytes.append(nbytes[t])
        for t, (i, n) in removed.items():
            away_from.append(i + 1), away_to.append(n), away_bytes.append(nbytes[t])
        if away_bytes:
            w = np.asarray(away_bytes, dtype=np.float64)
            delta = (np.bincount(away_from, weights=w, minlength=n_ops + 1)
                     - np.bincount(away_to, weights=w, minlength=n_ops + 1))
            need = self.op_memory - np.cumsum(delta[:n_ops]).astype(np.int64)
        else:
            need = self.op_memory.copy()
        for n, extra in extra_need.items():
            before = int(need[n]) - mal[n] - scr[n] - target_bytes[n]
            if before + extra > need[n]:
                need[n] = before + extra
        return _Prepared(issues, special, next_use, need, ignored, sequences)

    def memory_need(self, actions: Iterable[Action] = ()) -> np.ndarray:
        """Bytes each op needs under ``actions`` if every swap-out completed at once
        (int64 per op; the admission rule's ``need``, a lower bound on what :meth:`run` sees)."""
        return self._prepare(actions).need

    def instant_copy_memory(self, actions: Iterable[Action], schedule: Schedule) -> np.ndarray:
        """Bytes allocated at each op when ``schedule`` is followed with copies that take no time.

        What a synchronous runtime (the CPU) holds: a swapped tensor leaves when
        its action's op ends and is back from the op at which the runtime
        starts its prefetch (the first of :attr:`Trace.progress_ops` at or after
        the schedule's op: in backward the runtime gets control only when a node
        unpacks its saved tensors) until it dies, a removed tensor is away until
        the re-runs before its next use.  It is :meth:`memory_need` plus every
        prefetch counted from its start: the simulator's own curve with the
        swap-out delays taken away.  int64 per op.
        """
        prep = self._prepare(actions)
        mem = prep.need.copy()
        points = self.trace.progress_ops
        for tensor, op in schedule.prefetch:
            use = prep.next_use.get(tensor)
            if points is not None:
                # The runtime starts it at the first point at or after ``op`` where it learns how far
                # the iteration has come (a pack, or a node's unpacks in backward: Trace.progress_ops).
                j = int(np.searchsorted(points, op, side="left"))
                op = int(points[j]) if j < len(points) else self._n_ops
            if use is not None and use > op:
                mem[op:use] += self._nbytes[tensor]
        return mem

    # ------------------------------------------------------------------ run
    def run(self, actions: Iterable[Action] = (), *, timeline: bool = False,
            overcommit: bool = False) -> SimResult:
        """Simulate ``actions``; raises ``ValueError`` on an invalid action (see ``valid_actions``).

        ``overcommit=True``: where the plan does not fit, record the first such
        point (``infeasible``) and go on as if the device had just enough more
        memory from then on (the limit is raised by the shortfall; a prefetch
        that could never start is started when its tensor is needed), so that
        ``makespan`` and ``overhead`` cover the whole iteration.  A plan that
        fits runs exactly as without it.  The environment uses this to charge
        every action its whole cost when it is taken (section 4.7).
        """
        prep = self._prepare(actions)
        return self._simulate(prep, timeline, overcommit)

    def _simulate(self, prep: _Prepared, want_timeline: bool,  # noqa: C901 (one hot loop)
                  overcommit: bool = False) -> SimResult:
        INF = math.inf
        limit = self.memory_limit
        nbytes, tt_d2h, tt_h2d = self._nbytes, self._tt_d2h, self._tt_h2d
        dur, mal, fre, phase, scr = self._dur, self._mal, self._fre, self._phase, self._scr
        n_ops = self._n_ops
        BIG = n_ops + 1
        duplex = self.profile.duplex
        need_arr = prep.need.copy()  # raised below where a prefetch starts early; prep.need stays the plan's
        next_use = prep.next_use
        # One list lookup per op: (recompute steps and prefetch waits before it, actions after it).
        todo: list[Any] = [None] * n_ops
        for k, sp in prep.special.items():
            todo[k] = (sp, None)
        for k, iss in prep.issues.items():
            todo[k] = (todo[k][0] if todo[k] is not None else None, iss)
        maxacc = np.maximum.accumulate

        mem = self._initial
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
            """Start the H2D copy of the head of the prefetch queue at ``st`` (it is allocated now)."""
            nonlocal mem, peak, peak_op, h2d_free, d2h_free, bytes_h2d, version
            n, y_t = heapq.heappop(heap)
            y = nbytes[y_t]
            mem += y
            if mem + running > peak:
                peak, peak_op = mem + running, k0
            prefetch_log.append((y_t, k0))
            e = st + tt_h2d[y_t]
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
                if k >= pf_gate:
                    eval_head(k, t)
                if nxt <= t:
                    advance(t, k, True)
                here = todo[k]
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
                            t2 = wait_memory(amount + scratch, k, t, f"recomputing with {self.trace.op_label(p)}")
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
            return self._result(False, stuck.time, st_swap, st_pf, st_rec, ph_stall, recompute_ops,
                                bytes_d2h, bytes_h2d, peak, peak_op, prep,
                                Infeasibility(stuck.op, int(stuck.needed), int(stuck.available), stuck.reason),
                                tl_t, tl_b, prefetch_log=prefetch_log, max_pending=max_pending, op_starts=op_starts)
        makespan = self.compute_time + (t - self._oend[-1]) if n_ops else 0.0
        if first_stuck:  # overcommit mode: the whole iteration, but it did not fit
            stuck = first_stuck[0]
            return self._result(False, makespan, st_swap, st_pf, st_rec, ph_stall, recompute_ops,
                                bytes_d2h, bytes_h2d, peak, peak_op, prep,
                                Infeasibility(stuck.op, int(stuck.needed), int(stuck.available), stuck.reason),
                                tl_t, tl_b, whole=True, prefetch_log=prefetch_log, max_pending=max_pending, op_starts=op_starts)
        return self._result(True, makespan, st_swap, st_pf, st_rec, ph_stall, recompute_ops,
                            bytes_d2h, bytes_h2d, peak, peak_op, prep, None, tl_t, tl_b,
                            prefetch_log=prefetch_log, max_pending=max_pending, op_starts=op_starts)

    def _result(self, feasible: bool, makespan: float, st_swap: float, st_pf: float, st_rec: float,
                ph_stall: list[float], recompute_ops: list[int], bytes_d2h: int, bytes_h2d: int,
                peak: int, peak_op: int, prep: _Prepared, infeasible: Infeasibility | None,
                tl_t: list[float] | None, tl_b: list[int], whole: bool = False,
                prefetch_log: list[tuple[int, int]] | None = None, max_pending: int = 0,
                op_starts: list[float] | None = None) -> SimResult:
        T = self.compute_time
        schedule_parts = (prefetch_log or (), prep.sequences, max_pending, self._alloc)
        lb = self.lower_bound
        timeline = op_start = None
        if tl_t is not None:
            times, values = np.asarray(tl_t, dtype=np.float64), np.asarray(tl_b, dtype=np.int64)
            keep = np.ones(len(values), dtype=bool)
            keep[1:-1] = values[1:-1] != values[:-2]  # drop points that change nothing; keep the end
            timeline = (times[keep], values[keep])
            op_start = np.asarray(op_starts, dtype=np.float64)
        if feasible:
            overhead = (makespan - T) / T if T > 0 else 0.0
            ratio = makespan / lb if lb > 0 else (1.0 if makespan == 0 else math.inf)
        elif whole:  # overcommitted: the overhead of the whole iteration
            overhead = (makespan - T) / T if T > 0 else 0.0
            ratio = math.inf
        else:  # stuck: the overhead accrued so far (finite, >= 0: environments difference it)
            overhead = (st_swap + st_pf + st_rec) / T if T > 0 else 0.0
            ratio = math.inf
        return SimResult(
            feasible=feasible, makespan=makespan, compute_time=T, overhead=overhead,
            stall={"swap_out": st_swap, "prefetch": st_pf, "recompute": st_rec},
            stall_by_phase=dict(zip(PHASES, ph_stall)),
            recompute_time=st_rec, bytes_d2h=bytes_d2h, bytes_h2d=bytes_h2d,
            peak_bytes=peak, peak_op=peak_op, memory_limit=self.memory_limit,
            lower_bound=lb, makespan_over_lower_bound=ratio,
            infeasible=infeasible, timeline=timeline, op_start=op_start, ignored_actions=tuple(prep.ignored),
            recompute_ops=tuple(recompute_ops), memory_need=prep.need, schedule_parts=schedule_parts)


def schedule_plan(trace: Trace, plan: Plan, profile: DeviceProfile | None = None) -> Plan:
    """``plan`` with the :class:`~dqn_swap.plan.Schedule` the simulator decides for it (unchanged if
    it has one): what a version 1 plan file or a plan made by hand lacks for the runtime."""
    if plan.schedule is not None:
        return plan
    result = simulate(trace, plan, profile=profile)
    return plan.with_schedule(result.schedule)


def instant_copy_peak(trace: Trace, plan: Plan, result: SimResult | None = None) -> int:
    """The peak a synchronous runtime (the CPU) holds when it follows ``plan``: the most of
    :meth:`Simulator.instant_copy_memory` under the plan's schedule (``result``: its simulation,
    when already at hand).  What measured CPU peaks are compared with."""
    schedule = (result if result is not None else simulate(trace, plan)).schedule
    return int(Simulator(trace, plan.memory_limit).instant_copy_memory(plan.actions, schedule).max())


def simulate(trace: Trace, plan_or_actions: Plan | Iterable[Action], memory_limit: int | None = None,
             profile: DeviceProfile | None = None, *, timeline: bool = False,
             overcommit: bool = False) -> SimResult:
    """Simulate a :class:`~dqn_swap.plan.Plan` (limit and profile from the plan unless given) or actions.

    A plan must match the trace (fingerprint) and carry at most one action per
    tensor (``ValueError`` otherwise); a plain iterable follows
    :meth:`Simulator.run` (later duplicates ignored and reported).
    """
    from .checks import expect

    expect(trace, Trace, "trace")
    if isinstance(plan_or_actions, (str, bytes, os.PathLike)):
        raise TypeError("plan_or_actions must be a dqn_swap Plan (Plan.load(path) reads a file) or actions, "
                        f"not {type(plan_or_actions).__name__}")
    if isinstance(plan_or_actions, Plan):
        plan = plan_or_actions
        plan.check_trace(trace)
        tensors = [a.tensor for a in plan.actions]
        if len(set(tensors)) != len(tensors):
            dup = sorted({t for t in tensors if tensors.count(t) > 1})
            raise ValueError(f"plan has more than one action on tensor(s) {dup[:10]}; "
                             "a tensor is swapped or recomputed at most once")
        if memory_limit is None:
            memory_limit = plan.memory_limit
        if profile is None and plan.profile:
            profile = profile_of(trace, plan.profile)
        actions: Iterable[Action] = plan.actions
    else:
        actions = plan_or_actions
    if memory_limit is None:
        raise ValueError("memory_limit is required when simulating bare actions")
    return Simulator(trace, memory_limit, profile).run(actions, timeline=timeline, overcommit=overcommit)
