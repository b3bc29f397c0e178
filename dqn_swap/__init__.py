"""dqn-swap: plan tensor swapping and recomputation with a deep Q-network.

Pipeline: record -> trace -> operation graph -> simulator -> environment -> agents -> plan -> runtime.
The core library (this package) never imports the reinforcement-learning side.
"""

from .cost import PROFILES, DeviceProfile, get_profile
from .plan import Action, ActionKind, Plan, PlanError
from .trace import EventKind, Phase, Role, Trace, TraceBuilder, TraceError

__version__ = "0.1.0"


def record_trace(*args, **kwargs):  # noqa: ANN002, ANN003
    """Record one training iteration; see :func:`dqn_swap.recorder.record_trace`."""
    from .recorder import record_trace as _record

    return _record(*args, **kwargs)


__all__ = ["PROFILES", "Action", "ActionKind", "DeviceProfile", "EventKind", "Phase", "Plan",
           "PlanError", "Role", "Trace", "TraceBuilder", "TraceError", "get_profile", "record_trace"]
