"""dqn-swap's errors: one family, two branches.

Every error dqn-swap raises on purpose derives from :class:`DqnSwapError`, so a caller catches
them all with one ``except``.  Below it:

* :class:`DqnSwapInputError` (also a ``ValueError``): something the user gave cannot be used: a
  memory limit (:class:`~dqn_swap.limits.MemoryLimitError`), a trace
  (:class:`~dqn_swap.trace.TraceError`), a plan (:class:`~dqn_swap.plan.PlanError`), an agent file,
  a plan the simulator found infeasible (:class:`~dqn_swap.runtime.InfeasiblePlanError`).
  Nothing ran; the message says what to give instead.
* :class:`DqnSwapRuntimeError` (also a ``RuntimeError``): recording or planned training met
  something it cannot follow: a model that changed since its trace
  (:class:`~dqn_swap.runtime.TraceMismatchError`), a re-run that differs
  (:class:`~dqn_swap.runtime.RecomputeError`), a training set-up the runtime does not support
  (:class:`~dqn_swap.runtime.UnsupportedTrainingError`), a recording that failed
  (:class:`~dqn_swap.recorder.RecordingError`), an ``autoplan`` misuse
  (:class:`~dqn_swap.integrations.AutoPlanError`).

:class:`~dqn_swap.runtime.PlannedOutOfMemoryError` is a ``torch.OutOfMemoryError`` too, so code
that handles an out-of-memory error handles a planned one.  Every one of them is re-exported from
:mod:`dqn_swap`.

Example::

    try:
        planned = dqn_swap.autoplan(model, "50%")
    except dqn_swap.DqnSwapInputError as e:
        print("bad input:", e)
"""

from __future__ import annotations


class DqnSwapError(Exception):
    """Base of every error dqn-swap raises on purpose; the message is one line saying why."""


class DqnSwapInputError(DqnSwapError, ValueError):
    """Something given cannot be used (a limit, a trace, a plan, an agent file); nothing ran."""


class DqnSwapRuntimeError(DqnSwapError, RuntimeError):
    """Recording or planned training met something it cannot follow; the message says what."""


__all__ = ["DqnSwapError", "DqnSwapInputError", "DqnSwapRuntimeError"]
