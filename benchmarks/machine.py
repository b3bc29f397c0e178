"""The machine a benchmark ran on, recorded beside its figures."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path


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


def commit() -> dict[str, object]:
    """The checked-out commit and the tracked files that differ from it (read-only git plumbing)."""
    root = Path(__file__).resolve().parent.parent

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "modified": git("diff-index", "--name-only", "HEAD", "--").split()}


_ROOT = str(Path(__file__).resolve().parent.parent)
# A file in the temporary folder (tempfile.gettempdir(), where scratch outputs go): by its name alone.
_SCRATCH = re.compile(re.escape(tempfile.gettempdir().rstrip("/")) + r"/(?:[\w.@%+-]+/)*([\w.@%+-]+)")


def relative_paths(obj: object) -> object:
    """``obj`` (strings, lists and dicts of them) with this machine's paths taken out: a path inside
    the repository relative to its root, a file in the temporary folder by its name alone."""
    if isinstance(obj, str):
        return _SCRATCH.sub(r"\1", obj.replace(_ROOT + "/", "").replace(_ROOT, "."))
    if isinstance(obj, dict):
        return {k: relative_paths(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [relative_paths(v) for v in obj]
    return obj
