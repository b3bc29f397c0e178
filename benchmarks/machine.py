"""The machine a benchmark ran on, recorded beside its figures."""

from __future__ import annotations

import os
import platform


def machine() -> str:
    """CPU model, cores, Python and torch versions, GPU if any, e.g. for ``results/*.json``."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
    try:
        import torch

        text += f", torch {torch.__version__}"
        if torch.cuda.is_available():
            text += f", {torch.cuda.get_device_name()}"
    except ImportError:
        pass
    return text
