"""What a plan does to a model, in the model's own terms (``dqn-swap explain``).

A plan file holds actions as index triples (event, tensor, kind) and a schedule of op
indices: exact for the runtime, unreadable for people.  :func:`explain_plan` simulates the
plan on its trace and says, for every action, which activation it is (the module and op that
made it, its bytes), when it leaves the device (after which op), when it comes back (the
copy's first op, and the op that needs it) or which ops re-run to re-create it.  It sums the
actions per module, and says where the limit binds: the first op at which the unplanned
iteration would overflow it, and the op of the planned peak.

Example::

    from dqn_swap import Plan, Trace
    from dqn_swap.explain import explain_plan

    trace = Trace.load("r50.trace")
    report = explain_plan(trace, Plan.load("plan.json", trace))
    for row in report["modules"]:
        print(row["module"], row["swapped_bytes"], row["recomputed_bytes"])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .cost import DeviceProfile, profile_of
from .plan import ActionKind, Plan
from .trace import Phase, Role, Trace

__all__ = ["explain_plan", "module_of", "copy_intervals", "phase_spans"]


def module_of(trace: Trace, tensor: int, depth: int | None = None) -> str:
    """The module path of the op that made ``tensor`` (``"<top>"`` for ops outside every module,
    ``"<input>"`` for the batch, ``"<before the iteration>"`` for other tensors that existed before
    it), cut to ``depth`` parts."""
    op = int(trace.tensor_alloc_op[tensor])
    if op < 0:
        return "<input>" if int(trace.tensor_role[tensor]) == Role.INPUT else "<before the iteration>"
    name = trace.module_names[int(trace.op_module[op])] or "<top>"
    if depth is not None and depth > 0 and name != "<top>":
        name = ".".join(name.split(".")[:depth])
    return name


def _op_text(trace: Trace, op: int) -> str:
    """``#12 aten.convolution`` (the module is in the row already)."""
    return f"#{op} {trace.op_names[int(trace.op_name[op])]}" if op >= 0 else "-"


def _first_overflow(trace: Trace, limit: int) -> int:
    """The first op whose memory, unplanned, is above ``limit`` (-1: none)."""
    over = np.flatnonzero(trace.op_memory > limit)
    return int(over[0]) if len(over) else -1


def explain_plan(trace: Trace, plan: Plan, profile: str | DeviceProfile | None = None,
                 depth: int | None = None, timeline: bool = False, where: str = "plan") -> dict[str, Any]:
    """Simulate ``plan`` on ``trace`` and describe it (module docstring).

    Args:
        trace: the trace the plan was made for.
        plan: the plan.
        profile: device profile for the simulation (default: the plan's).
        depth: sum the actions per module path cut to this many parts (``layer1.0.conv1`` at
            depth 2 is ``layer1.0``); None: the full path.
        timeline: also return the simulation itself under ``"_result"`` (for the plot).
        where: how a refusal names the plan (its file, from the command line).

    Returns:
        A JSON-friendly dict: ``plan`` (planner, limit, profile), ``figures`` (unplanned and
        planned peak, minimum, time and bytes moved), ``binds`` (where the limit binds),
        ``modules`` (per module: swapped and re-created tensors and bytes), ``actions`` (one
        row per action, in forward order).

    Raises:
        TypeError: ``trace`` or ``plan`` of another type.
        ValueError: ``depth`` below 1.
        PlanError: the plan was not made for the trace.
    """
    from .checks import expect
    from .simulator import simulate

    expect(trace, Trace, "trace", what="a Trace (Trace.load(path) reads one)")
    expect(plan, Plan, "plan", what="a Plan (Plan.load(path) reads one)")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth must be a whole number of module path parts, at least 1, not {depth!r}")
    plan.check_trace(trace, where)
    prof = profile_of(trace, profile or plan.profile)
    result = simulate(trace, plan.actions, plan.memory_limit, prof, timeline=True)
    sched = result.schedule  # the simulation's own, at this profile (the plan's, at the plan's profile)
    in_order = sorted(plan.actions, key=lambda a: (int(trace.event_op[a.event]), a.tensor))
    rows = _action_rows(trace, in_order, sched)
    modules = _by_module(trace, in_order, rows, depth)
    limit = int(plan.memory_limit)
    overflow = _first_overflow(trace, limit)
    peak_op = int(result.peak_op)
    binds = {
        "unplanned_peak_op": trace.op_label(trace.peak_op) if trace.n_ops else None,
        "first_overflow_op": trace.op_label(overflow) if overflow >= 0 else None,
        "overflow_bytes_there": int(trace.op_memory[overflow] - limit) if overflow >= 0 else 0,
        "planned_peak_op": trace.op_label(peak_op) if 0 <= peak_op < trace.n_ops else None,
        "headroom_bytes": limit - int(result.peak_bytes),
        "infeasible": result.infeasible.message(trace) if result.infeasible is not None else None,
    }
    figures = {
        "feasible": bool(result.feasible),
        "memory_limit_bytes": limit,
        "unplanned_peak_bytes": int(trace.peak_bytes),
        "planned_peak_bytes": int(result.peak_bytes),
        "minimum_memory_bytes": int(trace.minimum_memory),
        "compute_time_s": float(result.compute_time),
        "planned_time_s": float(result.makespan),
        "overhead": float(result.overhead),
        "swapped": plan.n_swap, "recomputed": plan.n_recompute,
        "swapped_bytes": int(sum(r["bytes"] for r in rows if r["kind"] == "swap")),
        "recomputed_bytes": int(sum(r["bytes"] for r in rows if r["kind"] == "recompute")),
        "recompute_time_s": float(result.recompute_time),
        "bytes_d2h": int(result.bytes_d2h), "bytes_h2d": int(result.bytes_h2d),
    }
    report: dict[str, Any] = {
        "plan": {"planner": plan.planner, **({"chosen": plan.settings["chosen"]} if plan.settings.get("chosen") else {}),
                 "memory_limit": limit, "profile": prof.name, "trace_fingerprint": plan.trace_fingerprint},
        "figures": figures, "binds": binds,
        "modules": modules,
        "actions": rows,
    }
    if timeline:
        report["_result"] = result
        report["_schedule"] = sched
        report["_profile"] = prof
    return report



def _action_rows(trace: Trace, in_order: list[Any], sched: Any) -> list[dict[str, Any]]:
    """One row per action, in forward order: the tensor, the op that made it, the op after which it
    leaves, the op that needs it back, and where its copy back starts or which ops re-make it."""
    _, return_op = trace.action_window
    prefetch_at = {int(t): int(op) for t, op in (sched.prefetch if sched is not None else ())}
    reruns: dict[int, tuple[int, list[int]]] = {}  # removed tensor -> (op it is re-created for, ops re-run)
    for before, steps in (sched.recompute if sched is not None else ()):
        ops = [int(s.op) for s in steps]
        for s in steps:
            for x in s.keep:
                reruns.setdefault(int(x), (int(before), ops))
    rows = []
    for a in in_order:
        t = int(a.tensor)
        made = int(trace.tensor_alloc_op[t])
        row = {"tensor": t, "kind": a.kind.name.lower(), "module": module_of(trace, t),
               "made_by": _op_text(trace, made), "bytes": int(trace.tensor_nbytes[t]),
               "role": Role(int(trace.tensor_role[t])).name.lower(),
               "leaves_after": _op_text(trace, int(trace.event_op[a.event])),
               "needed_by": _op_text(trace, int(return_op[t])) if return_op[t] >= 0 else "nothing (not read again)"}
        if a.kind == ActionKind.SWAP:
            start = prefetch_at.get(t)
            row["copy_back_from"] = _op_text(trace, start) if start is not None else "on demand"
        else:
            before, ops = reruns.get(t, (-1, []))
            row["re_run"] = [_op_text(trace, op) for op in ops]
            row["re_created_before"] = _op_text(trace, before)
        rows.append(row)
    return rows


def _by_module(trace: Trace, in_order: list[Any], rows: list[dict[str, Any]], depth: int | None
               ) -> list[dict[str, Any]]:
    """The actions summed per module path (cut to ``depth`` parts), modules in the order they first
    made a moved tensor."""
    modules: dict[str, dict[str, Any]] = {}
    for row, a in zip(rows, in_order):
        name = module_of(trace, a.tensor, depth)
        made = int(trace.tensor_alloc_op[a.tensor])
        m = modules.setdefault(name, {"module": name, "swapped": 0, "swapped_bytes": 0,
                                      "recomputed": 0, "recomputed_bytes": 0, "_first": made})
        m["_first"] = min(m["_first"], made)
        key = "swapped" if a.kind == ActionKind.SWAP else "recomputed"
        m[key] += 1
        m[key + "_bytes"] += row["bytes"]
    return [{k: v for k, v in m.items() if k != "_first"} for m in sorted(modules.values(), key=lambda m: m["_first"])]

def copy_intervals(trace: Trace, result: Any, schedule: Any, profile: DeviceProfile
                   ) -> dict[str, list[tuple[float, float]]]:
    """When the simulated iteration copies and re-runs: ``{"to host": [(start, end)], "back":
    [...], "re-run": [...]}`` in the simulation's seconds (from ``result`` of a ``timeline=True``
    run).  A copy to the host ends where the simulator says (``swap_out_end``) and lasts its
    transfer time; copies back start at their scheduled op, one after another on the one
    host-to-device channel; re-runs end where the op they are for starts."""
    op_start = result.op_start
    n = len(op_start) if op_start is not None else 0
    out: dict[str, list[tuple[float, float]]] = {"to host": [], "back": [], "re-run": []}
    for t, end in sorted((result.swap_out_end or {}).items()):
        dur = float(profile.transfer_time(float(trace.tensor_nbytes[t]), "d2h"))
        out["to host"].append((float(end) - dur, float(end)))
    free = 0.0
    for t, op in (schedule.prefetch if schedule is not None else ()):
        if op >= n:
            continue
        dur = float(profile.transfer_time(float(trace.tensor_nbytes[t]), "h2d"))
        start = max(float(op_start[op]), free)
        free = start + dur
        out["back"].append((start, free))
    for before, steps in (schedule.recompute if schedule is not None else ()):
        if before >= n:
            continue
        dur = float(sum(trace.op_duration[s.op] for s in steps))
        out["re-run"].append((float(op_start[before]) - dur, float(op_start[before])))
    return out


def phase_spans(trace: Trace, result: Any) -> list[tuple[str, float, float]]:
    """``(phase, start, end)`` of forward, backward and the optimizer step in the simulation's
    seconds (from a ``timeline=True`` run)."""
    op_start = result.op_start
    if op_start is None or not len(op_start):
        return []
    n = len(op_start)
    spans = []
    phases = trace.op_phase[:n]
    for p in Phase:
        idx = np.flatnonzero(phases == p)
        if len(idx):
            last = int(idx[-1])
            end = float(op_start[last + 1]) if last + 1 < n else float(result.makespan)
            spans.append((p.name.lower(), float(op_start[int(idx[0])]), end))
    return spans
