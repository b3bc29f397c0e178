"""The largest batch (or sequence) that fits a memory size, unplanned and with a plan, and how
fast it trains: the question of the papers' first tables (``dqn-swap max-batch``).

For a size ``n`` (a batch size, or a sequence length) the trace of one iteration, recorded on
the ``meta`` device in seconds, gives two answers at once:

- unplanned, the iteration fits when its peak (:attr:`~dqn_swap.trace.Trace.peak_bytes`) does;
- no plan of any planner fits it when its minimum (:attr:`~dqn_swap.trace.Trace.minimum_memory`,
  what stays at the busiest op with every saved activation away between its uses) does not.
  The minimum is a bound: the largest size under it is the most any plan could reach.

Both grow with ``n``.  :func:`largest_sizes` doubles ``n`` until both fail, then bisects each
edge, recording each size once.  :func:`planned_speeds` then plans a few sizes between the two
edges at the memory size and simulates them: the planned time per iteration and per sample.

The recording and the planner are the caller's (``record(n) -> Trace``, ``plan(trace, limit)
-> Plan``), so that this module plans with whatever planner the caller names.

Example::

    from dqn_swap.capacity import largest_sizes

    found = largest_sizes(lambda n: record_on_meta("resnet50", n), 16 * 2**30)
    print(found["unplanned"], found["any_plan"])
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .trace import Trace

__all__ = ["largest_sizes", "planned_speeds", "sizes_between"]

Recorder = Callable[[int], Trace]


def largest_sizes(record: Recorder, memory: int, *, start: int = 1, cap: int = 1 << 16,
                  say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The largest size that fits ``memory`` bytes unplanned, and the largest under the minimum
    any plan needs (module docstring).

    Args:
        record: records one iteration at a size (a batch size, or a sequence length).
        memory: the device's bytes.
        start: the smallest size tried.
        cap: the largest size tried.
        say: progress, one line per recording.

    Returns:
        ``{"unplanned": n or None, "any_plan": n or None, "probes": k, "traces": {n: Trace},
        "capped": whether the cap was reached with the size still fitting}`` (None: not even
        ``start`` fits).

    Raises:
        TypeError: ``record`` is not callable.
        ValueError: ``memory``, ``start`` or ``cap`` not a whole number from 1, or ``start > cap``.
    """
    if not callable(record):
        raise TypeError(f"record must be a function of the size that returns a Trace, not {type(record).__name__}")
    for name, value in (("memory", memory), ("start", start), ("cap", cap)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number from 1, not {value!r}"
                             + (" (bytes: MemoryLimit.parse('16GiB').value)" if name == "memory" else ""))
    if start > cap:
        raise ValueError(f"start ({start}) is above cap ({cap})")
    traces: dict[int, Trace] = {}

    def trace_at(n: int) -> Trace:
        if n not in traces:
            if say is not None:
                say(f"recording size {n} on meta")
            traces[n] = record(n)
        return traces[n]

    def unplanned(n: int) -> bool:
        return trace_at(n).peak_bytes <= memory

    def any_plan(n: int) -> bool:
        return trace_at(n).minimum_memory <= memory

    edges: dict[str, int | None] = {}
    for name, fits in (("unplanned", unplanned), ("any_plan", any_plan)):
        lo, n = 0, max(start, edges.get("unplanned") or start)  # any plan fits at least what unplanned fits
        while n <= cap and fits(n):
            lo, n = n, n * 2
        hi = min(n, cap + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        edges[name] = lo or None
    capped = any(v == cap for v in edges.values())
    return {**edges, "probes": len(traces), "traces": traces, "capped": capped}


def sizes_between(low: int | None, high: int | None, points: int) -> list[int]:
    """``points`` sizes from ``low`` to ``high``, spaced evenly on a log scale, without repeats
    (``low`` and ``high`` included; a missing ``low`` starts at 1)."""
    if high is None:
        return []
    low = low or 1
    if points <= 1 or high <= low:
        return sorted({low, high})
    ratio = (high / low) ** (1 / (points - 1))
    return sorted({min(high, max(low, round(low * ratio ** i))) for i in range(points)})


def planned_speeds(record: Recorder, sizes: list[int], memory: int,
                   plan: Callable[[Trace, int], Any], *, traces: dict[int, Trace] | None = None,
                   items: Callable[[int], int] = lambda n: n,
                   say: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Plan each size at ``memory`` bytes and simulate it: per size, whether the plan fits, the
    planned and unplanned time of one iteration, items (``items(n)``: samples, or tokens) per
    second planned, the overhead, and the planner's own choice.  A size whose iteration fits
    unplanned is reported unplanned."""
    from .simulator import simulate

    traces = traces if traces is not None else {}
    rows = []
    for n in sizes:
        if n not in traces:
            traces[n] = record(n)
        trace = traces[n]
        row: dict[str, Any] = {"size": n, "unplanned_peak_bytes": int(trace.peak_bytes),
                               "minimum_bytes": int(trace.minimum_memory),
                               "unplanned_time_s": float(trace.compute_time)}
        if trace.peak_bytes <= memory:
            row.update(fits="unplanned", planned_time_s=float(trace.compute_time), overhead=0.0, planner=None,
                       peak_bytes=int(trace.peak_bytes))
        elif trace.minimum_memory > memory:
            row.update(fits="no", planned_time_s=None, overhead=None, planner=None, peak_bytes=None)
        else:
            if say is not None:
                say(f"planning size {n} at the memory size")
            p = plan(trace, memory)
            result = simulate(trace, p)  # at the plan's own limit (the memory size) and profile
            feasible = bool(result.feasible) and int(result.peak_bytes) <= memory
            row.update(fits="planned" if feasible else "no plan found",
                       planned_time_s=float(result.makespan) if feasible else None,
                       overhead=float(result.overhead) if feasible else None,
                       planner=p.settings.get("chosen") or p.planner,
                       peak_bytes=int(result.peak_bytes) if feasible else None)
        t = row["planned_time_s"]
        row["items_per_s"] = items(n) / t if t and math.isfinite(t) and t > 0 else None
        rows.append(row)
    return rows
