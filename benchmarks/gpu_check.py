#!/usr/bin/env python
"""One prepared run on a CUDA GPU: what a machine lent for minutes must measure, in one call.

``scripts/gpu_check.sh`` runs it (with the machine's own Python and torch, no network); on the
CPU, ``--dry-run`` runs the same code on tiny models so that CI keeps it from going stale.

It measures, writing ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` after every model
(a run cut short keeps what it measured):

- the CUDA tests (``pytest -m gpu``; collected only in a dry run);
- per model (ResNet-50, a Hugging Face Llama, a U-Net, GPT):
  - the trace's op times summed against the measured unplanned step (the simulator weighs
    transfers against that compute);
  - unplanned training, per-block ``torch.utils.checkpoint`` and ``save_on_cpu``: step time,
    peak allocated and reserved;
  - at per-block checkpointing's measured peak (the same memory, side by side), then at 50 %,
    70 % and 30 % of the way from the trace's minimum to its peak: the plans of the default
    planner, of ``dqn-search`` and of ``swap-all`` (every activation offloaded), each trained
    through the runtime: step time, peaks, under the limit or not, the simulator's step time
    for the plan and the measured one over it, and whether its losses are unplanned training's
    bit for bit (deterministic algorithms on).

Cells run in that order until ``--budget`` seconds have passed since the start; the rest are
listed as not run.  ``estimate_seconds`` is the run's own estimate of its time on a GPU, from
allowances per recording, training run and plan (:data:`ALLOWANCE`), before anything runs.

::

    GPU_CHECK_OUT=/tmp/report bash scripts/gpu_check.sh             # on the GPU machine
    GPU_CHECK_OUT=/tmp/report bash scripts/gpu_check.sh --dry-run   # anywhere, in a minute
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (model, batch) on a GPU, and in a dry run.
MODELS = (("resnet50", 64), ("hf:llama", 256), ("unet", 8), ("gpt", 8))
DRY_MODELS = (("resnet_tiny", 4), ("gpt_tiny", 2))
#: The limits after per-block checkpointing's peak ("checkpoint").
LIMITS = ("checkpoint", "50%", "70%", "30%")
BASE_METHODS = ("unplanned", "torch-checkpoint", "save_on_cpu")
SEARCH_BUDGET = 2.0  # seconds of auto's and of dqn-search's search per plan on a GPU
DRY_SEARCH_BUDGET = 0.3
#: Seconds allowed on the GPU machine: the CUDA tests, one recording, one training run of a method
#: (model built, warm-up and measured steps), and a plan besides its search budget.
ALLOWANCE = {"tests": 90.0, "record": 8.0, "train": 3.0, "plan": 1.5}
BUDGET = 450.0  # seconds on a GPU before the remaining cells are skipped (the run must end within 8 minutes)


#: The planners given the search budget, and the option each takes it by.
SEARCHING = {"auto": "time_limit", "dqn-search": "time_limit"}


def default_planner() -> str:
    """The planner every entry point uses by default (``autoplan``'s), whatever it is now."""
    from dqn_swap import autoplan

    return str(inspect.signature(autoplan).parameters["planner"].default)


def planners() -> tuple[str, ...]:
    return tuple(dict.fromkeys((default_planner(), "dqn-search", "swap-all")))


def estimate_seconds(models: tuple[tuple[str, int], ...] = MODELS, search: float = SEARCH_BUDGET) -> float:
    """The run's time on a GPU from :data:`ALLOWANCE`, before anything runs."""
    cells = len(LIMITS) * len(planners())
    searching = sum(p in SEARCHING for p in planners())
    per_model = ALLOWANCE["record"] + len(BASE_METHODS) * ALLOWANCE["train"]
    per_model += cells * (ALLOWANCE["train"] + ALLOWANCE["plan"]) + len(LIMITS) * searching * search
    return ALLOWANCE["tests"] + len(models) * per_model


def cuda_tests(dry: bool) -> dict[str, Any]:
    """``pytest -m gpu``: its exit status and last line (not run in a dry run: without CUDA they
    skip, and collecting the suite costs CI 20 s)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"]
    if dry:
        return {"command": " ".join(["python", *cmd[1:]]), "exit_status": None, "summary": "not run in a dry run",
                "seconds": 0.0}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=ALLOWANCE["tests"] * 2,
                           cwd=Path(__file__).resolve().parents[1])
        lines = [ln for ln in (p.stdout + p.stderr).strip().splitlines() if ln.strip()]
        status, last = p.returncode, lines[-1] if lines else ""
    except subprocess.TimeoutExpired:
        status, last = None, f"stopped after {ALLOWANCE['tests'] * 2:.0f} s"
    return {"command": " ".join(["python", *cmd[1:]]), "exit_status": status, "summary": last,
            "seconds": round(time.perf_counter() - t0, 1)}


def _base(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("status", "step_time_s", "throughput", "peak_allocated", "peak_reserved", "error")
    return {k: result[k] for k in keys if k in result}


def check_model(name: str, batch: int, device: Any, *, steps: int, warmup: int, search: float,
                deadline: float, say: Any, limits: tuple[str, ...] = LIMITS) -> dict[str, Any]:
    """Every measurement of one model (module docstring), until ``deadline`` (``time.perf_counter``)."""
    import torch

    from dqn_swap.integrations.experiment import _profile, _resolve_limit, make_planned, record, simulate_plan, train_steps
    from dqn_swap.limits import MemoryLimitError
    from dqn_swap.agents import get_planner

    out: dict[str, Any] = {"model": name, "batch_size": batch, "cells": [], "not_run": []}
    profile = _profile(None, device)
    say(f"{name} b{batch}: recording")
    trace = record(name, batch, device, profile)
    out["trace"] = {"ops": trace.n_ops, "peak_bytes": trace.peak_bytes, "minimum_memory": trace.minimum_memory,
                    "outside_bytes": trace.outside_bytes, "op_time_sum_s": float(trace.compute_time)}
    base: dict[str, Any] = {}
    for method in BASE_METHODS:
        say(f"{name}: {method}")
        base[method] = train_steps(name, batch, method, steps, device, seed=0, warmup=warmup,
                                   cpu_baseline=trace.initial_bytes)
    out["methods"] = {m: _base(r) for m, r in base.items()}
    unplanned = base["unplanned"]
    step = unplanned.get("step_time_s")
    if unplanned.get("status") == "ok" and step:
        out["trace"]["op_time_sum_over_step"] = float(trace.compute_time) / step
    peak = int(unplanned.get("peak_allocated") or trace.peak_bytes)
    ckpt = base["torch-checkpoint"]
    for limit_spec in limits:
        spec: Any = limit_spec
        if limit_spec == "checkpoint":
            if ckpt.get("status") != "ok" or "peak_allocated" not in ckpt:
                out["not_run"].append({"limit": limit_spec, "why": "per-block checkpointing did not run"})
                continue
            spec = int(ckpt["peak_allocated"])  # the device's bytes, as the allocator counted them
        for planner in planners():
            cell: dict[str, Any] = {"limit": limit_spec, "planner": planner}
            if time.perf_counter() > deadline:
                out["not_run"].append({**cell, "why": "time budget spent"})
                continue
            try:
                limit = _resolve_limit(spec, trace, peak)
            except MemoryLimitError as e:
                out["cells"].append({**cell, "status": "below the minimum", "error": str(e).split(" (")[0]})
                continue
            cell["limit_bytes"] = limit + trace.outside_bytes
            say(f"{name}: {planner} at {limit_spec}")
            options = {SEARCHING[planner]: search} if planner in SEARCHING else {}
            t0 = time.perf_counter()
            plan = make_planned(trace, limit, get_planner(planner, **options), profile)
            cell["plan_seconds"] = round(time.perf_counter() - t0, 2)
            sim = simulate_plan(trace, plan)
            cell.update(swaps=plan.n_swap, recomputes=plan.n_recompute, simulated_step_s=sim["makespan"],
                        simulated_feasible=sim["feasible"])
            run = train_steps(name, batch, "planned", steps, device, plan=plan, trace=trace, seed=0, warmup=warmup,
                              cpu_baseline=trace.initial_bytes)
            cell.update(_base(run))
            if run.get("status") == "ok":
                measured = run["step_time_s"]
                cell["measured_over_simulated"] = measured / sim["makespan"] if sim["makespan"] else None
                if "peak_allocated" in run:
                    cell["under_limit"] = int(run["peak_allocated"]) <= cell["limit_bytes"]
                if unplanned.get("status") == "ok":
                    cell["identical_losses"] = run["losses"] == unplanned["losses"]
                    cell["over_unplanned"] = measured / step if step else None
                if ckpt.get("status") == "ok":
                    cell["over_checkpoint"] = measured / ckpt["step_time_s"]
            out["cells"].append(cell)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return out


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else (fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x))


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# GPU check ({'dry run, ' if result['dry_run'] else ''}{result['device']})", "",
             f"`{result['command']}` · commit {str(result.get('commit') or '?')[:12]} · {result['machine']} · "
             f"{result['date']}", "",
             f"- time: {result['elapsed_seconds']:.0f} s (estimate for a GPU: {result['estimate_seconds']:.0f} s)",
             f"- CUDA tests: {result['tests']['summary']} (exit status {result['tests']['exit_status']})", ""]
    for m in result["models"]:
        t = m.get("trace", {})
        lines += [f"## {m['model']} b{m['batch_size']}", "",
                  f"Trace: {t.get('ops', '-')} ops; op times sum to {_f(t.get('op_time_sum_s'), '{:.4f}')} s, "
                  f"{_f(t.get('op_time_sum_over_step'))} times the unplanned step.", "",
                  "| method | step (s) | peak allocated | peak reserved |", "|---|---|---|---|"]
        for name, r in m.get("methods", {}).items():
            lines.append(f"| {name} | {_f(r.get('step_time_s'), '{:.4f}')} | {_f(r.get('peak_allocated'), '{:,}')} | "
                         f"{_f(r.get('peak_reserved'), '{:,}')} |")
        lines += ["", "| limit | planner | swaps | recomputes | step (s) | / unplanned | / checkpoint | simulated (s) | "
                  "measured / simulated | peak allocated | limit | under | identical |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in m.get("cells", []):
            if c.get("status") == "below the minimum":
                lines.append(f"| {c['limit']} | {c['planner']} | below the minimum any plan needs ||||||||||| ")
                continue
            lines.append(f"| {c['limit']} | {c['planner']} | {c.get('swaps', '-')} | {c.get('recomputes', '-')} | "
                         f"{_f(c.get('step_time_s'), '{:.4f}')} | {_f(c.get('over_unplanned'))} | "
                         f"{_f(c.get('over_checkpoint'))} | {_f(c.get('simulated_step_s'), '{:.4f}')} | "
                         f"{_f(c.get('measured_over_simulated'))} | {_f(c.get('peak_allocated'), '{:,}')} | "
                         f"{_f(c.get('limit_bytes'), '{:,}')} | {_f(c.get('under_limit'))} | "
                         f"{_f(c.get('identical_losses'))} |")
        if m.get("not_run"):
            lines += ["", "Not run: " + "; ".join(f"{c.get('planner', '')} {c['limit']} ({c['why']})"
                                                  for c in m["not_run"])]
        if m.get("error"):
            lines += ["", f"Stopped: {m['error']}"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="tiny models on the CPU (what CI runs)")
    ap.add_argument("--budget", type=float, help=f"seconds before the remaining cells are skipped "
                                                 f"(default {BUDGET:.0f} on a GPU, unlimited in a dry run)")
    ap.add_argument("--commit", help="the commit checked out, where the copy has no git history")
    ap.add_argument("--models", help="MODEL:BATCH,... instead of the run's own (a shorter dry run)")
    ap.add_argument("--limits", help=f"limits instead of {','.join(LIMITS)} (checkpoint: its measured peak)")
    args = ap.parse_args(argv)
    import torch

    from common import provenance
    from dqn_swap.files import write_text
    from machine import relative_paths

    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here; --dry-run runs it on the CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if dry else "cuda")
    if not dry:
        torch.use_deterministic_algorithms(True, warn_only=True)  # bit-identity across methods
        torch.backends.cudnn.benchmark = False
    models = DRY_MODELS if dry else MODELS
    if args.models:
        from dqn_swap.models import split_model_spec

        models = tuple((n, int(b or 1)) for n, b in (split_model_spec(x) for x in args.models.split(",")))
    limits = tuple(args.limits.split(",")) if args.limits else LIMITS
    start = time.perf_counter()
    budget = args.budget if args.budget is not None else (None if dry else BUDGET)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {**provenance(), "dry_run": dry, "device": torch.cuda.get_device_name() if not dry else "cpu",
                              "torch": torch.__version__, "default_planner": default_planner(),
                              "estimate_seconds": estimate_seconds(), "budget_seconds": budget, "models": []}
    if args.commit:
        result["commit"] = args.commit

    def say(msg: str) -> None:
        print(f"[gpu_check {time.perf_counter() - start:.0f}s] {msg}", file=sys.stderr, flush=True)

    def write() -> None:
        result["elapsed_seconds"] = time.perf_counter() - start
        write_text(out / "gpu_check.json", json.dumps(relative_paths(result), indent=1, default=str) + "\n",
                   overwrite=True)
        write_text(out / "gpu_check.md", markdown(result), overwrite=True)

    say(f"estimate on a GPU: {result['estimate_seconds']:.0f} s; the CUDA tests")
    result["tests"] = cuda_tests(dry)
    write()
    for name, batch in models:
        try:
            result["models"].append(check_model(name, batch, device, steps=1 if dry else 5, warmup=1,
                                                search=DRY_SEARCH_BUDGET if dry else SEARCH_BUDGET,
                                                deadline=start + (budget if budget is not None else float("inf")),
                                                say=say, limits=limits))
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the others still run
            result["models"].append({"model": name, "batch_size": batch, "error": f"{type(e).__name__}: {e}"[:400]})
        write()
    say(f"done: {out / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
