"""What every baseline planner shares: the interface, trace facts, and simulated evaluation.

A planner maps a :class:`~dqn_swap.trace.Trace`, a memory limit and a device
profile to a :class:`~dqn_swap.plan.Plan` (the contract: :class:`dqn_swap.planners.Planner`).
The baselines of this package reproduce the heuristics the papers compare
against; each one reads the trace through :class:`TraceFacts` (which tensors are forward activations, where
each is last used in forward, where it is next used) and judges its
candidate plans with one :class:`Evaluator` -- a single
:class:`~dqn_swap.simulator.Simulator` per trace and limit, whose runs are
memoised, so that a planner searching a hyperparameter pays for each distinct
candidate once.

A plan's ``figures`` are the simulator's figures of its actions, so a plan
never claims more than the simulator grants: an infeasible plan is returned
as such (``figures["feasible"]`` is false).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any

import numpy as np

from dqn_swap.cost import DeviceProfile, profile_of
from dqn_swap.limits import plan_bytes
from dqn_swap.plan import Action, ActionKind, Plan
from dqn_swap.progress import Progress, progress
from dqn_swap.simulator import SimResult, Simulator
from dqn_swap.trace import EventKind, Phase, Trace

ActionSet = tuple[Action, ...]


# --------------------------------------------------------------------------- trace facts
class TraceFacts:
    """Per-tensor facts the baselines read from a trace.

    *Uses* of a tensor are the ops that touch it (malloc, read or write; a
    free is not a use); a moved tensor must be back on the device for its
    next use, as in the simulator.  An *activation* is what the offloading
    and checkpointing papers call a forward activation: a tensor autograd
    saved for backward (role ``SAVED``), produced by a forward op and used
    again after its last forward use.  Activations are listed in the order
    they become free to offload -- by the op of their last forward use
    (Layrub's reference count reaching zero, section 4.1), then by producing
    op and tensor.  The action on an activation acts at its last forward
    event, so that it leaves the device once forward no longer needs it and
    comes back before its first backward use.
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        n_t = trace.n_tensors
        use = trace.event_kind != EventKind.FREE
        ev = np.flatnonzero(use)
        order = ev[np.lexsort((ev, trace.event_tensor[ev]))]  # by tensor, then event
        bounds = np.searchsorted(trace.event_tensor[order], np.arange(n_t + 1))
        self._events_by_tensor = order
        self._bounds = bounds
        reads = np.flatnonzero(trace.event_kind == EventKind.READ)
        rorder = reads[np.lexsort((reads, trace.event_tensor[reads]))]
        self._read_ops_by_tensor = trace.event_op[rorder]
        self._read_bounds = np.searchsorted(trace.event_tensor[rorder], np.arange(n_t + 1))
        forward = trace.op_phase == Phase.FORWARD
        self.forward_ops = np.flatnonzero(forward)
        #: first op after the forward phase (``n_ops`` when there is none)
        self.backward_start = int(self.forward_ops[-1]) + 1 if len(self.forward_ops) else 0

    # ----------------------------------------------------------- per tensor
    def events_of(self, t: int) -> np.ndarray:
        """Use events (not frees) of tensor ``t``, in trace order."""
        return self._events_by_tensor[self._bounds[t]:self._bounds[t + 1]]

    def read_ops_of(self, t: int) -> np.ndarray:
        """Ops that read tensor ``t``, ascending (an op reading it twice appears twice)."""
        return self._read_ops_by_tensor[self._read_bounds[t]:self._read_bounds[t + 1]]

    def next_use_op(self, t: int, op: int) -> int:
        """First op after ``op`` that reads or writes ``t`` (where a moved ``t`` must be back); -1 when none."""
        ops = self.trace.event_op[self.events_of(t)]
        i = int(np.searchsorted(ops, op, side="right"))
        return int(ops[i]) if i < len(ops) else -1

    def last_event_at(self, t: int, op: int) -> int:
        """The last use event of ``t`` in ``op`` (the event an action after ``op`` refers to)."""
        evs = self.events_of(t)
        ops = self.trace.event_op[evs]
        i = int(np.searchsorted(ops, op, side="right")) - 1
        if i < 0 or ops[i] != op:
            raise ValueError(f"tensor {t} is not used by op {op}")
        return int(evs[i])

    @cached_property
    def op_uses(self) -> tuple[list[list[int]], list[int], list[list[int]]]:
        """Per op: the tensors it uses (ascending), the bytes it allocates, the tensors freed after it."""
        tr = self.trace
        n = tr.n_ops
        starts = np.searchsorted(tr.event_op, np.arange(n + 1)).tolist()
        kind, tensor = tr.event_kind.tolist(), tr.event_tensor.tolist()
        nbytes = tr.tensor_nbytes.tolist()
        uses: list[list[int]] = []
        mallocs: list[int] = []
        frees: list[list[int]] = []
        for op in range(n):
            evs = range(starts[op], starts[op + 1])
            uses.append(sorted({tensor[e] for e in evs if kind[e] != EventKind.FREE}))
            mallocs.append(sum(nbytes[tensor[e]] for e in evs if kind[e] == EventKind.MALLOC))
            frees.append([tensor[e] for e in evs if kind[e] == EventKind.FREE])
        return uses, mallocs, frees

    # ------------------------------------------------------------ activations
    @cached_property
    def _activations(self) -> dict[str, np.ndarray]:
        tr = self.trace
        rows: list[tuple[int, int, int, int, int]] = []
        for t in np.flatnonzero(tr.movable):
            t = int(t)
            alloc = int(tr.tensor_alloc_op[t])
            # A saved input existed before the iteration (alloc -1): it may be swapped, not recomputed.
            if alloc >= 0 and tr.op_phase[alloc] != Phase.FORWARD:
                continue
            evs = self.events_of(t)
            fwd = evs[tr.op_phase[tr.event_op[evs]] == Phase.FORWARD]
            if not len(fwd):
                continue
            event = int(fwd[-1])
            ready = int(tr.event_op[event])
            need = self.next_use_op(t, ready)
            if need < 0:
                continue
            rows.append((ready, alloc, t, event, need))
        rows.sort()
        arr = np.array(rows, dtype=np.int64).reshape(-1, 5)
        return {"ready_op": arr[:, 0], "alloc_op": arr[:, 1], "tensor": arr[:, 2],
                "event": arr[:, 3], "need_op": arr[:, 4]}

    @property
    def act_tensor(self) -> np.ndarray:
        """Activation tensors, in the order they become free to offload."""
        return self._activations["tensor"]

    @property
    def act_event(self) -> np.ndarray:
        """Each activation's last forward event: where its swap or recompute acts."""
        return self._activations["event"]

    @property
    def act_ready_op(self) -> np.ndarray:
        """Op of each activation's last forward use (from then on it can leave the device)."""
        return self._activations["ready_op"]

    @property
    def act_need_op(self) -> np.ndarray:
        """First op after the last forward use that uses the activation again (in backward)."""
        return self._activations["need_op"]

    @property
    def act_alloc_op(self) -> np.ndarray:
        """Forward op that produced each activation."""
        return self._activations["alloc_op"]

    @property
    def act_bytes(self) -> np.ndarray:
        return self.trace.tensor_nbytes[self.act_tensor]

    @property
    def n_activations(self) -> int:
        return len(self.act_tensor)

    def activation_actions(self, index: Iterable[int], kind: ActionKind = ActionKind.SWAP) -> ActionSet:
        """Actions on the activations at positions ``index`` of this order, at their last forward event."""
        ev, t = self.act_event, self.act_tensor
        return tuple(sorted(Action(int(ev[i]), int(t[i]), kind) for i in index))


# --------------------------------------------------------------------------- evaluation
class Evaluator:
    """Simulated figures of candidate action sets: one simulator, memoised runs.

    Planners that search a hyperparameter call :meth:`run` once per candidate;
    identical candidates (many settings give the same action set) are
    simulated once.  ``progress`` (:mod:`dqn_swap.progress`) hears of every
    simulation: the count and the best feasible makespan so far.
    """

    def __init__(self, trace: Trace, memory_limit: int, profile: DeviceProfile,
                 progress: Progress | None = None) -> None:
        self.trace = trace
        self.memory_limit = int(memory_limit)
        self.profile = profile
        self.simulator = Simulator(trace, self.memory_limit, profile)
        valid = self.simulator.valid_actions()
        #: per event: whether a swap / a recompute may act there (the simulator's static rules)
        self.can_swap: np.ndarray = valid.can_swap
        self.can_recompute: np.ndarray = valid.can_recompute
        self._cache: dict[ActionSet, SimResult] = {}
        self.simulations = 0
        self.progress = progress
        self.best_makespan = float("inf")  # the least makespan of a feasible candidate so far

    def run(self, actions: Iterable[Action]) -> SimResult:
        key = tuple(sorted(actions))
        result = self._cache.get(key)
        if result is None:
            result = self.simulator.run(list(key))
            self.simulations += 1
            self._cache[key] = result
            if result.feasible and result.makespan < self.best_makespan:
                self.best_makespan = float(result.makespan)
            if self.progress is not None:
                self.progress(self._report)
        return result

    def _report(self) -> str:
        best = (f", best {self.best_makespan:.4g} s ({100 * (self.best_makespan / self.simulator.compute_time - 1):.1f} "
                "% overhead)" if self.best_makespan < float("inf") else ", none fits yet")
        return f"{self.simulations:,} simulations{best}"

    def feasible(self, actions: Iterable[Action]) -> bool:
        return bool(self.run(actions).feasible)

    def best(self, candidates: Iterable[ActionSet]) -> ActionSet:
        """The candidate with the least simulated makespan among feasible ones.

        Ties go to fewer actions.  When none is feasible, the candidate whose
        failing op lacked the fewest bytes (the closest miss) is returned, so the
        planner still hands back an honest, infeasible plan.
        """
        best: ActionSet | None = None
        best_key: tuple[float, ...] | None = None
        for actions in candidates:
            key = self.rank(actions)
            if best_key is None or key < best_key:
                best, best_key = actions, key
        if best is None:
            raise ValueError("no candidate plans")
        return best

    def rank(self, actions: ActionSet) -> tuple[float, ...]:
        """Sort key: feasible before infeasible, then makespan (or shortfall), then size."""
        r = self.run(actions)
        if r.feasible:
            return (0.0, float(r.makespan), float(len(actions)))
        shortfall = float(r.infeasible.needed - r.infeasible.available) if r.infeasible else float("inf")
        return (1.0, shortfall, float(len(actions)))


def smallest_feasible(evaluator: Evaluator, candidate: Callable[[int], ActionSet], lo: int, hi: int) -> int:
    """Binary search for the first feasible of ``candidate(lo) .. candidate(hi - 1)``.

    The candidates grow in aggressiveness with their index and feasibility is
    assumed monotone along them (doing more never makes a plan infeasible);
    returns ``hi`` when even ``candidate(hi - 1)`` is infeasible.
    """
    while lo < hi:
        mid = (lo + hi) // 2
        if evaluator.feasible(candidate(mid)):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _jsonable(value: Any) -> Any:
    """``value`` with NumPy scalars and arrays turned into Python numbers and lists."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


# --------------------------------------------------------------------------- planners
class BasePlanner:
    """Template for the baselines (each a :class:`dqn_swap.planners.Planner`): subclasses implement
    :meth:`choose`.

    :meth:`plan` builds the evaluator, lets the subclass choose its actions,
    takes the figures of the chosen actions from the simulator, and records
    the planner's settings, what its search found and the number of distinct
    candidates it simulated in ``Plan.settings``.
    """

    name: str = ""
    #: One line on why the method cannot plan down to the trace's minimum memory, where it
    #: cannot (kept in an infeasible plan's settings as ``limitation``; empty: it can).
    limitation: str = ""

    def __init__(self, **settings: Any) -> None:
        unknown = set(settings) - set(self.defaults())
        if unknown:
            raise TypeError(f"planner {self.name!r} has no setting(s) {', '.join(sorted(unknown))}; "
                            f"settings: {', '.join(self.defaults()) or 'none'}")
        self.settings: dict[str, Any] = {**self.defaults(), **settings}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The planner's settings and their default values."""
        return {}

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        """The actions of the plan and what the search found (recorded in ``Plan.settings``)."""
        raise NotImplementedError

    def progress_enabled(self) -> bool | None:
        """Whether this planner reports progress (:func:`dqn_swap.progress.progress`'s ``enabled``;
        None: where progress is switched on, :func:`dqn_swap.progress.showing`)."""
        return None

    def plan(self, trace: Trace, memory_limit: int, profile: DeviceProfile | str | None = None) -> Plan:
        """Plan ``trace`` under ``memory_limit`` bytes; ``profile`` defaults to the trace's own."""
        memory_limit = plan_bytes(memory_limit, f"planner {self.name!r}")
        profile = profile_of(trace, profile)
        with progress(self.name, self.progress_enabled()) as show:
            evaluator = Evaluator(trace, memory_limit, profile, show)
            actions, found = self.choose(TraceFacts(trace), evaluator)
            evaluator.progress = None
            result = evaluator.run(actions)
        settings = {**self.settings, **found, "simulations": evaluator.simulations}
        # a planner that cannot apply to this trace says why in found["not_applicable"]
        limitation = found.get("not_applicable") or self.limitation
        if not result.feasible and limitation:
            settings["limitation"] = limitation
        return Plan(actions=Plan.sorted_actions(actions), memory_limit=int(memory_limit),
                    trace_fingerprint=trace.fingerprint, profile=profile.name, planner=self.name,
                    settings=_jsonable(settings), figures=result.figures(), schedule=result.schedule)
