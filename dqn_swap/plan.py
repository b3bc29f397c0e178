"""Plans: which tensors to swap out and which to drop for recompute.

A plan is what every planner produces and what the simulator and the runtime
consume.  Following section 4.5 of the DQN paper it holds only the *first
phase* of each action: ``swap`` (offload the tensor to host memory after an
event that touches it) and ``recompute`` (remove it after that event and
recompute it before its next read).  Prefetching and the recompute itself are
not chosen: their timing is fixed by the simulator's rules.

File format (JSON, version 1)::

    {"format": "dqn-swap-plan", "version": 1,
     "trace_fingerprint": "...", "memory_limit": 123456789, "profile": "v100-pcie3",
     "planner": "greedy", "settings": {...},
     "actions": [[event, tensor, "swap" | "recompute"], ...],
     "figures": {... simulated results ...}}

Loading checks the fingerprint against the trace it is used with.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from .trace import Trace

FORMAT = "dqn-swap-plan"
VERSION = 1


class ActionKind(enum.IntEnum):
    SWAP = 0
    RECOMPUTE = 1


class PlanError(ValueError):
    """A plan file that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True, order=True)
class Action:
    """Act on ``tensor`` right after the op of ``event`` (an event touching it)."""

    event: int
    tensor: int
    kind: ActionKind


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    memory_limit: int
    trace_fingerprint: str
    profile: str
    planner: str
    settings: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

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
            "figures": self.figures,
        }

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path}: already exists (pass --force to replace it)")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def from_json(cls, d: Any, where: str = "plan") -> "Plan":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise PlanError(f"{where}: not a dqn-swap plan")
        if d.get("version") != VERSION:
            raise PlanError(f"{where}: plan format version {d.get('version')} is not supported "
                            f"(this dqn-swap reads version {VERSION})")
        try:
            actions = tuple(Action(int(e), int(t), ActionKind[str(k).upper()]) for e, t, k in d["actions"])
            return cls(actions=actions, memory_limit=int(d["memory_limit"]),
                       trace_fingerprint=str(d["trace_fingerprint"]), profile=str(d["profile"]),
                       planner=str(d["planner"]), settings=dict(d.get("settings", {})),
                       figures=dict(d.get("figures", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{where}: corrupt plan ({type(e).__name__}: {e})") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str], trace: "Trace | None" = None) -> "Plan":
        """Read a plan; with ``trace``, check that the plan was made for it."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PlanError(f"{path}: corrupt plan file ({type(e).__name__}: {e})") from None
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
