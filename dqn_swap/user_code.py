"""The user's own code named on the command line as ``package.module:name`` (a model's workload
function, a planner), imported as ``python -m`` would import it."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def import_from_here(module_name: str) -> Any:
    """Import the user's module as ``python -m`` would: the current folder is searched first, also by
    the installed ``dqn-swap`` command (whose script's folder, not the current one, heads ``sys.path``)."""
    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


def load_attribute(spec: str, what: str) -> Any:
    """The object ``spec`` (``package.module:name``) names.

    Raises:
        ValueError: it cannot be imported or has no such name (one line, naming ``what`` it is for).
    """
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"cannot load {what} {spec!r}: write package.module:name")
    try:
        return getattr(import_from_here(module_name), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"cannot load {what} {spec!r}: {e}") from None


__all__ = ["import_from_here", "load_attribute"]
