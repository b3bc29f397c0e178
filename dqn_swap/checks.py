"""Wrong argument types in the public API are one ``TypeError`` line naming the argument, raised
where the call is made, not an ``AttributeError`` deep inside."""

from __future__ import annotations

import os
from typing import Any


def expect(value: Any, types: type | tuple[type, ...], name: str, *, none: bool = False, what: str = "") -> Any:
    """``value`` if it is one of ``types`` (or ``None`` with ``none``), else a one-line ``TypeError``
    (``what`` names the types in it, for those whose module path says little)."""
    if value is None and none:
        return value
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in _tuple(types)):
        return value
    wanted = (what or " or ".join(_name(t) for t in _tuple(types))) + (" or None" if none else "")
    raise TypeError(f"{name} must be {wanted}, not {type(value).__name__}")


def expect_path(value: Any, name: str, *, none: bool = False) -> Any:
    """A file name (``str`` or ``os.PathLike``)."""
    if value is None and none:
        return value
    if isinstance(value, (str, os.PathLike)):
        return value
    raise TypeError(f"{name} must be a file name (str or pathlib.Path){' or None' if none else ''}, "
                    f"not {type(value).__name__}")


def expect_callable(value: Any, name: str, *, none: bool = False) -> Any:
    if (value is None and none) or callable(value):
        return value
    raise TypeError(f"{name} must be callable{' or None' if none else ''}, not {type(value).__name__}")


def expect_one_of(value: Any, choices: tuple[str, ...], name: str, error: type[Exception] = ValueError) -> Any:
    """``value`` if it is one of ``choices``, else one line naming the argument and the choices
    (``error``: the exception the caller's API raises for a bad setting)."""
    if value in choices:
        return value
    raise error(f"{name}={value!r}: one of {', '.join(choices)}")


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _name(t: type) -> str:
    module = t.__module__
    return t.__name__ if module in ("builtins", "") else f"{module.split('.')[0]}.{t.__qualname__}"


__all__ = ["expect", "expect_callable", "expect_path"]
