"""Solving a :class:`~.program.SwapProgram` with HiGHS (``scipy.optimize.milp``), with a live progress line.

``scipy.optimize.milp`` has no callback; HiGHS writes its branch-and-bound log
to the process's standard output (file descriptor 1, from C).  To show the
incumbent and the bound while it runs, :func:`solve` points descriptor 1 at a
pipe for the duration of the solve and a reader thread parses the log's
progress rows (:func:`parse_progress`); nothing of the log reaches the user's
standard output.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from .program import SwapProgram

#: A progress row of HiGHS's MIP log: ``[src] nodes queue leaves expl% bestbound bestsol gap% ... time``.
_ROW = re.compile(r"^\s*[A-Za-z]?\s+\d+\s+\d+\s+\d+\s+[\d.]+%\s+(\S+)\s+(\S+)\s+(\S+)\s.*?([\d.]+)s\s*$")


@dataclass(frozen=True)
class Progress:
    """One progress row: the bound and the incumbent's objective (``inf`` if none yet), seconds in."""

    bound: float
    incumbent: float
    seconds: float


def parse_progress(line: str) -> Progress | None:
    """The progress row of a HiGHS log line, ``None`` for any other line."""
    m = _ROW.match(line)
    if not m:
        return None
    try:
        bound, sol = float(m.group(1)), float(m.group(2))
    except ValueError:
        return None
    return Progress(bound, sol, float(m.group(4)))


@dataclass(frozen=True)
class Outcome:
    """What one solve gave: the solution (``None`` if none found), its objective and the dual bound (ms)."""

    x: np.ndarray | None
    objective: float
    dual_bound: float
    status: int  # scipy's: 0 optimal, 1 limit reached, 2 infeasible, 3 unbounded, 4 other
    message: str
    seconds: float


def solve(prog: SwapProgram, *, time_limit: float, gap: float,
          on_progress: Callable[[Progress], None] | None = None,
          lb: np.ndarray | None = None, ub: np.ndarray | None = None) -> Outcome:
    """Solve ``prog`` (optionally with the variable bounds ``lb``, ``ub``) within ``time_limit`` seconds.

    ``gap`` is HiGHS's relative optimality tolerance (``mip_rel_gap``).
    ``on_progress`` receives every progress row of the solver's log as it is written.
    """
    options = {"time_limit": max(float(time_limit), 0.1), "mip_rel_gap": float(gap), "disp": on_progress is not None}
    args = dict(c=prog.c, constraints=LinearConstraint(prog.A, prog.row_lo, prog.row_hi),
                integrality=prog.integrality,
                bounds=Bounds(prog.lb if lb is None else lb, prog.ub if ub is None else ub), options=options)
    t0 = time.perf_counter()
    if on_progress is None:
        res = milp(**args)
    else:
        res = _with_log_reader(lambda: milp(**args), on_progress)
    seconds = time.perf_counter() - t0
    x = None if res.x is None else np.asarray(res.x)
    objective = float(res.fun) if res.fun is not None else math.inf
    dual = getattr(res, "mip_dual_bound", None)
    if dual is None or not math.isfinite(float(dual)):
        dual = objective if res.status == 0 else -math.inf
    return Outcome(x, objective, float(dual), int(res.status), str(res.message), seconds)


def _with_log_reader(call: Callable[[], object], on_progress: Callable[[Progress], None]):  # noqa: ANN202
    """Run ``call`` with file descriptor 1 read by a thread that parses HiGHS's log."""
    sys.stdout.flush()
    saved = os.dup(1)
    read_fd, write_fd = os.pipe()

    def reader() -> None:
        with os.fdopen(read_fd, "r", errors="replace") as pipe:
            for line in pipe:
                p = parse_progress(line)
                if p is not None:
                    on_progress(p)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    os.dup2(write_fd, 1)
    try:
        return call()
    finally:
        # HiGHS writes through C's stdio: flush it before handing descriptor 1 back.
        try:
            import ctypes

            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
        os.dup2(saved, 1)
        os.close(saved)
        os.close(write_fd)  # the reader sees end of file once the log is drained
        thread.join(timeout=5)
