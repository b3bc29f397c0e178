"""Model zoo: the networks GPU-memory papers benchmark, packaged as one-iteration training workloads."""

from .registry import MODEL_NAMES, Workload, build_workload

__all__ = ["MODEL_NAMES", "Workload", "build_workload"]
