#!/usr/bin/env python
"""Planned training on models and loops dqn-swap was not written on: does it stop, exceed its
limit, or train differently?

Every cell trains one workload of :mod:`loop_zoo` (Hugging Face models from small configurations
with their defaults, PyG networks, custom ``autograd.Function``s, ``nn.MultiheadAttention``, a
channels_last CNN) in one loop (plain, outputs held past ``optimizer.step()``, accumulation with
clipping, a parameter group added midway, ``retain_graph`` with two backward passes, padded
batches), in fp32 or bf16 autocast, at one limit, through one entry point:

- ``autoplan``: ``dqn_swap.autoplan(model, limit, optimizer=...)`` in the loop;
- ``execution``: a trace recorded with ``dqn_swap.record_trace`` on a separate build, planned, and
  followed with ``PlannedExecution(..., on_mismatch="safe")`` (no re-planning);
- ``trainer``: ``transformers.Trainer`` with ``DataCollatorWithPadding`` over sequences of varying
  length and the ``AutoPlanCallback``.

For each cell, against the same loop trained unplanned from the same seeds:

- **stopped**: the run raised (the line is kept);
- **over**: steps whose bytes alive at their peak (from one allocator timeline over the whole run,
  from before the model is built: the step's start included) exceed the limit of the plan they
  followed, or, for the steps before a plan exists (warm-up, recording), of the plan made from
  them;
- **ratio**: measured / predicted peak of every step that followed its plan to the end (predicted:
  the simulator's instant-copy peak), its range over the cell; the steps before the optimizer's
  first step (no gradients or optimizer state yet, where the trace is a steady-state iteration)
  are kept apart (``cold_ratio``);
- **identical**: the model's ``state_dict`` and the optimizer's state bit-identical at the end, and
  every loss;
- **variants** planned and the share of steps that ran in **safe** mode.

::

    python benchmarks/bench_varying_loops.py --json benchmarks/results/varying_loops_cpu.json \\
        --md benchmarks/results/varying_loops_cpu.md
    python benchmarks/bench_varying_loops.py --models qwen2 pyg-gcn --quick   # a few cells
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loop_zoo as z  # noqa: E402
from common import provenance, publish  # noqa: E402

LIMITS = ("70%", "40%")
PRECISIONS = ("fp32", "bf16")
STEPS = 8
SHAPE_STEPS = 100  # steps of a workload whose shapes change at every step


def bf16(on: bool) -> Any:
    """bf16 autocast on the CPU, where ``on``: what the loops enter around the model and the loss."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


class Positional(torch.nn.Module):
    """The model called with positional arguments (``record_trace`` takes a tuple), or keywords.

    ``autocast``: its forward runs under bf16 autocast (recording a bf16 loop: the loop enters
    autocast around the model; the recorded build must have the same modules, since the runtime
    numbers ops from the forward pass's module calls)."""

    def __init__(self, inner: torch.nn.Module, keys: tuple[str, ...], autocast: bool = False) -> None:
        super().__init__()
        self.inner, self.keys, self.autocast = inner, keys, autocast

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with bf16(self.autocast):
            return self.inner(**dict(zip(self.keys, args)), **kwargs)


def _predicted(entry: Any, cache: dict[int, int]) -> int:
    from dqn_swap.simulator import instant_copy_peak

    key = id(entry.plan)
    if key not in cache:
        cache[key] = instant_copy_peak(entry.trace, entry.plan)
    return cache[key]


def _variant_limit(entry: Any, entries: dict[str, Any], peak: int) -> int | None:
    """For a step that left ``entry``'s plan (or waited in safe mode for its signature's plan) and
    peaked at ``peak`` above its limit: the limit of another variant of the same signature that the
    peak stays within (the largest), or None.

    A percentage limit is resolved per variant, on each iteration's own range between its minimum
    and its peak.  A step that leaves its plan is another iteration, often one recorded later as a
    variant of its own, whose limit in bytes may be higher (padding adds ops and bytes).  Which
    variant the step was is not known; a step within some variant's limit is reported apart."""
    if entry is None:
        return None

    def signature(e: Any) -> str:  # (PlannedExecution's cells have one plan and no variants)
        return getattr(e, "signature_key", "") or getattr(e, "key", "")

    limits = [int(e.plan.memory_limit) for e in entries.values() if signature(e) == signature(entry)
              and e is not entry and peak <= int(e.plan.memory_limit)]
    return max(limits) if limits else None


def judge(ref: z.Run, got: z.Run, entries: dict[str, Any], first_limit: int | None, cold: int = 1
          ) -> dict[str, Any]:
    """The cell's figures (module docstring) from its run and the unplanned reference.

    The ratio is taken over the steps after the first ``cold`` (those before the optimizer's first
    step, which start without gradients and optimizer state, where the trace is a steady-state
    iteration: they stay below their prediction); theirs is kept apart as ``cold_ratio``."""
    cache: dict[int, int] = {}
    over, ratios, safe = [], [], 0
    for i, s in enumerate(got.steps):
        entry = entries.get(s.entry) if s.entry is not None else None
        limit = entry.plan.memory_limit if entry is not None else first_limit
        if s.diverged:
            safe += 1
        if limit is not None and s.peak > limit:
            over.append({"step": i, "kind": s.kind, "peak": s.peak, "limit": int(limit), "start": s.start,
                         "safe_from": s.safe_from if s.diverged else None,
                         "unplanned_peak": ref.steps[i].peak if i < len(ref.steps) else None,
                         "variant_limit": _variant_limit(entry, entries, s.peak)
                         if s.diverged or s.kind == "waiting" else None})
        if s.kind == "planned" and entry is not None and not s.diverged:
            ratios.append((i, s.peak / _predicted(entry, cache)))
    diffs = z.differences(ref.state, got.state)
    same_losses = ref.losses == got.losses
    values = [r for i, r in ratios if i >= cold]
    cold_values = [r for i, r in ratios if i < cold]
    return {"over": over, "ratio_min": min(values) if values else None, "ratio_max": max(values) if values else None,
            "cold_ratio": min(cold_values) if cold_values else None,
            "ratios": [[i, round(r, 4)] for i, r in ratios], "followed": len(ratios), "safe_steps": safe, "steps": len(got.steps),
            "identical": not diffs and same_losses, "differences": diffs[:3] + ([] if same_losses else ["losses"])}


#: autoplan's ``planning`` in the autoplan cells (``--planning``): ``"inline"``, its default, or ``"background"``.
PLANNING = "inline"


def autoplan_cell(w: z.Workload, loop: str, precision: str, limit: str, planner: str, ref: z.Run) -> dict[str, Any]:
    from dqn_swap import autoplan

    got, planned = z.run_loop(w, loop, precision, STEPS, lambda m, o: autoplan(
        m, limit, optimizer=o, planner=planner, verbose=False, planning=PLANNING))
    for s in got.steps:  # safe mode: the planned step's stats say whether it left its plan
        s.diverged = False
    _mark_safe(got, planned)
    first = next(iter(planned.entries.values()), None)
    _own_signature(got, planned)
    out = judge(ref, got, planned.entries, first.plan.memory_limit if first is not None else None,
                cold=2 if loop == "accumulate" else 1)
    out["variants"] = sum(len(v) for v in planned.variants.values())
    out["signatures"] = len(planned.variants)
    out["foreign_collections"] = got.foreign_collections
    return out


def _mark_safe(run: z.Run, planned: Any) -> None:
    """The steps that left their plan, and from which saved tensor they ran in safe mode, from
    autoplan's log ("step N: left the plan of ...; ran on in safe mode from saved tensor #K")."""
    for line in planned.log:
        if line.startswith("step ") and ": left the plan" in line:
            step = run.steps[int(line.split()[1].rstrip(":"))]
            step.diverged = True
            m = re.search(r"in safe mode from saved tensor #(-?\d+)$", line)
            step.safe_from = int(m.group(1)) if m else None


def _own_signature(run: z.Run, planned: Any) -> None:
    """A warm-up step, and a step waiting in safe mode for its plan (background planning), is judged
    against the first plan of its own signature (gradient accumulation's micro-steps have two:
    without gradients and with them)."""
    for i, s in enumerate(run.steps):
        if s.kind in ("warmup", "waiting") and s.entry is None:
            variants = planned.variants.get(planned.step_signatures.get(i, ""), ())
            if variants:
                s.entry = variants[0].key


def execution_cell(w: z.Workload, loop: str, precision: str, limit: str, planner: str) -> dict[str, Any]:
    """record_trace on a separate build, one plan, PlannedExecution in the loop (against its own
    unplanned reference: the model is wrapped to take positional arguments)."""
    from dqn_swap import get_planner, record_trace
    from dqn_swap.limits import resolve_limit
    from dqn_swap.runtime import PlannedExecution

    first = w.batches(1)[0]
    keys = tuple(first)

    def build() -> torch.nn.Module:
        return Positional(w.build(), keys)

    wrapped = z.Workload(w.name, w.family, build, w.make, w.loss, w.pads)
    # The recorded build runs its forward and the loss under autocast, as the loop does around them.
    rec_model = Positional(w.build(), keys, autocast=precision == "bf16")

    def loss_fn(out: Any) -> torch.Tensor:
        with bf16(precision == "bf16"):
            return w.loss(out)

    trace = record_trace(rec_model, tuple(first[k] for k in keys), loss_fn,
                         lambda params: z._optimizer_of(list(params)), device="cpu")
    plan = get_planner(planner).plan(trace, resolve_limit(trace, limit))
    ref, _ = z.run_loop(wrapped, loop, precision, STEPS)
    got, rt = z.run_loop(wrapped, loop, precision, STEPS, lambda m, o: PlannedExecution(
        m, plan, trace, on_mismatch="safe", allow_infeasible=True))

    class E:  # one entry: the plan
        pass

    e = E()
    e.plan, e.trace = plan, trace
    for s in got.steps:
        s.entry = "plan"
    out = judge(ref, got, {"plan": e}, plan.memory_limit, cold=2 if loop == "accumulate" else 1)
    out["variants"], out["signatures"] = 1, 1
    return out


def trainer_cell(w: z.Workload, precision: str, limit: str, planner: str) -> dict[str, Any]:
    """``transformers.Trainer`` with ``DataCollatorWithPadding`` (sequences of 8 to 16 tokens, padded to
    the longest of each batch) and the callback, against the same Trainer without it."""
    import transformers

    from dqn_swap.meter import AllocatorTimeline
    from dqn_swap.trainer import AutoPlanCallback

    g = torch.Generator().manual_seed(z.SEED)
    rows = []
    for _ in range(4 * STEPS):
        n = int(torch.randint(z.SEQ // 2, z.SEQ + 1, (1,), generator=g))
        ids = torch.randint(3, 96, (n,), generator=g).tolist()
        row = {"input_ids": ids}
        row["labels"] = int(torch.randint(0, 3, (1,), generator=g)) if w.name in ("deberta-v2", "bert", "distilbert") \
            else None
        rows.append(row)
    collate_pad = transformers.DataCollatorWithPadding(tokenizer=z.PadTokenizer(), padding="longest")

    def collate(features: list[dict[str, Any]]) -> dict[str, Any]:
        with AllocatorTimeline.aside():  # host memory: on a GPU the batch reaches the device in the step
            return _collate(features)

    def _collate(features: list[dict[str, Any]]) -> dict[str, Any]:
        labels = [f.pop("labels") for f in features]
        b = dict(collate_pad([{"input_ids": f["input_ids"]} for f in features]))
        if labels[0] is not None:
            b["labels"] = torch.tensor(labels)
        else:
            b["labels"] = b["input_ids"].masked_fill(b["attention_mask"] == 0, -100)
        return b

    def train(callback: Any, tmp: str) -> tuple[z.Run, Any]:
        run = z.Run()
        marks: list[tuple[str, dict[str, Any]]] = []
        timeline = AllocatorTimeline(own_blocks=True)
        with timeline, z.host_rng_states():
            model = w.build()
            args = transformers.TrainingArguments(
                output_dir=tmp, per_device_train_batch_size=4, max_steps=STEPS, report_to=[], use_cpu=True,
                seed=z.SEED, save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                bf16=precision == "bf16", max_grad_norm=1.0, lr_scheduler_type="linear", warmup_steps=1)

            class Measure(transformers.TrainerCallback):
                def on_pre_optimizer_step(self, *a: Any, **k: Any) -> None:
                    name = f"step{len(marks)}"
                    AllocatorTimeline.instant(name + ">")
                    info: dict[str, Any] = {}
                    if callback is not None and callback.planned is not None:
                        p = callback.planned
                        info = {"kind": p.last, "entry": p.last_entry.key if p.last_entry is not None else None,
                                "diverged": bool(p.last == "planned" and p.stats is not None and p.stats.diverged)}
                        if info["diverged"]:
                            info["safe_from"] = p.stats.diverged_at
                    marks.append((name, info))

            trainer = transformers.Trainer(model=model, args=args, train_dataset=[dict(r) for r in rows],
                                           data_collator=collate,
                                           callbacks=[callback, Measure()] if callback else [Measure()])
            step = trainer.training_step

            def measured(model: Any, inputs: dict[str, Any], *a: Any, **k: Any) -> Any:
                AllocatorTimeline.instant(f"step{len(marks)}<")
                # The batch's copy on the device, as the Trainer moves it there on a GPU (the collated
                # one, and the next one it fetches ahead, are host memory there).
                inputs = {key: v.clone() if isinstance(v, torch.Tensor) else v for key, v in inputs.items()}
                out = step(model, inputs, *a, **k)
                run.losses.append(float(out.detach().float()))
                return out

            trainer.training_step = measured
            trainer.train()
            run.state = z.state_of(model, trainer.optimizer.optimizer
                                   if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer)
        run.foreign_collections = timeline.foreign_collections
        for name, info in marks:
            before, peak = timeline.between(name + "<", name + ">")
            run.steps.append(z.StepRecord(before, peak, info.get("kind", "unplanned"), info.get("entry"),
                                          bool(info.get("diverged", False)), info.get("safe_from")))
        return run, callback

    with tempfile.TemporaryDirectory() as tmp:
        ref, _ = train(None, tmp)
        cb = AutoPlanCallback(limit, planner=planner)
        got, _ = train(cb, tmp)
    planned = cb.planned
    for i, s in enumerate(got.steps):
        if s.kind == "record":
            s.entry = planned.recorded.get(i)
    _own_signature(got, planned)
    first = next(iter(planned.entries.values()), None)
    out = judge(ref, got, planned.entries, first.plan.memory_limit if first is not None else None)
    out["variants"] = sum(len(v) for v in planned.variants.values())
    out["signatures"] = len(planned.variants)
    out["foreign_collections"] = got.foreign_collections
    return out


def shapes_cell(name: str, mode: str, limit: str, planner: str, steps: int) -> dict[str, Any]:
    """A workload whose shapes change at every step (:data:`loop_zoo.VARYING`: neighbour-sampled graphs,
    unpadded sequences), ``steps`` steps with ``autoplan(shapes=mode)``: "exact" records and plans
    every new set of shapes, "bucket" plans a bucket's envelope and follows it on smaller members."""
    from dqn_swap import autoplan

    ref, _ = z.run_varying(name, steps)
    got, planned = z.run_varying(name, steps, lambda m, o: autoplan(m, limit, optimizer=o, planner=planner,
                                                                     verbose=False, shapes=mode, planning=PLANNING))
    _mark_safe(got, planned)
    first = next(iter(planned.entries.values()), None)
    _own_signature(got, planned)
    out = judge(ref, got, planned.entries, first.plan.memory_limit if first is not None else None)
    kinds = Counter(s.kind for s in got.steps)
    out.update(variants=len(planned.entries), signatures=len(planned.variants), replans=planned.replans,
               recorded_steps=kinds.get("record", 0), planned_steps=kinds.get("planned", 0),
               planning_seconds_per_100_steps=round(100 * planned.planning_seconds / steps, 3),
               foreign_collections=got.foreign_collections)
    return out


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def cells(models: list[str], quick: bool, shape_models: list[str] = (), loops: list[str] | None = None,
          entries: list[str] | None = None) -> list[tuple[str, ...]]:
    """(entry point, model, loop, precision, limit) of every cell (of ``loops`` and ``entries`` alone,
    when given)."""
    out = []
    for name in shape_models:
        for mode in ("exact", "bucket"):
            for limit in LIMITS[1:] if quick else LIMITS:
                out.append(("shapes", name, mode, "fp32", limit))
    for name in models:
        w = z.WORKLOADS[name]()
        mine = [loop for loop in z.loops_for(w) if loops is None or loop in loops]
        for loop in (mine[:2] if quick else mine):
            for precision in PRECISIONS[:1] if quick else PRECISIONS:
                for limit in LIMITS[1:] if quick else LIMITS:
                    out.append(("autoplan", name, loop, precision, limit))
        for precision in PRECISIONS[:1] if quick else PRECISIONS:
            for limit in LIMITS[1:] if quick else LIMITS:
                loop = "padded" if w.pads else "plain"
                if loops is None or loop in loops:
                    out.append(("execution", name, loop, precision, limit))
                if w.collate and (loops is None or "collator" in loops):
                    out.append(("trainer", name, "collator", precision, limit))
    return [c for c in out if entries is None or c[0] == "shapes" or c[0] in entries]


def run(models: list[str], planner: str, quick: bool, progress: bool = True,
        shape_models: list[str] = (), loops: list[str] | None = None, entries: list[str] | None = None
        ) -> dict[str, Any]:
    torch.set_num_threads(1)
    todo = cells(models, quick, shape_models, loops, entries)
    refs: dict[tuple[str, str, str], z.Run] = {}
    results = []
    t0 = time.time()
    for i, (entry, name, loop, precision, limit) in enumerate(todo):
        w = z.WORKLOADS[name]() if name in z.WORKLOADS else None
        start = time.thread_time()
        row: dict[str, Any] = {"entry": entry, "model": name, "loop": loop, "precision": precision, "limit": limit}
        sink = io.StringIO()
        try:
            with contextlib.redirect_stderr(sink):
                if entry == "autoplan":
                    key = (name, loop, precision)
                    if key not in refs:
                        refs[key] = z.run_loop(w, loop, precision, STEPS)[0]
                    row.update(autoplan_cell(w, loop, precision, limit, planner, refs[key]))
                elif entry == "execution":
                    row.update(execution_cell(w, loop, precision, limit, planner))
                elif entry == "trainer":
                    row.update(trainer_cell(w, precision, limit, planner))
                else:
                    row.update(shapes_cell(name, loop, limit, planner, 30 if quick else SHAPE_STEPS))
            row["stopped"] = None
        except Exception as e:  # noqa: BLE001 - a stop is what the benchmark counts
            row["stopped"] = _one_line(e)
        row["cpu_s"] = round(time.thread_time() - start, 2)
        gc.collect()
        results.append(row)
        if progress:
            state = ("STOP " + row["stopped"]) if row["stopped"] else (
                f"over {len(row['over'])}  ratio {_r(row['ratio_min'])}-{_r(row['ratio_max'])}  "
                f"{'identical' if row['identical'] else 'DIFFERENT ' + ','.join(row['differences'])}  "
                f"variants {row['variants']}  safe {row['safe_steps']}/{row['steps']}"
                + (f"  collections on another thread {row['foreign_collections']}"
                   if row.get("foreign_collections") else ""))
            print(f"[{i + 1}/{len(todo)} {time.time() - t0:.0f}s] {entry} {name} {loop} {precision} {limit}: {state}",
                  file=sys.stderr, flush=True)
    return {"planner": planner, "planning": PLANNING, "steps_per_cell": STEPS, "cells": results,
            "summary": summarize(results)}


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if not r["stopped"]]
    ratios = [x for r in done for x in (r["ratio_min"], r["ratio_max"]) if x is not None]
    per_model: dict[str, dict[str, Any]] = {}
    for r in rows:
        m = per_model.setdefault(r["model"], {"cells": 0, "stopped": 0, "over_steps": 0, "different": 0,
                                              "variants": 0, "steps": 0, "safe_steps": 0})
        m["cells"] += 1
        if r["stopped"]:
            m["stopped"] += 1
            continue
        m["over_steps"] += len(r["over"])
        m["different"] += not r["identical"]
        m["variants"] += r["variants"]
        m["steps"] += r["steps"]
        m["safe_steps"] += r["safe_steps"]
    return {"cells": len(rows), "models": len(per_model), "stopped": len(rows) - len(done),
            "stop_causes": dict(Counter(r["stopped"].split(":")[0] + ": " + r["stopped"].partition(": ")[2][:90]
                                        for r in rows if r["stopped"]).most_common()),
            "cells_over": sum(bool(r["over"]) for r in done), "steps_over": sum(len(r["over"]) for r in done),
            # steps over the limit of the plan they left, by where they left it: at the first saved
            # tensor (the whole step in safe mode) or midway
            "steps_over_safe_whole": sum(o.get("safe_from") == 0 for r in done for o in r["over"]),
            "steps_over_safe_midway": sum((o.get("safe_from") or 0) > 0 for r in done for o in r["over"]),
            # of those, steps within the limit of another variant of their signature (_variant_limit)
            "steps_over_within_a_variant": sum(o.get("variant_limit") is not None for r in done for o in r["over"]),
            "different": sum(not r["identical"] for r in done),
            # garbage collections on another thread that freed objects during a measured run: frees
            # the allocator timeline did not see, so those cells' figures are upper bounds
            "foreign_collections": sum(r.get("foreign_collections", 0) for r in done),
            "cells_over_with_foreign_collections": sum(bool(r["over"]) and r.get("foreign_collections", 0) > 0
                                                       for r in done),
            "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
            "cells_ratio_outside": sum(1 for r in done if r["ratio_min"] is not None
                                       and (r["ratio_min"] < 0.95 or r["ratio_max"] > 1.0)),
            "per_model": per_model}


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    planning = ", planning in the background" if result.get("planning") == "background" else ""
    lines = [f"# Planned training on varying loops ({s['cells']} cells, {s['models']} models, planner "
             f"`{result['planner']}`{planning})", "",
             f"- stopped: {s['stopped']}", f"- cells with a step over the limit: {s['cells_over']} "
             f"({s['steps_over']} steps)", f"- not bit-identical: {s['different']}",
             f"- measured/predicted on followed steps: {_r(s['ratio_min'])} to {_r(s['ratio_max'])} "
             f"({s['cells_ratio_outside']} cells outside [0.95, 1.00])"]
    if s.get("foreign_collections"):
        lines.append(f"- garbage collections on another thread during measured runs: {s['foreign_collections']} "
                     f"(frees the allocator timeline does not see; in {s['cells_over_with_foreign_collections']} "
                     "of the cells over the limit)")
    lines.append("")
    kinds = Counter(o["kind"] for r in result["cells"] if not r["stopped"] for o in r.get("over", ()))
    if kinds:
        lines += ["Steps over the limit, by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()) + "."]
        if s.get("steps_over_safe_whole") or s.get("steps_over_safe_midway"):
            lines += [f"Of those, steps that left the plan they started: {s['steps_over_safe_whole']} at their first "
                      f"saved tensor (the whole step in safe mode), {s['steps_over_safe_midway']} midway. Each is "
                      "judged against the limit of the plan it left; a percentage limit is resolved per variant.",
                      f"Of the steps over, {s.get('steps_over_within_a_variant', 0)} stay within the limit of another "
                      "variant of their signature (a percentage resolved on that iteration's own range)."]
        lines.append("")
    shapes = [r for r in result["cells"] if r["entry"] == "shapes" and not r["stopped"]]
    if shapes:
        lines += ["## Shapes that change at every step", "",
                  "| workload | shapes | limit | steps | plans | planned again | steps recorded | steps planned | "
                  "safe steps | planning CPU s per 100 steps | steps over | identical |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in shapes:
            lines.append(f"| {r['model']} | {r['loop']} | {r['limit']} | {r['steps']} | {r['variants']} | "
                         f"{r.get('replans', 0)} | {r.get('recorded_steps', '-')} | {r.get('planned_steps', '-')} | "
                         f"{r['safe_steps']} | {r.get('planning_seconds_per_100_steps', '-')} | {len(r['over'])} | "
                         f"{'yes' if r['identical'] else 'no'} |")
        lines.append("")
    if s["stop_causes"]:
        lines += ["## Stops", "", "| count | cause |", "|---|---|"]
        lines += [f"| {n} | {c.replace('|', '/')} |" for c, n in s["stop_causes"].items()] + [""]
    lines += ["## Per model", "", "| model | cells | stopped | steps over | different | variants | safe steps |",
              "|---|---|---|---|---|---|---|"]
    for name, m in s["per_model"].items():
        share = f"{m['safe_steps']}/{m['steps']}" if m["steps"] else "-"
        lines.append(f"| {name} | {m['cells']} | {m['stopped']} | {m['over_steps']} | {m['different']} | "
                     f"{m['variants']} | {share} |")
    bad = [r for r in result["cells"] if r["stopped"] or r.get("over") or not r.get("identical", True)]
    if bad:
        lines += ["", "## Cells that fell short", "", "| entry | model | loop | precision | limit | what |",
                  "|---|---|---|---|---|---|"]
        for r in bad:
            left = Counter("whole" if o.get("safe_from") == 0 else "midway" for o in r.get("over", ())
                           if o.get("safe_from") is not None)
            what = r["stopped"] or "; ".join(filter(None, [
                f"{len(r['over'])} steps over (worst {max(o['peak'] / o['limit'] for o in r['over']):.3f}x)"
                if r["over"] else "",
                ", ".join(f"{n} left the plan {'at the first saved tensor' if k == 'whole' else 'midway'}"
                          for k, n in sorted(left.items(), reverse=True)),
                "" if r["identical"] else "different: " + ", ".join(r["differences"])]))
            lines.append(f"| {r['entry']} | {r['model']} | {r['loop']} | {r['precision']} | {r['limit']} | "
                         f"{what.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(z.WORKLOADS), choices=list(z.WORKLOADS))
    ap.add_argument("--planner", default="dqn")
    ap.add_argument("--planning", choices=("inline", "background"), default="inline",
                    help="autoplan's planning in the autoplan cells: on the training thread, or on a worker")
    ap.add_argument("--shape-models", nargs="*", default=list(z.VARYING), choices=list(z.VARYING),
                    help="workloads whose shapes change at every step (exact shapes against buckets)")
    ap.add_argument("--quick", action="store_true", help="two loops, fp32, one limit per model")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--loops", nargs="*", help="only these loops (plain, held, accumulate, groups, retain, padded; "
                                               "collator: the Trainer)")
    ap.add_argument("--entries", nargs="*", choices=("autoplan", "execution", "trainer"),
                    help="only cells of these entry points")
    ap.add_argument("--merge", metavar="JSON", help="a result of an earlier run: the cells run now replace its "
                                                    "cells of the same entry, model, loop, precision and limit")
    args = ap.parse_args(argv)
    global PLANNING
    PLANNING = args.planning
    result = run(args.models, args.planner, args.quick, shape_models=args.shape_models, loops=args.loops,
                 entries=args.entries)
    if args.merge:
        import json

        earlier = json.loads(Path(args.merge).read_text())
        def key(c: dict[str, Any]) -> tuple[str, ...]:
            return c["entry"], c["model"], c["loop"], c["precision"], c["limit"]

        new = {key(c): c for c in result["cells"]}  # every cell run now replaces its earlier run, in place
        merged = [new.pop(key(c), c) for c in earlier["cells"]]
        result["cells"] = merged + list(new.values())
        result["summary"] = summarize(result["cells"])
        result["merged_from"] = {k: earlier.get(k) for k in ("command", "commit", "date")}
    result.update(provenance())
    publish(result, markdown(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
