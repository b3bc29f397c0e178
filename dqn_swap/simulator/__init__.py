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

  **Where the runtime has control** (:attr:`Simulator.points`, by default
  :attr:`Trace.progress_ops`: the packs of the forward pass and the ops at
  which an autograd node unpacks its saved tensors in backward; a trace that
  does not know its unpacks has none, and the rule above applies as written):
  the runtime can start a prefetch only there, since between two of them a
  node's ops run back to back.  So a *gated* run issues the head only at the
  start of such an op, or of an op that waits for a copy back or re-runs ops
  first (and again once those are over); it is allocated when issued and its
  H2D copy starts when the engine is free.  Conditions 2-3 hold at the issue,
  1 becomes "its D2H copy has completed", and heads are issued one after the
  other at one point for as long as the engine would be free before the next
  point's op starts (without stalls), or their use is the op itself: queued
  further ahead, they would hold memory early and fix an order that a later
  swap-out with an earlier use could not overtake.  A head blocked at a point
  is looked at again at the next one.  Without this, the runtime started
  those prefetches at the next point after the simulated start, and
  transformers' steps on the virtual clock (:mod:`dqn_swap.runtime.clock`)
  ran up to 4.8 % over their makespan; with it, every plan of that benchmark
  runs within 1.7 % (docs/runtime.md).

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

Implementation
==============

By concern: :mod:`~dqn_swap.simulator.index` (the trace's static tables, built once:
next uses, op memory, op inputs, recompute limits), :mod:`~dqn_swap.simulator.validity`
(:meth:`Simulator.valid_actions`, :meth:`Simulator.why_invalid`),
:mod:`~dqn_swap.simulator.analysis` (per plan, what needs no time: deduplication,
recompute closures, ``need``), :mod:`~dqn_swap.simulator.engine` (the time loop),
:mod:`~dqn_swap.simulator.result` (:class:`SimResult`, :class:`Infeasibility`, and
:class:`RunSummary`, what :meth:`Simulator.run_summary` gives a step-by-step environment).

Two engines give the same results bit for bit: the reference
(:mod:`~dqn_swap.simulator.engine`, a loop on Python numbers that only does work
where something happens) and its line-by-line port to Numba
(:mod:`~dqn_swap.simulator.compiled`, the default; ``Simulator(..., engine="python")``
or ``DQN_SWAP_ENGINE=python`` select the reference; runs with a timeline use it).
"""

from __future__ import annotations

from .analysis import Analysis
from .index import TraceIndex
from .result import PHASES, STALL_CAUSES, Infeasibility, RunSummary, SimResult
from .simulator import (ENGINES, Simulator, default_engine, instant_copy_peak, schedule_plan, simulate,
                        swap_out_ops, verify_plan)
from .validity import ValidActions

__all__ = ["ENGINES", "PHASES", "STALL_CAUSES", "Analysis", "Infeasibility", "RunSummary", "SimResult", "Simulator",
           "TraceIndex", "ValidActions", "default_engine", "instant_copy_peak", "schedule_plan", "simulate",
           "swap_out_ops", "verify_plan"]
