"""Run planned training for real: follow a swap/recompute plan inside PyTorch training.

:class:`PlannedExecution` wraps a user's own training step (see
:mod:`dqn_swap.runtime.execution` for how each mechanism works);
:func:`run_planned_training` records, plans and trains a model-zoo workload
and compares the runtime with unplanned training, full activation
checkpointing and ``save_on_cpu``.
"""

from .analysis import PlanIndex, build_index, estimate_planned_peak, make_plan, saved_activations
from .execution import (HostBufferPool, IterationStats, PlannedExecution, PlannedOutOfMemoryError,
                        RecomputeError, TraceMismatchError, enable_expandable_segments, prefetch_positions)


def run_planned_training(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """Record, plan and train a workload; see :func:`dqn_swap.runtime.training.run_planned_training`."""
    from .training import run_planned_training as _run

    return _run(*args, **kwargs)


__all__ = ["HostBufferPool", "IterationStats", "PlanIndex", "PlannedExecution", "PlannedOutOfMemoryError",
           "RecomputeError", "TraceMismatchError", "build_index", "enable_expandable_segments",
           "estimate_planned_peak", "make_plan", "prefetch_positions", "run_planned_training",
           "saved_activations"]
