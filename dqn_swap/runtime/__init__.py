"""Run planned training for real: follow a plan's swaps, prefetches and recomputations.

:class:`PlannedExecution` wraps a user's own training step (see
:mod:`dqn_swap.runtime.execution` for how each mechanism works).  The runtime
depends on the core alone (trace, plan) and applies what the plan's schedule
says: it never plans, and refuses a plan without a schedule
(:func:`dqn_swap.simulator.schedule_plan` makes one); the experiment harness
that compares it with other methods lives with the integrations, above it
(:mod:`dqn_swap.integrations.experiment`).

Modules: :mod:`.backend` (streams, events, copies of CUDA and the CPU), :mod:`.offload` (safe mode),
:mod:`.standin` (a CPU device with late copies and a checker), :mod:`.index`
(the plan as lookup tables), :mod:`.swap`, :mod:`.recompute`, :mod:`.vocabulary` (errors, modes,
holders, statistics), :mod:`.live_checks` (the iteration against its trace), :mod:`.iteration` (one
planned iteration) and :mod:`.execution` (:class:`PlannedExecution`, which runs them).
"""

from .backend import Backend, CudaBackend, HostBackend, backend_for
from .execution import PlannedExecution, prefetch_positions
from .index import PlanIndex, build_index
from .offload import HostOffload, host_buffer, persistent_storages
from .recompute import RecomputeError, TraceMismatchError
from .swap import HostBufferPool
from .vocabulary import (ON_MISMATCH, STEP_OWNER, HeldInputWarning, InfeasiblePlanError, IterationStats,
                         PlannedOutOfMemoryError, UnsupportedTrainingError, enable_expandable_segments, refuse_unsupported)

__all__ = ["ON_MISMATCH", "STEP_OWNER", "Backend", "CudaBackend", "HeldInputWarning", "HostBackend", "HostBufferPool",
           "HostOffload", "InfeasiblePlanError", "host_buffer", "persistent_storages",
           "IterationStats", "PlanIndex",
           "PlannedExecution", "PlannedOutOfMemoryError", "RecomputeError", "TraceMismatchError",
           "UnsupportedTrainingError", "backend_for", "build_index", "enable_expandable_segments",
           "prefetch_positions", "refuse_unsupported"]
