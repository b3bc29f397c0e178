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


def load_workload(spec: str, batch_size: int, device: str, seed: int, seq_len: int | None = None):
    """A zoo workload by name, or a user's from ``module:function`` (``seq_len``: Hugging Face
    language models only)."""
    from .models import build_workload

    if ":" not in spec:
        return build_workload(spec, batch_size, device, seed=seed, seq_len=seq_len)
    module_name, _, fn_name = spec.partition(":")
    if module_name in ("hf", "gen"):
        return build_workload(spec, batch_size, device, seed=seed, seq_len=seq_len)
    if seq_len is not None:
        raise ValueError(f"model {spec!r}: only Hugging Face language models (hf:NAME) take a sequence length")
    fn = load_attribute(spec, "model")
    if not callable(fn):
        raise ValueError(f"model {spec!r}: {module_name}.{fn_name} is not a function")
    try:
        workload = fn(batch_size, device)
    except Exception as e:  # noqa: BLE001 - the user's code: say where it failed, in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"model {spec!r}: {fn_name}(batch_size, device) raised {type(e).__name__}: {first}"[:300]
                         ) from None
    if not all(hasattr(workload, a) for a in ("model", "example_inputs", "loss_fn", "make_optimizer")):
        raise ValueError(f"model {spec!r}: {fn_name}(batch_size, device) must return a dqn_swap.models.Workload, "
                         f"not {type(workload).__name__}")
    return workload


__all__ = ["load_workload", "import_from_here", "load_attribute"]
