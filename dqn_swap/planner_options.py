"""The settings a planner offers on the command line, declared where the planner is registered.

A planner's entry in the registry (:func:`dqn_swap.planners.register`) lists its options: each
:class:`PlannerOption` names the setting it fills, the flag that sets it, how the flag's text is
read and its help.  The command line makes its flags from them, and refuses a flag that none of
the chosen planners reads (:func:`dqn_swap.planners.check_options_apply`).  A user's own planner
declares options the same way and gets its flags too::

    register("mine", Mine, options=(PlannerOption("depth", "how deep Mine looks", parse=int),))
    # dqn-swap plan t.trace -m 50% --planner mine --depth 3

Planners that read the same flag share one option object, so that a flag means one thing: the
time a planner may take is ``time_limit`` (``--time-limit``, also spelt ``--search-seconds``) for
``auto``, ``dqn-search`` and ``optimal`` alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlannerOption:
    """One setting a planner reads, as the command line offers it: ``--FLAG VALUE`` sets ``setting``.

    Args:
        setting: the keyword the planner's factory takes.
        help: what the setting does (the command line adds which planners read it).
        flag: the option's name on the command line (default: ``--`` and ``setting`` with dashes).
        parse: reads the flag's text; raises ``ValueError`` saying what it must be (default: the text).
        metavar, choices, nargs: as :meth:`argparse.ArgumentParser.add_argument` takes them.
        aliases: more names of the same flag.
        to_settings: the planner's settings from the parsed value, where one flag sets several
            (default: ``{setting: value}``).
    """

    setting: str
    help: str
    flag: str = ""
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    nargs: str | None = None
    aliases: tuple[str, ...] = ()
    to_settings: Callable[[Any], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.setting, str) or not self.setting.isidentifier():
            raise ValueError(f"a planner option's setting must be a keyword name, not {self.setting!r}")
        for name in self.names:
            if not name.startswith("--") or len(name) < 3 or any(c.isspace() for c in name):
                raise ValueError(f"a planner option's flag must be --NAME, not {name!r}")

    @property
    def name(self) -> str:
        """The flag (``--time-limit``)."""
        return self.flag or "--" + self.setting.replace("_", "-")

    @property
    def names(self) -> tuple[str, ...]:
        """The flag and its aliases."""
        return (self.name, *self.aliases)

    @property
    def dest(self) -> str:
        """The attribute argparse stores the flag's value under."""
        return self.name[2:].replace("-", "_")

    def settings(self, value: Any) -> dict[str, Any]:
        """The planner's settings for the parsed ``value``."""
        return self.to_settings(value) if self.to_settings is not None else {self.setting: value}


def positive_seconds(text: str) -> float:
    """A positive finite number of seconds; ``ValueError`` (one line) otherwise."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be a positive number of seconds, not {text!r}")
    return value


def simulation_count(text: str) -> int:
    """A whole number of simulations, 0 or more; ``ValueError`` (one line) otherwise."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise ValueError(f"must be a whole number of simulations, 0 or more, not {text!r}")
    return value


def checked_seconds(planner: str, setting: str, value: Any, *, optional: bool = True) -> float | None:
    """A planner's time setting (``time_limit``, ``wall_limit`` ...) as seconds: a positive finite
    number, or ``None`` (no limit) where ``optional``.

    Raises:
        ValueError: anything else (a string, a bool, zero, a negative or infinite number), in one line
            that names the planner and the setting.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        none = " or None" if optional else ""
        raise ValueError(f"planner {planner!r}: {setting} must be a positive number of seconds{none}, not {value!r}")
    return float(value)


def renamed_setting(old: str, new: str, value: Any) -> Any:
    """``value``, given under a planner setting's former name ``old``: a ``DeprecationWarning`` says
    its name is ``new`` now (a planner's constructor calls this for each renamed keyword)."""
    import warnings

    warnings.warn(f"the planner setting {old!r} is now called {new!r}", DeprecationWarning, stacklevel=3)
    return value


def readers_text(readers: Sequence[str]) -> str:
    """``--planner a, b and c``: who reads an option, for its help."""
    names = list(readers)
    return "--planner " + (names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1])


__all__ = ["PlannerOption", "checked_seconds", "positive_seconds", "readers_text", "renamed_setting", "simulation_count"]
