"""Plans: which tensors to swap out and which to drop for recompute, and the schedule that follows.

A plan is what every planner produces and what the simulator and the runtime
consume.  Following section 4.5 of the DQN paper a planner chooses only the
*first phase* of each action: ``swap`` (offload the tensor to host memory after
an event that touches it) and ``recompute`` (remove it after that event and
recompute it before its next read).  Prefetching and the recompute itself are
not chosen: their timing is fixed by the simulator's rules, and the simulator
writes what it decided into the plan's :class:`Schedule` -- the op at which
each prefetch starts, the re-runs before each op and which re-created inputs
they free -- so that the runtime applies the plan without a memory model of
its own.

File format (JSON, version 2)::

    {"format": "dqn-swap-plan", "version": 2,
     "trace_fingerprint": "...", "memory_limit": 123456789, "profile": "v100-pcie3",
     "planner": "greedy", "settings": {...},
     "actions": [[event, tensor, "swap" | "recompute"], ...],
     "schedule": {"prefetch": [[tensor, op], ...],
                  "recompute": [[op, [[producer op, [kept tensors], [released tensors]], ...]], ...],
                  "max_inflight_d2h_bytes": 123},
     "figures": {... simulated results ...}}

``docs/plan-format.md`` explains every field and ``docs/plan.schema.json`` is its JSON Schema.
Version 1 files (no schedule) are still read; the schedule is then derived by
simulating the plan when it is needed.  Loading checks the fingerprint, and
the actions and schedule against the trace the plan is used with.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

from .errors import DqnSwapInputError
from .files import check_new_file, not_a_regular_file, other_kind, unreadable, write_atomically
from .units import MAX_BYTES

if TYPE_CHECKING:
    from .trace import Trace

FORMAT = "dqn-swap-plan"
VERSION = 2
READ_VERSIONS = (1, 2)


class ActionKind(enum.IntEnum):
    SWAP = 0
    RECOMPUTE = 1


class PlanError(DqnSwapInputError):
    """A plan file that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True, order=True)
class Action:
    """Act on ``tensor`` right after the op of ``event`` (an event touching it)."""

    event: int
    tensor: int
    kind: ActionKind


class RecomputeStep(NamedTuple):
    """One re-run of a recomputation: forward op ``op`` runs again; of what it makes, ``keep``
    stays (the targets, or inputs of later re-runs); afterwards the re-created inputs in
    ``release`` are freed (this was their last reader).  (A named tuple: long recompute chains
    make millions of them.)"""

    op: int
    keep: tuple[int, ...]
    release: tuple[int, ...] = ()


def _ints(xs: Any) -> tuple[int, ...]:
    """``xs``, a JSON list of indices (integers from 0; not floats, strings or booleans), as a tuple."""
    if not isinstance(xs, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in xs):
        raise TypeError(f"expected a list of integers, not {xs!r}"[:120])
    if any(x < 0 for x in xs):
        raise ValueError(f"expected indices (integers from 0), not {xs!r}"[:120])
    return tuple(xs)


@dataclass(frozen=True)
class Schedule:
    """What the simulator decided for a plan's actions (module docstring).

    ``prefetch``: ``(tensor, op)`` in the order the copies start; the copy back
    of a swapped ``tensor`` starts while ``op`` runs or right before it.
    ``recompute``: ``(op, steps)``: the :class:`RecomputeStep` re-runs right
    before ``op``, in order.  ``max_inflight_d2h_bytes``: the most bytes the
    simulator had in device-to-host copies at once.
    """

    prefetch: tuple[tuple[int, int], ...] = ()
    recompute: tuple[tuple[int, tuple[RecomputeStep, ...]], ...] = ()
    max_inflight_d2h_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"prefetch": [[int(t), int(op)] for t, op in self.prefetch],
                "recompute": [[int(op), [[int(s.op), [int(x) for x in s.keep], [int(x) for x in s.release]]
                                         for s in steps]] for op, steps in self.recompute],
                "max_inflight_d2h_bytes": int(self.max_inflight_d2h_bytes)}

    @classmethod
    def from_json(cls, d: Any) -> "Schedule":
        if not isinstance(d, dict):
            raise TypeError("schedule is not an object")
        prefetch = tuple(_ints(pair) for pair in d.get("prefetch", []))
        if any(len(p) != 2 for p in prefetch):
            raise ValueError("a prefetch entry is not [tensor, op]")
        recompute = []
        for entry in d.get("recompute", []):
            op, steps = entry
            recompute.append((_ints([op])[0], tuple(RecomputeStep(_ints([o])[0], _ints(k), _ints(r))
                                                    for o, k, r in steps)))
        inflight = d.get("max_inflight_d2h_bytes", 0)
        if isinstance(inflight, bool) or not isinstance(inflight, int) or inflight < 0:
            raise ValueError(f"max_inflight_d2h_bytes must be a non-negative integer, not {inflight!r}")
        return cls(tuple(prefetch), tuple(recompute), inflight)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    memory_limit: int
    trace_fingerprint: str
    profile: str
    planner: str
    settings: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    #: what the simulator decided (prefetch starts, re-runs); None for a plan made by hand or read
    #: from a version 1 file, until :func:`dqn_swap.simulator.schedule_plan` fills it in
    schedule: Schedule | None = None

    @staticmethod
    def sorted_actions(actions: Iterable[Action]) -> tuple[Action, ...]:
        return tuple(sorted(actions))

    @property
    def n_swap(self) -> int:
        return sum(a.kind == ActionKind.SWAP for a in self.actions)

    @property
    def n_recompute(self) -> int:
        return sum(a.kind == ActionKind.RECOMPUTE for a in self.actions)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION,
            "trace_fingerprint": self.trace_fingerprint, "memory_limit": int(self.memory_limit),
            "profile": self.profile, "planner": self.planner, "settings": self.settings,
            "actions": [[a.event, a.tensor, a.kind.name.lower()] for a in self.actions],
            **({"schedule": self.schedule.to_json()} if self.schedule is not None else {}),
            "figures": self.figures,
        }

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        path = check_new_file(path, overwrite)
        return write_atomically(path, (json.dumps(self.to_json(), indent=1) + "\n").encode(), overwrite=overwrite)

    @classmethod
    def from_json(cls, d: Any, where: str = "plan") -> "Plan":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise PlanError(f"{where}: not a dqn-swap plan")
        if d.get("version") not in READ_VERSIONS:
            raise PlanError(f"{where}: plan format version {d.get('version')} is not supported "
                            f"(this dqn-swap reads versions {', '.join(map(str, READ_VERSIONS))})")
        limit = d.get("memory_limit")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_BYTES:
            raise PlanError(f"{where}: memory_limit must be a positive number of bytes up to {MAX_BYTES} "
                            f"(beyond any device above), not {limit!r}")
        for key in ("trace_fingerprint", "profile", "planner"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise PlanError(f"{where}: corrupt plan, {key} must be a non-empty string, not {d.get(key)!r}"[:200])
        for key in ("settings", "figures"):
            if key in d and not isinstance(d[key], dict):
                raise PlanError(f"{where}: corrupt plan, {key} must be an object, not {d[key]!r}"[:200])
        try:
            actions = tuple(Action(*_ints([e, t]), ActionKind[str(k).upper()]) for e, t, k in d["actions"])
            tensors = [a.tensor for a in actions]
            if len(set(tensors)) != len(tensors):
                dup = sorted({t for t in tensors if tensors.count(t) > 1})
                raise PlanError(f"{where}: more than one action on tensor {dup[0]} (a tensor is swapped or "
                                "recomputed at most once)")
            schedule = Schedule.from_json(d["schedule"]) if d.get("schedule") is not None else None
            return cls(actions=actions, memory_limit=int(d["memory_limit"]),
                       trace_fingerprint=d["trace_fingerprint"], profile=d["profile"],
                       planner=d["planner"], settings=dict(d.get("settings", {})),
                       figures=dict(d.get("figures", {})), schedule=schedule)
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{where}: corrupt plan ({type(e).__name__}: {e})") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str], trace: "Trace | None" = None) -> "Plan":
        """Read a plan; with ``trace``, check that the plan was made for it.

        Raises:
            PlanError: the file is missing, not a plan, damaged, of another format version, or
                (with ``trace``) made for another trace; the message is one line.
        """
        from .checks import expect, expect_path
        from .trace import Trace

        path = Path(expect_path(path, "path"))
        expect(trace, Trace, "trace", none=True, what="a Trace (Trace.load(path) reads one)")
        special = not_a_regular_file(path)
        if special:
            raise PlanError(special)
        try:
            d = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: [[[[...
            raise PlanError(unreadable(path, e, "plan") or other_kind(path, "plan")
                            or f"{path}: corrupt plan file ({type(e).__name__}: {e})") from None
        plan = cls.from_json(d, str(path))
        if trace is not None:
            plan.check_trace(trace, str(path))
        return plan

    def check_trace(self, trace: "Trace", where: str = "plan") -> None:
        if self.trace_fingerprint != trace.fingerprint:
            raise PlanError(f"{where}: made for trace {self.trace_fingerprint}, not for this trace "
                            f"({trace.fingerprint}); re-plan with `dqn-swap plan`")
        for a in self.actions:
            if not (0 <= a.event < trace.n_events) or not (0 <= a.tensor < trace.n_tensors):
                raise PlanError(f"{where}: action {a} is outside the trace")
            if trace.event_tensor[a.event] != a.tensor:
                raise PlanError(f"{where}: action {a}: event {a.event} does not touch tensor {a.tensor}")
        sched = self.schedule
        if sched is not None:
            n_ops, n_t = trace.n_ops, trace.n_tensors
            swapped = {a.tensor for a in self.actions if a.kind == ActionKind.SWAP}
            removed = {a.tensor for a in self.actions if a.kind == ActionKind.RECOMPUTE}
            for t, op in sched.prefetch:
                if t not in swapped or not 0 <= op < n_ops:
                    raise PlanError(f"{where}: schedule prefetches tensor {t} at op {op}, which the plan does "
                                    "not swap or the trace does not have; re-plan with `dqn-swap plan`")
            for op, steps in sched.recompute:
                for step in steps:
                    if (not 0 <= step.op < op < n_ops or any(not 0 <= x < n_t for x in (*step.keep, *step.release))
                            or any(trace.tensor_alloc_op[x] != step.op for x in step.keep)):
                        raise PlanError(f"{where}: schedule re-runs op {step.op} before op {op} in a way this "
                                        "trace does not allow; re-plan with `dqn-swap plan`")
            targets = {x for _, steps in sched.recompute for s in steps for x in s.keep}
            if not removed <= targets | _never_reused(trace, removed):
                raise PlanError(f"{where}: schedule does not re-create every removed tensor; "
                                "re-plan with `dqn-swap plan`")

    def with_schedule(self, schedule: Schedule | None) -> "Plan":
        return dataclasses.replace(self, schedule=schedule)


def _never_reused(trace: "Trace", tensors: set[int]) -> set[int]:
    """Tensors of ``tensors`` that nothing reads again after the plan acts (nothing to re-create)."""
    _, ret = trace.action_window
    return {t for t in tensors if ret[t] < 0}
