"""Sizes in bytes, as people write and read them: :func:`format_bytes`, :func:`parse_bytes`
and :data:`MAX_BYTES`, the most any size may claim.

They live here, below both :mod:`dqn_swap.trace` and :mod:`dqn_swap.limits`, so that neither
of those has to import the other for them: a limit is parsed and bounded without loading the
trace module, and the trace refuses an impossible size with the same words.  This module
imports nothing of the package.
"""

from __future__ import annotations

#: Bytes a single tensor (or a whole trace, or a limit) may claim: 1 PiB, beyond any device
#: (a corrupt file says more).
MAX_BYTES = 2**50

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1000**4, "tib": 1024**4}


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units for a report: ``512 B``, ``1.50 KiB``, ``8.00 GiB`` (TiB at most)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def parse_bytes(text: str) -> int:
    """Parse ``8GiB``, ``512 MB``, ``1e9`` into bytes (binary and decimal units).

    Raises :class:`ValueError`, with one line naming the accepted units or an example, for an
    unknown unit, a text that is no number, or a negative size.
    """
    s = text.strip().lower().replace(" ", "").replace("_", "")
    i = len(s)
    while i > 0 and s[i - 1].isalpha():
        i -= 1
    number, unit = s[:i], s[i:]
    if unit not in _UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 8GiB, 512MB, 1e9)") from None
    if value < 0:
        raise ValueError(f"size must not be negative: {text!r}")
    return int(value)


__all__ = ["MAX_BYTES", "format_bytes", "parse_bytes"]
