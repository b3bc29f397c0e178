"""What the benchmark scripts share: the comparison grid, its memory limits, traces and result files.

The grid is the networks of the DQN paper's comparison (Chen, section 5) that the zoo
records cheaply on ``meta``: ResNet-50 b64, VGG-16 b64, U-Net b8, the 100-step LSTM b64
and a GPT-style decoder b8, profile ``v100-pcie3``, at memory limits 90/70/50/30 % of the
way from ``trace.minimum_memory`` (0 %) to ``trace.peak_bytes`` (100 %).

Every result file is written by :func:`write_json`, which records beside the figures the
command, the commit (and the tracked files that differed from it), the machine and the
date, with this machine's paths taken out.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(Path(__file__).resolve().parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from dqn_swap.files import write_text  # noqa: E402

GRID = {"resnet50": 64, "vgg16": 64, "unet": 8, "lstm": 64, "gpt": 8}
NAMES = {"resnet50": "ResNet-50 b64", "vgg16": "VGG-16 b64", "unet": "U-Net b8", "lstm": "LSTM b64", "gpt": "GPT b8"}
LIMITS = (0.9, 0.7, 0.5, 0.3)
PROFILE = "v100-pcie3"
TRACE_DIR = ROOT / "runs" / "traces"
DEFAULT_AGENT = ROOT / "checkpoints" / "default.pt"  # the shipped agent (dqn_swap.agents.dqn.planner.DEFAULT_AGENT)
# The papers' baselines, in the order the tables show them.
BASELINES = ("window", "greedy", "dynprog", "vdnn", "lru", "tflms", "sqrt-n", "layrub")


def pct(fraction: float):  # noqa: ANN201
    """The limit ``fraction`` of the way from a trace's minimum memory to its peak (``0.7`` is 70 %)."""
    from dqn_swap.limits import MemoryLimit

    return MemoryLimit.percent(round(fraction * 100, 6))


def slug(model: str) -> str:
    """A model name as a file name: ``hf:configs/llama-8l`` -> ``hf_configs_llama-8l``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model)


def get_trace(name: str, batch: int):  # noqa: ANN201
    """The trace of ``name`` at ``batch`` on ``meta`` with :data:`PROFILE`, recorded once and kept under ``runs/traces``."""
    from dqn_swap.agents.dqn.report import load_trace_spec
    from dqn_swap.trace import Trace

    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    path = TRACE_DIR / f"{slug(name)}_b{batch}.trace"
    if path.exists():
        return Trace.load(path)
    trace = load_trace_spec(f"{name}:{batch}", PROFILE)
    trace.save(path, overwrite=True)
    return trace


def grid_agent(agents_dir: Path | None, model: str, frac: float) -> Path | None:
    """The agent of a grid cell in ``agents_dir``: the per-cell one, else the per-network one (None: neither)."""
    for cand in (f"{model}@{round(frac * 100)}.pt", f"{model}.pt"):
        if agents_dir and (agents_dir / cand).exists():
            return agents_dir / cand
    return None


def provenance() -> dict[str, Any]:
    """Command, commit, tracked files modified, machine and date (UTC) of this run."""
    from datetime import datetime, timezone

    from machine import commit, machine

    script = Path(sys.argv[0])
    command = " ".join(["python", f"benchmarks/{script.name}" if script.suffix == ".py" else sys.argv[0], *sys.argv[1:]])
    return {"command": command, **commit(), "machine": machine(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}


def agent_files(spec: str | Path) -> str | list[str]:
    """An ``--agent``-style argument: ``PATH``, or ``PATH+PATH...`` for the ensemble of those agents
    (a list, as :class:`dqn_swap.agents.dqn.DQNPlanner` takes it)."""
    text = str(spec)
    return text.split("+") if "+" in text else text


def arm_files(spec: str | Path) -> tuple[str | list[str], list[str]]:
    """An arm decoded by members, ``AGENT|FILE|FILE...``: the agent (:func:`agent_files`) and the
    more agent files decoded in their own environments (``more_agents``; none without ``|``)."""
    first, *more = str(spec).split("|")
    return agent_files(first), more


def publish(result: dict[str, Any], text: str, json_path: str | Path | None, md_path: str | Path | None) -> None:
    """A benchmark's result: ``result`` as JSON (:func:`write_json`), ``text`` (its markdown) printed and
    written as ``md_path`` (nothing for an empty path)."""
    write_json(result, json_path)
    print(text)
    if md_path:
        write_text(Path(md_path), text, overwrite=True)


def run_and_publish(name: str, run: Any, markdown: Any, args: Any,
                    errors: tuple[type[BaseException], ...] = (ValueError,)) -> int:
    """A benchmark's ``main`` after parsing: ``run(args)``, then :func:`publish` its result as
    ``args.json`` and ``args.md``; one of ``errors`` is printed as ``name: message``, exit status 2."""
    try:
        result = run(args)
    except errors as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    publish(result, markdown(result), args.json, args.md)
    return 0


def write_json(obj: dict[str, Any], path: str | Path | None) -> None:
    """Write ``obj`` with :func:`provenance` in front as ``path`` (nothing when ``path`` is empty)."""
    if path:
        from machine import relative_paths

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        obj = {**provenance(), **obj}
        write_text(Path(path), json.dumps(relative_paths(obj), indent=1, default=float) + "\n", overwrite=True)
