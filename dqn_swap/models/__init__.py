"""Model zoo: the networks GPU-memory papers benchmark, packaged as one-iteration training workloads,
and Hugging Face transformers (``hf:NAME``).

The names import nothing heavy; :func:`build_workload` and :class:`Workload` load torch and the
networks when first used.
"""

from typing import Any

from .names import HF_NAMES, MODEL_NAMES, split_model_spec


def __getattr__(name: str) -> Any:
    # build_workload and Workload load torch and the networks: imported on first use, the real
    # objects (help() and inspect.signature show build_workload's own signature)
    if name in ("build_workload", "Workload"):
        from . import registry

        value = getattr(registry, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dqn_swap.models' has no attribute {name!r}")


__all__ = ["HF_NAMES", "MODEL_NAMES", "Workload", "build_workload", "split_model_spec"]
