"""Pinned tensors: saved activations a plan must keep on the device, or must recompute.

The vocabulary of ``torch.utils.checkpoint.CheckpointPolicy``'s ``MUST_SAVE`` and
``MUST_RECOMPUTE``, per saved activation of a trace:

* **keep**: never swapped, never recomputed (an activation a custom kernel reads in place, one
  whose recomputation is not wanted);
* **recompute**: always dropped after its last forward use and re-made in backward (an
  activation cheap to re-make, or one the user wants off the device whatever the planner thinks).

Each pin is a tensor id of the trace, or a pattern (:func:`fnmatch.fnmatchcase`) matched against
the name of the module whose op made the tensor (``"layers.3.*"``, ``"*.mlp.act"``) and against
that op's name (``"aten.gelu*"``).  A pattern that matches no saved activation a plan may move is
refused, as is a tensor both kept and recomputed, or a recompute the simulator does not allow.

Every planner honours them: :func:`dqn_swap.planners.get_planner` given ``pins`` wraps the
planner.  The planner plans a view of the trace in which the tensors pinned to stay are ones no
plan may move (:attr:`Trace.movable <dqn_swap.trace.Trace.movable>`, through
``meta["pinned_keep"]``), so it plans around them; the pinned recomputes, which no planner is
asked for, are added to its plan after (a swap of one replaced), and a plan that no longer fits
is completed by swapping the largest activations left free until it does
(:func:`dqn_swap.planners.enforce_pins`).  The plan records its pins
(``plan.settings["pins"]``), and :func:`dqn_swap.simulator.verify_plan`, which checks every plan
file before training, refuses one that breaks them (:func:`check`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import DqnSwapInputError

if TYPE_CHECKING:
    from .plan import Action, Plan
    from .trace import Trace


class PinError(DqnSwapInputError):
    """Pins that cannot be honoured on a trace, or a plan that breaks its pins (one line saying which)."""


@dataclass(frozen=True)
class Pins:
    """Saved activations a plan must keep, and ones it must recompute (module docstring).

    Args:
        keep: tensor ids or patterns of the activations never swapped nor recomputed.
        recompute: tensor ids or patterns of the activations always recomputed.

    Example::

        pins = Pins(keep=["layers.0.*"], recompute=["aten.gelu*"])
        plan = dqn_swap.get_planner("auto", pins=pins).plan(trace, limit)
    """

    keep: tuple[int | str, ...] = ()
    recompute: tuple[int | str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("keep", "recompute"):
            value = getattr(self, name)
            items = (value,) if isinstance(value, (str, int)) else tuple(value)
            for x in items:
                if isinstance(x, bool) or not isinstance(x, (str, int)):
                    raise PinError(f"a pin is a tensor id or a pattern (a string), not {x!r}")
            object.__setattr__(self, name, items)

    def __bool__(self) -> bool:
        return bool(self.keep or self.recompute)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Pins":
        """The pins of :meth:`to_dict` (as a plan file records them)."""
        if not isinstance(d, dict) or set(d) - {"keep", "recompute"}:
            raise PinError(f"pins are a dict of 'keep' and 'recompute', not {d!r}")
        return cls(tuple(d.get("keep", ())), tuple(d.get("recompute", ())))

    def to_dict(self) -> dict[str, list[int | str]]:
        return {"keep": list(self.keep), "recompute": list(self.recompute)}

    def resolve(self, trace: "Trace") -> tuple[frozenset[int], frozenset[int]]:
        """The tensor ids kept and recomputed on ``trace`` (whether the simulator allows each pinned
        recompute is :func:`dqn_swap.planners.pinned_sets`'s check).

        Raises:
            PinError: a pin matches no saved activation a plan may move, or a tensor is both kept
                and recomputed.
        """
        from .activations import saved_activations

        movable = saved_activations(trace)
        keep, recompute = _match(trace, movable, self.keep), _match(trace, movable, self.recompute)
        both = keep & recompute
        if both:
            t = min(both)
            raise PinError(f"tensor {t} (made by {maker(trace, t)}) is pinned both to keep and to recompute")
        return frozenset(keep), frozenset(recompute)

    def violations(self, trace: "Trace", actions: Iterable["Action"]) -> list[str]:
        """What ``actions`` do against the pins, one line each (empty: they honour them)."""
        from .plan import ActionKind

        keep, recompute = self.resolve(trace)
        out, recomputed = [], set()
        for a in actions:
            if a.tensor in keep:
                out.append(f"tensor {a.tensor} (made by {maker(trace, a.tensor)}) is pinned to keep, and the "
                           f"plan {'swaps' if a.kind == ActionKind.SWAP else 'recomputes'} it")
            elif a.tensor in recompute and a.kind == ActionKind.SWAP:
                out.append(f"tensor {a.tensor} (made by {maker(trace, a.tensor)}) is pinned to recompute, and "
                           "the plan swaps it")
            if a.kind == ActionKind.RECOMPUTE:
                recomputed.add(a.tensor)
        out += [f"tensor {t} (made by {maker(trace, t)}) is pinned to recompute, and the plan keeps it"
                for t in sorted(recompute - recomputed)]
        return out


def maker(trace: "Trace", tid: int) -> str:
    """The op that made tensor ``tid``, as messages name it."""
    op = int(trace.tensor_alloc_op[tid])
    return trace.op_label(op) if op >= 0 else "the inputs"


def _match(trace: "Trace", movable: list[int], pins: tuple[int | str, ...]) -> set[int]:
    chosen: set[int] = set()
    for pin in pins:
        if isinstance(pin, int):
            if pin not in movable:
                raise PinError(f"pinned tensor {pin} is not a saved activation a plan may move in this trace "
                               f"({len(movable)} are; dqn-swap inspect lists them)")
            chosen.add(pin)
            continue
        hit = []
        for t in movable:
            op = int(trace.tensor_alloc_op[t])
            names = (trace.module_names[trace.op_module[op]], trace.op_names[trace.op_name[op]]) if op >= 0 else ()
            if any(fnmatch.fnmatchcase(n, pin) for n in names):
                hit.append(t)
        if not hit:
            raise PinError(f"pin {pin!r} matches no saved activation a plan may move (patterns match the name "
                           "of the module whose op made it, such as 'layers.3.*', or the op's, such as 'aten.gelu*')")
        chosen.update(hit)
    return chosen


def check(trace: "Trace", plan: "Plan", where: str | None = None) -> None:
    """Refuse ``plan`` if it records pins (``settings["pins"]``) it breaks.

    Raises:
        PinError: one line naming the first broken pin.
    """
    recorded = plan.settings.get("pins") if isinstance(plan.settings, dict) else None
    if not recorded:
        return
    broken = Pins.from_dict(recorded).violations(trace, plan.actions)
    if broken:
        raise PinError(f"{where or f'the plan of planner {plan.planner!r}'}: {broken[0]}"
                       + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""))


__all__ = ["PinError", "Pins", "check", "maker"]
