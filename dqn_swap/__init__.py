"""dqn-swap: plan tensor swapping and recomputation with a deep Q-network.

Pipeline: record -> trace -> operation graph -> simulator -> environment -> agents -> plan -> runtime.
The core library (this package) never imports the reinforcement-learning side.
"""

from .cost import PROFILES, DeviceProfile, get_profile
from .limits import MemoryLimit, MemoryLimitError
from .plan import Action, ActionKind, Plan, PlanError
from .trace import EventKind, Phase, Role, Trace, TraceBuilder, TraceError, resolve_memory_limit

__version__ = "0.1.0"


def record_trace(*args, **kwargs):  # noqa: ANN002, ANN003
    """Record one training iteration; see :func:`dqn_swap.recorder.record_trace`."""
    from .recorder import record_trace as _record

    return _record(*args, **kwargs)


def autoplan(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """Planned training in your own loop, one line; see :func:`dqn_swap.user_loop.autoplan`."""
    from .user_loop import autoplan as _autoplan

    return _autoplan(*args, **kwargs)


def get_planner(name: str, **kwargs):  # noqa: ANN003, ANN201
    """The planner called ``name`` (the baselines and the DQN); see :func:`dqn_swap.agents.get_planner`."""
    from .agents import get_planner as _get

    return _get(name, **kwargs)


def __getattr__(name: str):  # noqa: ANN202 (lazy: the runtime and simulator import more)
    if name == "PlannedExecution":
        from .runtime import PlannedExecution

        return PlannedExecution
    if name in ("AutoPlan", "AutoPlanError"):
        from . import user_loop

        return getattr(user_loop, name)
    if name in ("simulate", "Simulator"):
        from . import simulator

        return getattr(simulator, name)
    raise AttributeError(f"module 'dqn_swap' has no attribute {name!r}")


__all__ = ["PROFILES", "Action", "ActionKind", "AutoPlan", "AutoPlanError", "DeviceProfile", "EventKind", "MemoryLimit", "MemoryLimitError", "Phase",
           "Plan",
           "PlanError", "PlannedExecution", "Role", "Simulator", "Trace", "TraceBuilder", "TraceError",
           "autoplan", "get_planner", "get_profile", "record_trace", "resolve_memory_limit", "simulate"]
