"""dqn-swap: plan tensor swapping and recomputation with a deep Q-network.

Pipeline: record -> trace -> operation graph -> simulator -> environment -> agents -> plan -> runtime.

What this module re-exports, and what it imports:

* **at import**, only core modules, and no torch: the trace's types and
  :func:`resolve_memory_limit` (:mod:`dqn_swap.trace`), :class:`MemoryLimit`
  (:mod:`dqn_swap.limits`), :class:`Plan` and its actions (:mod:`dqn_swap.plan`) and the device
  profiles (:mod:`dqn_swap.cost`), with what those import (:mod:`dqn_swap.units`,
  :mod:`dqn_swap.files`);
* **on first use** (module ``__getattr__``, table ``_LAZY``): :func:`record_trace`
  (:mod:`dqn_swap.recorder`), :func:`simulate` and :class:`Simulator` (:mod:`dqn_swap.simulator`)
  from the core, :func:`autoplan` from :mod:`dqn_swap.integrations`, and two names from above the core:
  :func:`get_planner` from :mod:`dqn_swap.agents` and :class:`PlannedExecution` from
  :mod:`dqn_swap.runtime`.  ``get_planner`` is the planner registry's own
  (:mod:`dqn_swap.planners`, in the core); it is taken from the agents because importing them is
  what registers every planner.

Those three are the only arrows from the core up: the package's face for users.  The integrations
(:func:`autoplan` and the ``Trainer`` callback, which :mod:`dqn_swap.trainer` names for users) plan
with the agents and train with the runtime, so they sit above both.  Every other core module imports
the core only; ``tests/test_import_layers.py`` checks the layers (core <- env <- agents <-
integrations <- command line; the runtime imports the core only) and lists these exceptions.
"""

from .cost import PROFILES, DeviceProfile, get_profile
from .errors import DqnSwapError, DqnSwapInputError, DqnSwapRuntimeError
from .limits import MemoryLimit, MemoryLimitError
from .plan import Action, ActionKind, Plan, PlanError
from .trace import EventKind, Phase, Role, Trace, TraceBuilder, TraceError, resolve_memory_limit

__version__ = "0.1.0"


#: Public names imported when first used (they load torch, the agents, the runtime), and the module that
#: defines each.  Module ``__getattr__`` hands out the real object, so ``help()`` and
#: ``inspect.signature`` show its own signature and docstring, not a wrapper's ``(*args, **kwargs)``.
_LAZY = {"record_trace": ".recorder", "autoplan": ".integrations", "AutoPlan": ".integrations",
         "AutoPlanError": ".integrations", "get_planner": ".agents", "PlannedExecution": ".runtime",
         "simulate": ".simulator", "Simulator": ".simulator", "RecordingError": ".recorder",
         "InfeasiblePlanError": ".runtime", "PlannedOutOfMemoryError": ".runtime", "RecomputeError": ".runtime",
         "TraceMismatchError": ".runtime", "UnsupportedTrainingError": ".runtime",
         "AgentFileError": ".agents.dqn"}


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


__all__ = ["PROFILES", "Action", "ActionKind", "AgentFileError", "AutoPlan", "AutoPlanError", "DeviceProfile", "DqnSwapError",
           "DqnSwapInputError", "DqnSwapRuntimeError", "EventKind", "InfeasiblePlanError", "MemoryLimit",
           "MemoryLimitError", "Phase", "Plan", "PlanError", "PlannedExecution", "PlannedOutOfMemoryError", "RecomputeError",
           "RecordingError", "Role", "Simulator", "Trace", "TraceBuilder", "TraceError", "TraceMismatchError",
           "UnsupportedTrainingError", "autoplan", "get_planner", "get_profile", "record_trace", "resolve_memory_limit",
           "simulate"]
