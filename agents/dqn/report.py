"""Helpers for scripts: traces from names, training curves as PNG."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dqn_swap.trace import Trace
from dqn_swap.files import save_figure


def load_trace_spec(spec: str, profile: str = "v100-pcie3") -> Trace:
    """``path.trace`` (a recorded trace) or ``model:batch`` (recorded now on the meta device; a
    generated ``gen:FAMILY:SEED[:BATCH]`` takes its own profile, and its own batch unless given)."""
    if spec.endswith(".trace") or os.path.exists(spec):
        return Trace.load(spec)
    from dqn_swap import record_trace
    from dqn_swap.models import build_workload, split_model_spec

    name, batch = split_model_spec(spec)
    if name.startswith("gen:"):  # its own profile and seed; its own batch unless one is given
        from dqn_swap.models.corpus import record_spec
        from dqn_swap.models.generator import parse_name, sample

        return record_spec(sample(*parse_name(name)), batch_size=batch)
    w = build_workload(name, int(batch or 1), "meta")
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta", profile=profile,
                        inputs="released",
                        meta={"model": name, "batch_size": int(batch or 1)})


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs for :class:`~dqn_swap.agents.dqn.config.DQNConfig` (values parsed as Python literals)."""
    import ast

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {item!r}")
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value
    return out


def plot_curves(curves: dict[str, list[tuple[int, float]]], path: str | os.PathLike[str], *,
                title: str = "", ylabel: str = "mean overhead + penalty (greedy plan)") -> Path:
    """One line per named curve of (step, value) points; writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for name, pts in curves.items():
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker=".", label=name)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel)
    ys_all = [y for pts in curves.values() for _, y in pts if y > 0]
    if ys_all and max(ys_all) / max(min(ys_all), 1e-12) > 30:
        if any(y <= 0 for pts in curves.values() for _, y in pts):  # a perfect plan scores 0: keep it visible
            ax.set_yscale("symlog", linthresh=min(ys_all))
        else:
            ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        import textwrap

        ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_figure(fig, path, overwrite=True, metadata={"Software": "dqn-swap"})
    finally:
        plt.close(fig)
    return path
