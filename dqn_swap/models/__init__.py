"""Model zoo: the networks GPU-memory papers benchmark, packaged as one-iteration training workloads,
and Hugging Face transformers (``hf:NAME``).

The names import nothing heavy; :func:`build_workload` and :class:`Workload` load torch and the
networks when first used.
"""

from typing import Any

from .names import HF_NAMES, MODEL_NAMES, split_model_spec


def build_workload(*args: Any, **kwargs: Any) -> Any:
    """Build a workload; see :func:`dqn_swap.models.registry.build_workload`."""
    from .registry import build_workload as build

    return build(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "Workload":
        from .registry import Workload

        return Workload
    raise AttributeError(f"module 'dqn_swap.models' has no attribute {name!r}")


__all__ = ["HF_NAMES", "MODEL_NAMES", "Workload", "build_workload", "split_model_spec"]
