"""What a simulation returns: :class:`SimResult` (figures, schedule) and :class:`Infeasibility`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..plan import Action, RecomputeStep, Schedule
from ..trace import Phase, Trace, format_bytes

STALL_CAUSES = ("swap_out", "prefetch", "recompute")
PHASES = tuple(p.name.lower() for p in Phase)


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
    ``swap_out_end``: per swapped tensor, when its copy to the host ended, also
    only with it (:func:`dqn_swap.simulator.swap_out_ops`);
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
    # what the schedule is made of: (prefetch starts, re-run sequences by op, most bytes in copies out,
    # producer per tensor), or a function that returns them
    schedule_parts: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    # with ``run(..., timeline=True)``: per swapped tensor, when its copy to the host ended
    swap_out_end: dict[int, float] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def schedule(self) -> Schedule | None:
        """The :class:`~dqn_swap.plan.Schedule` of this run, made when first asked for (most runs of
        a planner's search never need it)."""
        parts = self.schedule_parts
        if parts is None:
            return None
        if callable(parts):  # the compiled engine's tables, turned into the same parts when asked for
            parts = parts()
        prefetch, sequences, inflight, alloc = parts
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



_FIELDS = tuple(SimResult.__dataclass_fields__)


def overhead_of(feasible: bool, whole: bool, makespan: float, compute_time: float, st_swap: float,
                st_pf: float, st_rec: float) -> float:
    """:attr:`SimResult.overhead` from an engine's counters (section 4.7 of the DQN paper: the
    reward is minus it).

    ``(makespan - T) / T`` for a feasible run or a whole overcommitted one (``whole``), the
    stalls accrued before getting stuck over ``T`` otherwise (finite, ``>= 0``: environments
    difference it); 0 when ``T`` is 0."""
    T = compute_time
    if feasible or whole:
        return (makespan - T) / T if T > 0 else 0.0
    return (st_swap + st_pf + st_rec) / T if T > 0 else 0.0


class RunSummary:
    """The figures of one simulation that a step-by-step environment reads at every step, with
    the full :class:`SimResult` of the same run built only when :attr:`result` is first asked
    for (:meth:`Simulator.run_summary`).

    ``feasible``, ``overhead``, ``peak_bytes``, ``peak_op`` and ``memory_need`` are those of
    :attr:`result`; ``stuck_op`` is ``result.infeasible.op`` and ``shortfall`` is
    ``result.infeasible.needed - result.infeasible.available`` (-1 and 0 when the plan fits).
    """

    __slots__ = ("feasible", "overhead", "stuck_op", "shortfall", "peak_bytes", "peak_op", "memory_need",
                 "_result", "_build")

    def __init__(self, feasible: bool, overhead: float, stuck_op: int, shortfall: int, peak_bytes: int,
                 peak_op: int, memory_need: np.ndarray, build: Any) -> None:
        self.feasible, self.overhead, self.stuck_op, self.shortfall = feasible, overhead, stuck_op, shortfall
        self.peak_bytes, self.peak_op, self.memory_need = peak_bytes, peak_op, memory_need
        self._result: SimResult | None = None
        self._build = build  # () -> SimResult

    @classmethod
    def of(cls, result: SimResult) -> RunSummary:
        """The summary of a result already at hand."""
        inf = result.infeasible
        summary = cls(result.feasible, result.overhead, -1 if inf is None else inf.op,
                      0 if inf is None else inf.needed - inf.available, result.peak_bytes, result.peak_op,
                      result.memory_need, None)
        summary._result = result
        return summary

    @property
    def result(self) -> SimResult:
        """The full :class:`SimResult` of this run (made once, when first asked for)."""
        if self._result is None:
            self._result = self._build()
            self._build = None
        return self._result


def make_result(feasible: bool, whole: bool, makespan: float, compute_time: float, st_swap: float,
                st_pf: float, st_rec: float, ph_stall: Any, bytes_d2h: int, bytes_h2d: int, peak: int,
                peak_op: int, memory_limit: int, lower_bound: float, infeasible: Infeasibility | None,
                timeline: tuple[np.ndarray, np.ndarray] | None, op_start: np.ndarray | None,
                ignored: tuple[Action, ...], recompute_ops: tuple[int, ...], need: np.ndarray,
                schedule_parts: Any) -> SimResult:
    """A :class:`SimResult` from an engine's counters (both engines: the same float operations).

    ``overhead = (makespan - T) / T`` for a feasible run or a whole overcommitted one
    (``whole``), the stalls accrued so far over ``T`` for a run that got stuck;
    ``makespan_over_lower_bound`` is ``inf`` unless feasible.  Built without the dataclass's
    ``__init__`` (one dict update): planners make hundreds of thousands of these.
    """
    T = compute_time
    lb = lower_bound
    overhead = overhead_of(feasible, whole, makespan, T, st_swap, st_pf, st_rec)
    if feasible:
        ratio = makespan / lb if lb > 0 else (1.0 if makespan == 0 else math.inf)
    else:
        ratio = math.inf
    r = object.__new__(SimResult)
    r.__dict__.update(zip(_FIELDS, (
        feasible, makespan, T, overhead,
        {"swap_out": st_swap, "prefetch": st_pf, "recompute": st_rec},
        dict(zip(PHASES, ph_stall)),
        st_rec, bytes_d2h, bytes_h2d, peak, peak_op, memory_limit, lb, ratio,
        infeasible, timeline, op_start, ignored, recompute_ops, need, schedule_parts)))
    return r
