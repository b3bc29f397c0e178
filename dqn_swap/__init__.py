"""dqn-swap: plan tensor swapping and recomputation with a deep Q-network.

Pipeline: record -> trace -> operation graph -> simulator -> environment -> agents -> plan -> runtime.
The core library (this package) never imports the reinforcement-learning side.
"""

from .cost import PROFILES, DeviceProfile, get_profile
from .limits import MemoryLimit, MemoryLimitError
from .plan import Action, ActionKind, Plan, PlanError
from .trace import EventKind, Phase, Role, Trace, TraceBuilder, TraceError, resolve_memory_limit

__version__ = "0.1.0"


#: Public names imported when first used (they load torch, the agents, the runtime), and the module that
#: defines each.  Module ``__getattr__`` hands out the real object, so ``help()`` and
#: ``inspect.signature`` show its own signature and docstring, not a wrapper's ``(*args, **kwargs)``.
_LAZY = {"record_trace": ".recorder", "autoplan": ".user_loop", "AutoPlan": ".user_loop",
         "AutoPlanError": ".user_loop", "get_planner": ".agents", "PlannedExecution": ".runtime",
         "simulate": ".simulator", "Simulator": ".simulator"}


def __getattr__(name: str):  # noqa: ANN202 (lazy: torch and the rest load on first use)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dqn_swap' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["PROFILES", "Action", "ActionKind", "AutoPlan", "AutoPlanError", "DeviceProfile", "EventKind", "MemoryLimit", "MemoryLimitError", "Phase",
           "Plan",
           "PlanError", "PlannedExecution", "Role", "Simulator", "Trace", "TraceBuilder", "TraceError",
           "autoplan", "get_planner", "get_profile", "record_trace", "resolve_memory_limit", "simulate"]
