"""A lower bound on the makespan of any feasible plan (swap and recompute).

Proposition 3 of Beaumont, Eyraud-Dubois and Shilova, "Optimal GPU-CPU
offloading strategies for DNN training" (Euro-Par 2020) bounds the makespan of
any offloading schedule by ``LB = max(sum of compute, 2 (M_peak - M_gpu) / beta)``:
every op must run, and the excess ``M_peak - M_gpu`` must go to the host and
come back over a link of bandwidth ``beta``.  :func:`lower_bound` adapts it to
the simulator's model (:mod:`dqn_swap.simulator`) and extends it to
recomputation.

Notation: ``T`` the trace's compute time (sum of op durations), ``k`` the op
where the unplanned trace peaks, ``E = peak - limit`` the excess,
``d_k`` the duration of op ``k``, ``c = 1/bw_d2h + 1/bw_h2d`` and ``l`` the
per-copy latency of the profile.

**Claim.**  Every feasible simulated plan has makespan ``>= LB`` with::

    LB = T                                                    if E <= 0
    LB = min over r in [0, min(E, R)] of max(T + rho*r, X(E - r))   otherwise
    X(s) = 2 l + d_k + s c  for s > 0,   X(0) = 0

where ``R`` is the number of bytes alive at the peak that could be removed for
recompute and ``rho`` the cheapest recompute cost per byte among them
(defined below).

**Proof.**  While op ``k`` runs, the resident bytes are the trace's
``op_memory[k]`` minus what the plan keeps off the device, and they must stay
``<= limit``: at every instant of op ``k`` at least ``E`` bytes are off the
device.  Removed (recompute) tensors only leave at op ends and only come back
through recomputation on the compute stream, so the removed part ``r`` is
constant during op ``k``; swapped tensors then account for ``s >= E - r``
bytes at every instant of op ``k``.

* *Transfers.*  A swapped tensor's memory is released only when its D2H copy
  completes, so the ``s`` bytes off the device when op ``k`` starts were
  copied out by then: op ``k`` starts at ``>= l + s/bw_d2h`` (one D2H engine;
  ``n`` copies cost ``n l >= l``).  The swapped bytes still off the device when
  op ``k`` ends are read again later (swaps need a later use), and their H2D
  copies, which allocate memory at their start, start after op ``k`` ends: the
  makespan is ``>= l + s/bw_d2h + d_k + l + s/bw_h2d = X(s) >= X(E - r)``.
  The two legs are separated in time by op ``k``, so a second copy engine
  (duplex) does not shorten this bound; it is the paper's ``2x/beta`` with
  one bandwidth per direction.
* *Recompute.*  Each removed tensor ``X`` off the device at op ``k`` is
  recomputed after ``k`` by re-running its producer ``p``, ``d_p`` seconds on
  the compute stream on top of ``T``.  One re-run of ``p`` restores at most
  ``B_p`` bytes (``p``'s outputs among the candidates below), so the removed
  bytes ``r`` cost at least ``sum_p d_p >= rho r`` with
  ``rho = min_p d_p / B_p``: the makespan is ``>= T + rho r``.

Hence makespan ``>= max(T + rho r, X(E - r))`` for the plan's own ``r``; when
``r >= E`` this is ``>= T + rho E``, the value at ``r = E`` (``X(0) = 0``).
The minimum over ``r`` is a bound for every plan.  ``f(r) = T + rho r``
increases and ``X(E - r)`` decreases on ``[0, E)``, so the minimum of their
maximum lies at their crossing ``r* = (2l + d_k + E c - T) / (rho + c)``
clipped to the allowed interval, or at ``r = E``: a closed form, computed in
:func:`lower_bound`.

*Candidates.*  A tensor can be off the device during op ``k`` only if it is
alive there in the trace, allocated before ``k``, movable
(:attr:`~dqn_swap.trace.Trace.movable`), and read or written again after ``k`` (the simulator's static
validity).  Recompute candidates are those among them never written after
they were made, produced by a forward op that writes nothing else in place.
Using a superset of what the simulator allows (the producer's inputs are not
checked) only lowers ``LB``, which keeps it a bound.  If fewer than ``E`` candidate bytes exist no plan is
feasible and any value is a (vacuous) bound; the formula is returned anyway.
"""

from __future__ import annotations

import math

import numpy as np

from .cost import DeviceProfile
from .trace import EventKind, Phase, Trace


def recompute_candidates(trace: Trace, op: int) -> tuple[np.ndarray, np.ndarray]:
    """Tensors that a plan could keep off the device during ``op``.

    Returns ``(swap, recompute)``: two boolean masks over tensors.
    """
    alloc, free = trace.tensor_alloc_op, trace.tensor_free_op
    use = (trace.event_kind == EventKind.READ) | (trace.event_kind == EventKind.WRITE)
    used_later = np.zeros(trace.n_tensors, dtype=bool)
    used_later[trace.event_tensor[use & (trace.event_op > op)]] = True
    alive = (alloc < op) & ((free == -1) | (free >= op))
    role_ok = trace.movable
    swap = alive & role_ok & used_later
    # Recompute needs (simulator's validity) a forward producer without side effects and a
    # tensor never written after it was made; the producer's inputs are not checked (superset).
    write = trace.event_kind == EventKind.WRITE
    foreign = write & (alloc[trace.event_tensor] != trace.event_op)
    stable = np.ones(trace.n_tensors, dtype=bool)
    stable[trace.event_tensor[foreign]] = False
    clean_op = np.ones(trace.n_ops, dtype=bool)
    clean_op[trace.event_op[foreign]] = False
    ok = np.zeros(trace.n_tensors, dtype=bool)
    produced = alloc >= 0
    ok[produced] = (trace.op_phase[alloc[produced]] == Phase.FORWARD) & clean_op[alloc[produced]]
    return swap, swap & ok & stable


def lower_bound_at(trace: Trace, op: int, memory_limit: int, profile: DeviceProfile) -> float:
    """The bound of the module docstring for the excess at ``op`` (any op, not only the peak)."""
    T = trace.compute_time
    excess = int(trace.op_memory[op]) - int(memory_limit)
    if excess <= 0:
        return T
    _, rec = recompute_candidates(trace, op)
    producers = trace.tensor_alloc_op[rec]
    if len(producers):
        per_op = np.bincount(producers, weights=trace.tensor_nbytes[rec].astype(np.float64),
                             minlength=trace.n_ops)
        ops = np.flatnonzero(per_op > 0)
        rho = float(np.min(trace.op_duration[ops] / per_op[ops])) if len(ops) else math.inf
        r_max = float(per_op.sum())
    else:
        rho, r_max = math.inf, 0.0
    E = float(excess)
    c = 1.0 / profile.d2h_bandwidth + 1.0 / profile.h2d_bandwidth
    a = 2.0 * profile.transfer_latency + float(trace.op_duration[op])

    def value(r: float) -> float:
        compute = T + (rho * r if r > 0 else 0.0)  # rho may be inf when r == 0
        transfer = a + (E - r) * c if r < E else 0.0
        return max(compute, transfer)

    hi = min(E, r_max)
    candidates = [0.0]
    if math.isfinite(rho):
        cross = (a + E * c - T) / (rho + c)
        candidates.append(min(max(cross, 0.0), hi))
        candidates.append(hi)
    return min(value(r) for r in candidates)


def lower_bound(trace: Trace, memory_limit: int, profile: DeviceProfile) -> float:
    """Lower bound on the makespan of any feasible plan under ``memory_limit``.

    Proposition 3 of the offloading paper at the trace's unplanned peak,
    extended to recomputation; see the module docstring for the proof.
    """
    if trace.n_ops == 0:
        return 0.0
    return lower_bound_at(trace, trace.peak_op, memory_limit, profile)
