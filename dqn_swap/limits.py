"""Memory limits: one type that every layer of dqn-swap resolves the same way.

A limit is written in one of three forms:

* a **percentage**, ``"50%"``: a point between the least memory any plan
  needs for the trace (:attr:`Trace.minimum_memory
  <dqn_swap.trace.Trace.minimum_memory>`, 0%) and its unplanned peak
  (:attr:`Trace.peak_bytes <dqn_swap.trace.Trace.peak_bytes>`, 100%);
* a **multiple of the unplanned peak**, ``"0.5x"`` (the peak ``dqn-swap run``
  measured on CUDA, else the trace's);
* **bytes**: an ``int``, or a size with a unit (``"8GiB"``, ``"512MB"``,
  ``"1e9"``).

Sizes and multiples are of the **device's** memory, as the allocator counts it.
A trace recorded on a GPU notes what the device held outside the recorded
iteration (cuBLAS's workspaces, :attr:`Trace.outside_bytes
<dqn_swap.trace.Trace.outside_bytes>`); those bytes come off, and the plan's own
bytes are held to the rest.  Percentages are of the trace's own bytes.

**A bare number means bytes.**  One in ``(0, 1]`` (``0.5`` or ``"0.5"``) is
refused as ambiguous, since it could mean any of the three: write ``"50%"``,
``"0.5x"`` or a size.  Results are rounded to the nearest byte (halves to
even, Python's ``round``), and a limit below the trace's minimum is refused
with a message naming the minimum.  The command line, the environment, the
trainer, the planners' callers and the runtime all go through
:meth:`MemoryLimit.parse` and :meth:`MemoryLimit.resolve`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Union

from .errors import DqnSwapInputError
from .units import MAX_BYTES, format_bytes, parse_bytes

if TYPE_CHECKING:
    from .trace import Trace

Kind = Literal["bytes", "percent", "times"]
LimitSpec = Union["MemoryLimit", int, float, str]

FORMS = "a percentage (50%: halfway from the least memory any plan needs to the unplanned peak), " \
        "a multiple of the unplanned peak (0.5x) or a size (8GiB, 512MB, 1e9 bytes)"


class MemoryLimitError(DqnSwapInputError):
    """A memory limit that cannot be used; the message is one line saying why and what to write."""


@dataclass(frozen=True)
class MemoryLimit:
    """A memory limit as written: its form and number (see the module docstring)."""

    kind: Kind
    value: float

    def __post_init__(self) -> None:
        if self.kind not in ("bytes", "percent", "times"):
            raise MemoryLimitError(f"unknown kind of memory limit {self.kind!r}")
        if not math.isfinite(self.value):
            raise MemoryLimitError(f"memory limit {self.value!r} is not a finite number; write {FORMS}")
        if self.kind == "percent" and not 0 <= self.value <= 100:
            raise MemoryLimitError(f"a percentage limit must be between 0% (the least memory any plan needs) "
                                   f"and 100% (the unplanned peak), not {self.value:g}%")
        if self.kind != "percent" and self.value <= 0:
            raise MemoryLimitError(f"a memory limit must be positive, not {self}")

    # ------------------------------------------------------------------ parsing
    @classmethod
    def parse(cls, spec: LimitSpec) -> "MemoryLimit":
        """Read any of the forms of the module docstring.

        Raises:
            MemoryLimitError: ``spec`` is none of them, or ambiguous (a bare number in ``(0, 1]``).
        """
        if isinstance(spec, MemoryLimit):
            return spec
        if isinstance(spec, bool):
            raise MemoryLimitError(f"not a memory limit: {spec!r}; write {FORMS}")
        if _whole_number(spec):
            return cls("bytes", float(int(spec)))
        kind = getattr(getattr(spec, "dtype", None), "kind", None)  # NumPy's scalars; a tensor's dtype has none
        if isinstance(spec, float) or kind == "f":
            return cls._bare(float(spec), repr(float(spec)))
        if hasattr(spec, "dtype"):
            raise MemoryLimitError(f"not a memory limit: a {type(spec).__name__}; give a number of bytes "
                                   f"(int(...)) or {FORMS}")
        if not isinstance(spec, str):
            raise MemoryLimitError(f"not a memory limit: {spec!r}; write {FORMS}")
        text = spec.strip()
        if not text:
            raise MemoryLimitError(f"empty memory limit; write {FORMS}")
        if text.endswith("%"):
            return cls("percent", _number(text[:-1], text))
        if text[-1] in "xX":
            return cls("times", _number(text[:-1], text))
        try:
            bare = float(text)
        except ValueError:
            bare = None
        if bare is not None:
            return cls._bare(bare, text)
        if text.startswith("-"):
            raise MemoryLimitError(f"a memory limit must be positive, not {text}")
        try:
            return cls("bytes", float(parse_bytes(text)))
        except ValueError:
            raise MemoryLimitError(f"not a memory limit: {text!r}; write {FORMS}") from None

    @classmethod
    def _bare(cls, number: float, text: str) -> "MemoryLimit":
        if not math.isfinite(number):
            raise MemoryLimitError(f"memory limit {text} is not a finite number; write {FORMS}")
        if 0 < number <= 1:
            raise MemoryLimitError(f"memory limit {text} is ambiguous: write {number * 100:g}% (of the way from "
                                   f"the least memory any plan needs to the unplanned peak), {number:g}x (times "
                                   "the unplanned peak) or a size such as 8GiB")
        return cls("bytes", float(int(number)))

    @classmethod
    def percent(cls, value: float) -> "MemoryLimit":
        return cls("percent", float(value))

    # ---------------------------------------------------------------- resolving
    def resolve(self, trace: "Trace", *, unplanned_peak: int | None = None, check_minimum: bool = True) -> int:
        """The bytes the plan of ``trace`` may hold: what simulators, planners and the runtime compare.

        A percentage is of the trace's own range.  A size or a multiple is of the
        device's memory, from which the bytes the device held outside the recorded
        iteration (:attr:`Trace.outside_bytes <dqn_swap.trace.Trace.outside_bytes>`,
        measured on a GPU; 0 elsewhere) come off: the allocator's peak counts them
        beside the plan's.
        ``unplanned_peak``: the base of a multiple, measured on the device (default
        the trace's peak plus its outside bytes).
        ``check_minimum``: refuse a limit below the least memory any plan needs.

        Raises:
            MemoryLimitError: the limit is below that minimum (the message names it), or beyond any
                device.
        """
        low, high = int(trace.minimum_memory), int(trace.peak_bytes)
        if self.kind == "percent":
            return int(round(low + self.value / 100 * (high - low)))
        # Sizes and multiples are the device's memory: what the device held outside the traced
        # iteration as it was recorded (cuBLAS's workspaces, Trace.outside_bytes) stays there beside
        # the plan, so the plan's own bytes get the rest.
        outside = trace.outside_bytes
        if self.kind == "times":
            device = int(round(self.value * (unplanned_peak if unplanned_peak is not None else high + outside)))
        else:
            device = int(self.value)
        if device > MAX_BYTES:
            raise MemoryLimitError(f"memory limit {self} is beyond any device ({format_bytes(device)}; "
                                   f"{format_bytes(MAX_BYTES)} at most)")
        limit = device - outside
        if check_minimum and limit < low:
            held = (f"; {format_bytes(outside)} of it held on the device outside the recorded iteration, as cuBLAS's "
                    "workspaces are" if outside else "")
            raise MemoryLimitError(
                f"memory limit {format_bytes(device)} is below the minimum any plan needs for this trace, "
                f"{format_bytes(low + outside)} ({low + outside} bytes: what stays on the device at its busiest op, "
                f"{trace.op_label(trace.minimum_memory_op)}, even with every saved activation moved away between "
                f"its last forward use and its next use{held})")
        return max(limit, 0)

    def __str__(self) -> str:
        if self.kind == "percent":
            return f"{self.value:g}%"
        if self.kind == "times":
            return f"{self.value:g}x"
        return str(int(self.value))

    @property
    def label(self) -> str:
        """A short name for reports: ``50%``, ``0.5x``, or a size."""
        return str(self) if self.kind != "bytes" else format_bytes(self.value)


def _whole_number(x: object) -> bool:
    """Whether ``x`` is an ``int`` or a NumPy integer scalar (not a bool; a tensor's dtype has no kind)."""
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    return not isinstance(x, bool) and (isinstance(x, int) or (kind is not None and kind in "iu"
                                                              and getattr(x, "ndim", 0) == 0))


def _number(text: str, whole: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MemoryLimitError(f"not a memory limit: {whole!r}; write {FORMS}") from None
    if not math.isfinite(value):
        raise MemoryLimitError(f"memory limit {whole!r} is not a finite number; write {FORMS}")
    return value


def plan_bytes(value: object, where: str) -> int:
    """``value`` as the resolved bytes a plan may hold, at the inner boundary ``where`` (a simulator, a
    planner): an ``int`` (or NumPy integer) of at least 0.  Anything else is refused in one line: a
    float, a string or a :class:`MemoryLimit` is a limit not yet resolved against its trace (``0.5``
    would otherwise quietly become 0 bytes).

    Raises:
        MemoryLimitError: ``value`` is not a whole number of bytes, or is negative.
    """
    if not _whole_number(value):
        raise MemoryLimitError(f"{where} takes a memory limit resolved to bytes (an int), not {value!r}: "
                               "resolve it first, resolve_limit(trace, limit), which reads " + FORMS)
    if int(value) < 0:
        raise MemoryLimitError(f"{where} takes a memory limit of at least 0 bytes, not {int(value)}")
    return int(value)


def resolve_limit(trace: "Trace", spec: LimitSpec, *, unplanned_peak: int | None = None,
                  check_minimum: bool = True) -> int:
    """``spec`` (any form) in bytes for ``trace``: ``MemoryLimit.parse(spec).resolve(trace, ...)``.

    Raises:
        MemoryLimitError: as :meth:`MemoryLimit.parse` and :meth:`MemoryLimit.resolve`.
    """
    return MemoryLimit.parse(spec).resolve(trace, unplanned_peak=unplanned_peak, check_minimum=check_minimum)


__all__ = ["FORMS", "LimitSpec", "MemoryLimit", "MemoryLimitError", "plan_bytes", "resolve_limit"]
