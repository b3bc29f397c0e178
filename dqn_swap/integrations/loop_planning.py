"""Planning the recorded steps, inline or in the background, and the cache of traces and plans
(:class:`LoopPlanning`, mixed into :class:`~dqn_swap.integrations.planned_loop.AutoPlan`)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


from ..files import is_plain_name, write_atomically
from ..limits import resolve_limit
from ..meter import AllocatorTimeline
from ..plan import Plan
from ..trace import Trace
from ..units import format_bytes

from .settings import ATTACHED, AutoPlanError, attached
from .loop_recording import Entry, _rng_untouched

#: Planners tried, in order, where the chosen one finds no plan under the limit: a limit at or above
#: the minimum always has one, and a step that stops is worse than a plan of another planner.
FALLBACK_PLANNERS = ("greedy", "swap-all")


def _read_index(index: Path) -> dict[str, Any]:
    """An autoplan cache's ``index.json``: signature key -> {"trace": file, "plan": file, ...}."""
    try:
        entries = json.loads(index.read_text())
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise ValueError("not an object of entries")
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested past what json reads
        raise AutoPlanError(f"{index}: not a dqn-swap autoplan index ({e})") from None
    return entries


class LoopPlanning:
    """The planning side of :class:`~dqn_swap.integrations.planned_loop.AutoPlan` (whose state it uses)."""

    # ------------------------------------------------------------------ planning
    def _plan_then(self, key: str, trace: Trace, desc: str, install: Any) -> None:
        """Plan ``trace`` and ``install`` the plan: now, or (``planning="background"``) on the worker
        thread, installed at the first step after it is ready (:meth:`_collect`)."""
        if not self.background:
            install(self._make_plan(trace, desc))
            return
        with self._planning(worker=False):  # as inline: the user's random streams, the timeline's window
            self._build_planner()  # here, not on the worker: building the DQN's network draws weights
        if self._worker is None:
            from concurrent.futures import ThreadPoolExecutor

            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dqn-swap-planner")
        self._note(f"step {self.steps}: planning {desc} in the background; its steps run in safe mode until the "
                   "plan is ready")
        self._jobs[key] = (self._worker.submit(self._make_plan, trace, desc, True), desc, install)

    def _collect(self, wait: bool = False) -> None:
        """Install the plans the worker has finished (all of them, waiting, with ``wait``); a planning
        error is raised here, on the training thread."""
        for key, (future, desc, install) in list(self._jobs.items()):
            if not (wait or future.done()):
                continue
            del self._jobs[key]
            install(future.result())

    def wait_for_plans(self) -> None:
        """Wait for the plans being made on the worker thread (``planning="background"``) and install
        them; nothing to do otherwise."""
        self._collect(wait=True)

    def _build_planner(self) -> Any:
        if self._planner is None:
            from ..agents import get_planner

            self._planner = get_planner(self.planner_name, **self.planner_options)
        return self._planner

    @contextlib.contextmanager
    def _planning(self, worker: bool) -> Iterator[None]:
        """Where a planner runs on the training thread: the user's random streams untouched (a planner
        that samples would change later dropout masks) and its tensors set aside from the allocator's
        timeline (host memory beside the device).  On the worker thread neither: both are the
        process's, shared with the training thread (module docstring)."""
        if worker:
            yield
            return
        with _rng_untouched(self.device), AllocatorTimeline.aside():
            yield

    def _make_plan(self, trace: Trace, desc: str, worker: bool = False) -> Plan:
        limit = resolve_limit(trace, self.memory_limit)
        if self.verbose:
            print(f"dqn-swap: planning {desc} with {self.planner_name!r} at {format_bytes(limit)} ...",
                  file=sys.stderr, flush=True)
        # (on the worker the planner was built before, on the training thread: _plan_then)
        with self._planning(worker):
            planner = self._build_planner()
            start = time.thread_time()
            plan = planner.plan(trace, limit)
            self.planning_seconds += time.thread_time() - start
        feasible = bool(plan.figures.get("feasible", True))
        self._note(f"planned {desc} with {self.planner_name!r} at {format_bytes(limit)}: {plan.n_swap} swaps, "
                   f"{plan.n_recompute} recomputes, simulated overhead "
                   f"{100 * float(plan.figures.get('overhead', 0.0)):.1f} %"
                   + ("" if feasible else " (INFEASIBLE)"))
        if not feasible and not self.allow_infeasible:
            fallback = self._fallback_plan(trace, limit, desc, worker)
            if fallback is not None:
                return fallback
            from ..simulator import simulate

            result = simulate(trace, plan)
            why = result.infeasible.message(trace) if result.infeasible is not None else "over the limit"
            method = plan.settings.get("limitation") if isinstance(plan.settings, dict) else None
            pinned = (" with the pins, which keep some activations on the device (fewer pins may fit)"
                      if self.planner_options.get("pins") else "")
            raise AutoPlanError(f"planner {self.planner_name!r} found no plan under {format_bytes(limit)}{pinned} for "
                                f"{desc}: {why}{f' ({method})' if method else ''}; try another planner or a "
                                "higher limit, or pass allow_infeasible=True to run it anyway")
        return plan

    def _fallback_plan(self, trace: Trace, limit: int, desc: str, worker: bool = False) -> Plan | None:
        """A feasible plan of another planner where the chosen one found none (:data:`FALLBACK_PLANNERS`,
        in order), so that training goes on under the limit; None when none of them finds one.  The
        user's pins (``planner_options["pins"]``) bind them too."""
        from ..agents import get_planner

        pins = self.planner_options.get("pins")
        for name in FALLBACK_PLANNERS:
            if name == self.planner_name:
                continue
            with self._planning(worker):
                start = time.thread_time()
                plan = get_planner(name, pins=pins).plan(trace, limit)
                self.planning_seconds += time.thread_time() - start
            if bool(plan.figures.get("feasible", True)):
                self._note(f"planner {self.planner_name!r} found no plan under {format_bytes(limit)} for {desc}; "
                           f"{name!r} did ({plan.n_swap} swaps, {plan.n_recompute} recomputes, simulated overhead "
                           f"{100 * float(plan.figures.get('overhead', 0.0)):.1f} %): followed instead")
                return plan
        return None

    # ------------------------------------------------------------------ files
    def _load_cache(self) -> None:
        assert self.cache is not None
        index = self.cache / "index.json"
        if not index.exists():
            return
        for key, item in _read_index(index).items():
            try:
                names = [item["trace"], item["plan"]]
                if not all(is_plain_name(n) for n in names):
                    raise TypeError("the trace and plan must be file names in the index's folder")
                if not key.partition("~")[0].endswith(self.plan_key):
                    continue  # made for another limit, planner or profile
                trace = Trace.load(self.cache / names[0])
                plan = Plan.load(self.cache / names[1], trace)
            except (KeyError, TypeError) as e:
                raise AutoPlanError(f"{index}: entry {key!r} is malformed ({e})") from None
            sig, _, n = key.partition("~")
            entry = Entry(key, str(item.get("signature", key)), trace, plan, signature_key=sig,
                          variant=int(n) if n.isdigit() else 0)
            self.entries[key] = entry
            self.variants.setdefault(sig, []).append(entry)
        for variants in self.variants.values():
            variants.sort(key=lambda e: e.variant)
        self._warm = True  # planned from the first step; the optimizer's state appears in the first one
        self._note(f"loaded {len(self.entries)} plan(s) from {self.cache}")

    def _save_entry(self, entry: Entry, folder: Path) -> None:
        """Write ``entry``'s trace and plan into ``folder`` and name them in its index; files already
        there are kept as they are (a signature's trace and plan are written once)."""
        folder.mkdir(parents=True, exist_ok=True)
        names = {"trace": f"{entry.key}.trace", "plan": f"{entry.key}.plan.json", "signature": entry.description}
        if not (folder / names["trace"]).exists():
            entry.trace.save(folder / names["trace"])
        if not (folder / names["plan"]).exists():
            entry.plan.save(folder / names["plan"])
        index = folder / "index.json"
        current = _read_index(index) if index.exists() else {}
        if entry.key not in current:
            current[entry.key] = names
            write_atomically(index, (json.dumps(current, indent=1) + "\n").encode(), overwrite=True)

    def save(self, directory: str | Path) -> Path:
        """Write every trace and plan made so far into ``directory`` (``cache=`` reads them back); plans
        still being made on the worker thread are waited for."""
        self.wait_for_plans()
        if self._pending is not None and self._pending.deferred:
            self._settle()
        for entry in self.entries.values():
            self._save_entry(entry, Path(directory))
        return Path(directory)

    # ------------------------------------------------------------------ misc
    def remove(self) -> None:
        """Take autoplan's hooks off the model and optimizer: later steps run unplanned."""
        if self._pending is not None and self._pending.deferred:
            self._settle()
        if self._worker is not None:
            self.wait_for_plans()
            self._worker.shutdown()
            self._worker = None
        self._root_hook.remove()
        if attached(self.model) is self:
            del ATTACHED[self.model]
        for h in self._opt_hooks:
            h.remove()
        if self._scalars is not None:
            self._scalars.write(self.figures(), self.steps)
            self._scalars.close()
