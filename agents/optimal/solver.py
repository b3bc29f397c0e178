"""Solving a :class:`~.program.SwapProgram` with HiGHS, the solver that ships inside SciPy.

:func:`solve` drives HiGHS through SciPy's own binding of it
(``scipy.optimize._highspy``, the library behind ``scipy.optimize.milp``)
rather than through ``milp``, for three things ``milp`` cannot do:

* **Starting plans.**  Plans that are already known (the cheap planners', see
  :mod:`.planner`) are handed to HiGHS as starting solutions: their ``o`` and
  ``r`` binaries (:meth:`~.program.SwapProgram.start`), which HiGHS completes
  into a full solution of the program (``w``, times, ...) and keeps as its
  incumbent when feasible.  The first is set before the solve
  (``setSolution``), the others through the solver's user-solution callback,
  one per call.  A plan that the program does not admit (cut off, or one that
  leaves a checkpoint over the limit) is simply not taken.
* **A limit on CPU time.**  ``time_limit`` counts the process's CPU time
  (:func:`time.process_time`: every thread of the process, HiGHS's worker
  threads included) from the start of the solve; HiGHS's interrupt callback,
  called throughout its branch and bound, stops the solve once it is spent.
  HiGHS's own ``time_limit`` counts wall-clock time; it is set only from
  ``wall_limit`` (none by default), so that a solve on a busy machine gets the
  CPU it was given, however long that takes.  The callback is not called
  inside the root's LP solves, so a solve can overrun its CPU limit by one LP
  solve.  :class:`Outcome` reports both clocks (``cpu_seconds``, ``seconds``).
* **Silence.**  HiGHS writes to the process's standard output from C (its log,
  and a few ``printf`` lines of its own, such as
  ``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``,
  whatever its options say), which would corrupt ``--json`` output.
  :func:`silenced` points file descriptors 1 and 2 at ``/dev/null`` for the
  whole solve and restores them afterwards, also when the solve raises; the
  progress line goes to the original standard error through a copy of its
  descriptor.  The incumbent and the bound come from the solver's callbacks,
  not from its log.
"""

from __future__ import annotations

import ctypes
import io
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize._highspy import _core as _highs  # the HiGHS that scipy.optimize.milp runs

from dqn_swap.plan import ActionKind
from dqn_swap.stop import Stopped, as_stopped, signals_noted

from .program import SwapProgram

#: How often (CPU seconds) the progress callback is passed the solver's incumbent and bound.
PROGRESS_EVERY = 1.0


@dataclass(frozen=True)
class Progress:
    """The solver's bound and incumbent objective (``inf`` if none yet), CPU seconds into the solve."""

    bound: float
    incumbent: float
    seconds: float


@dataclass(frozen=True)
class Outcome:
    """What one solve gave: the solution (``None`` if none found), its objective and the dual bound (ms).

    ``seconds`` is the solve's wall-clock time, ``cpu_seconds`` the CPU time the process
    received during it (all threads); ``starts_accepted`` how many starting plans HiGHS
    ``starts_given`` how many starting plans were handed to HiGHS.
    """

    x: np.ndarray | None
    objective: float
    dual_bound: float
    status: int  # as scipy.optimize.milp's: 0 optimal, 1 limit reached, 2 infeasible, 3 unbounded, 4 other
    message: str
    seconds: float
    cpu_seconds: float = 0.0
    starts_given: int = 0


def _libc_fflush() -> None:
    """Flush C's stdio buffers (HiGHS writes through them) before a descriptor changes hands."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


@contextmanager
def silenced() -> Iterator[None]:
    """File descriptors 1 and 2 point at ``/dev/null`` inside; ``sys.stderr`` writes to the original
    descriptor 2 (so that Python's own warnings and the progress line stay visible).  Restored on exit,
    also on an exception."""
    sys.stdout.flush()
    sys.stderr.flush()
    _libc_fflush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    old_stderr = sys.stderr
    err = io.TextIOWrapper(io.FileIO(os.dup(saved_err), "w"), encoding="utf-8", errors="replace",
                           line_buffering=True, write_through=True)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        sys.stderr = err
        yield
    finally:
        _libc_fflush()
        sys.stderr = old_stderr
        try:
            err.close()
        except OSError:
            pass
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, null):
            os.close(fd)


def start_values(prog: SwapProgram, actions: Iterable[object]) -> tuple[np.ndarray, np.ndarray]:
    """A plan as a partial solution of ``prog``: the indices and values of every ``o`` and ``r``
    binary (swap, recompute or keep each candidate as ``actions`` do; actions on tensors that are
    not candidates are left out, as the program leaves them)."""
    chosen = {a.tensor: a.kind for a in actions}  # type: ignore[attr-defined]
    idx: list[int] = []
    val: list[float] = []
    for i, c in enumerate(prog.cands):
        kind = chosen.get(c.tensor)
        idx.append(prog.o[i])
        val.append(1.0 if kind == ActionKind.SWAP else 0.0)
        if prog.r[i] >= 0:
            idx.append(prog.r[i])
            val.append(1.0 if kind == ActionKind.RECOMPUTE else 0.0)
    return np.asarray(idx, dtype=np.int32), np.asarray(val, dtype=np.float64)


#: The callback through which HiGHS asks for more starting solutions, where its version has it.
_USER_SOLUTION = getattr(_highs.cb.HighsCallbackType, "kCallbackMipUserSolution", None)

_STATUS = {  # HiGHS model status -> scipy.optimize.milp's status code
    "kOptimal": 0, "kTimeLimit": 1, "kIterationLimit": 1, "kSolutionLimit": 1, "kInterrupt": 1,
    "kHighsInterrupt": 1, "kObjectiveBound": 1, "kObjectiveTarget": 1,
    "kInfeasible": 2, "kUnbounded": 3, "kUnboundedOrInfeasible": 2,
}


def _highs_model(prog: SwapProgram, lo_x: np.ndarray, hi_x: np.ndarray) -> Any:
    """``prog`` as HiGHS's own model (``HighsLp``): costs, bounds ``lo_x``/``hi_x``, rows and the
    column-wise matrix, and which variables are binary."""
    h = _highs
    A = sparse.csc_array(prog.A)
    lp = h.HighsLp()
    lp.num_col_, lp.num_row_ = len(prog.c), A.shape[0]
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = len(prog.c), A.shape[0]
    lp.a_matrix_.format_ = h.MatrixFormat.kColwise
    lp.col_cost_ = np.asarray(prog.c, dtype=np.float64)
    lp.col_lower_, lp.col_upper_ = np.asarray(lo_x, dtype=np.float64), np.asarray(hi_x, dtype=np.float64)
    lp.row_lower_ = np.asarray(prog.row_lo, dtype=np.float64)
    lp.row_upper_ = np.asarray(prog.row_hi, dtype=np.float64)
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(np.float64)
    if len(prog.integrality):
        lp.integrality_ = [h.HighsVarType(int(i)) for i in prog.integrality]
    return lp


def solve(prog: SwapProgram, *, time_limit: float, gap: float,
          on_progress: Callable[[Progress], None] | None = None,
          lb: np.ndarray | None = None, ub: np.ndarray | None = None,
          starts: Iterable[Sequence[object]] = (), wall_limit: float | None = None) -> Outcome:
    """Solve ``prog`` (optionally with the variable bounds ``lb``, ``ub``) within ``time_limit`` CPU seconds.

    ``gap`` is HiGHS's relative optimality tolerance (``mip_rel_gap``); ``wall_limit`` an optional
    limit on wall-clock seconds (HiGHS's own ``time_limit``).  ``starts`` are plans (action
    sets) given to HiGHS as starting solutions, best first.  ``on_progress`` receives the
    incumbent and the bound about every :data:`PROGRESS_EVERY` CPU seconds.  Nothing the
    solver writes reaches file descriptors 1 or 2 (:func:`silenced`).
    """
    h = _highs
    lp = _highs_model(prog, prog.lb if lb is None else lb, prog.ub if ub is None else ub)
    queue = [start_values(prog, plan) for plan in starts]
    given = len(queue)
    cpu_limit = max(float(time_limit), 0.0)
    state = {"next_progress": 0.0}
    cb_type = h.cb.HighsCallbackType

    t0, c0 = time.perf_counter(), time.process_time()

    def callback(kind: int, _msg: str, out: object, inp: object, _user: object) -> None:
        cpu = time.process_time() - c0
        if kind == cb_type.kCallbackMipInterrupt:
            if cpu >= cpu_limit or signals:
                inp.user_interrupt = True  # type: ignore[attr-defined]
            if on_progress is not None and cpu >= state["next_progress"]:
                state["next_progress"] = cpu + PROGRESS_EVERY
                try:
                    on_progress(Progress(float(out.mip_dual_bound), float(out.mip_primal_bound), cpu))  # type: ignore[attr-defined]
                except KeyboardInterrupt as e:  # a report raising a noted signal (dqn_swap.stop.check): as one here
                    signals.append(as_stopped(e).signum)
                    inp.user_interrupt = True  # type: ignore[attr-defined]
        elif kind == _USER_SOLUTION and queue:
            idx, val = queue.pop(0)
            inp.setSolution(idx, val)  # type: ignore[attr-defined]
            inp.repairSolution()  # type: ignore[attr-defined]

    # SIGINT and SIGTERM while HiGHS runs: an exception raised inside its callback would not stop
    # it, so the signal is noted, the next callback interrupts the solve, and the signal is raised
    # again once HiGHS has returned (:mod:`dqn_swap.stop`: one line, exit 130 or 143).
    signals: list[int] = []
    with silenced(), signals_noted(signals):
        highs = h._Highs()
        highs.setOptionValue("output_flag", False)
        highs.setOptionValue("log_to_console", False)
        highs.setOptionValue("mip_rel_gap", float(gap))
        if wall_limit is not None:
            highs.setOptionValue("time_limit", max(float(wall_limit), 0.1))
        if highs.passModel(lp) == h.HighsStatus.kError:
            raise ValueError("HiGHS refused the program")
        if queue:
            idx, val = queue.pop(0)
            highs.setSolution(len(idx), idx, val)
        highs.setCallback(callback, None)
        highs.startCallback(cb_type.kCallbackMipInterrupt)
        if queue and _USER_SOLUTION is not None:  # HiGHS 1.10+ (scipy 1.16+); before: the first start only
            highs.startCallback(_USER_SOLUTION)
        highs.run()
        status = highs.getModelStatus()
        info = highs.getInfo()
        name = str(status).rsplit(".", 1)[-1]
        code = _STATUS.get(name, 4)
        message = highs.modelStatusToString(status)
        obj = float(info.objective_function_value)
        has_x = code in (0, 1) and math.isfinite(obj) and abs(obj) < h.kHighsInf
        x = np.asarray(highs.getSolution().col_value, dtype=np.float64) if has_x else None
        dual = float(info.mip_dual_bound)
    if signals:
        raise Stopped(signals[0])
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    objective = obj if has_x else math.inf
    if not math.isfinite(dual) or abs(dual) >= h.kHighsInf:
        dual = objective if code == 0 else -math.inf
    return Outcome(x, objective, dual, code, message, seconds, cpu, given)
