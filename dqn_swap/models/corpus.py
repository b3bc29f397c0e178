"""Recording generated networks (:mod:`dqn_swap.models.generator`) into traces: a training corpus."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .generator import NetworkSpec


def record_spec(spec: NetworkSpec, *, batch_size: int | None = None, profile: str | None = None) -> Any:
    """Record ``spec`` on ``meta`` (on ``cpu`` where ``spec.record_device`` says so: bf16 autocast,
    graph networks), its own batch size and profile unless given: a :class:`~dqn_swap.trace.Trace`
    whose metadata names the network, family and split.  Op times come from the profile on both."""
    from ..recorder import record_trace
    from .registry import build_workload

    batch = batch_size or spec.batch_size
    device = spec.record_device
    w = build_workload(spec.name, batch, device=device, seed=spec.seed)
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device=device, inputs="released",
                        profile=profile or spec.profile,
                        meta={"model": spec.name, "batch_size": batch, "family": spec.family, "split": spec.split,
                              "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.sizes}})


def record_corpus(specs: list[NetworkSpec], out_dir: str | Path,
                  progress: Callable[[NetworkSpec], None] | None = None) -> list[Path]:
    """Record every spec into ``out_dir`` as ``FAMILY-SEED.trace``; traces already there are kept."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in specs:
        path = out / f"{spec.family}-{spec.seed}.trace"
        if not path.exists():
            record_spec(spec).save(path)
        if progress is not None:
            progress(spec)
        paths.append(path)
    return paths


__all__ = ["record_corpus", "record_spec"]
