"""Progress of long planning runs on standard error: one helper for every planner.

A planner names itself and reports what it is doing as often as it likes::

    with progress("dqn-search") as show:
        for ...:
            show(lambda: f"polishing, {sims:,} simulations, best {best:.3f} s")

and the helper decides what reaches the stream:

* nothing at all unless progress is switched on -- for one planner (``progress(name, enabled=True)``)
  or for everything run inside :func:`showing` (the command line does this; the library API is quiet
  by default);
* nothing during the first :data:`QUIET_SECONDS` of a run, so planners that finish in a moment stay
  silent;
* on a terminal, one live line rewritten in place (``\\r``) at most every :data:`LIVE_EVERY` seconds;
* elsewhere (a log file, a pipe), a plain line every :data:`PLAIN_EVERY` seconds.

Each line reads ``NAME: TEXT, N s`` (the seconds since the run began, by the clock of the
:func:`showing` block, :func:`time.monotonic` by default), after the prefix of the enclosing
:func:`showing` block if it has one (``compare`` names its cell there).  The text is built only when
a line is written, so a report in an inner loop costs a clock reading.  When the run ends a live line
is finished with a newline, and a plain report's last state is written once more if any was written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TextIO

from .stop import check as check_stop

#: Seconds a run may take before its first progress line.
QUIET_SECONDS = 2.0
#: Seconds between rewrites of a live line (on a terminal).
LIVE_EVERY = 0.25
#: Seconds between plain lines (not on a terminal).
PLAIN_EVERY = 5.0

Text = str | Callable[[], str]


@dataclass
class _Settings:
    stream: TextIO | None  # None: sys.stderr when a line is written
    live: bool | None  # None: whether the stream is a terminal
    clock: Callable[[], float]
    prefix: str = ""
    quiet: float = QUIET_SECONDS
    live_every: float = LIVE_EVERY
    plain_every: float = PLAIN_EVERY
    width: list[int] = field(default_factory=lambda: [0])  # length of the live line on the stream now

    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def is_live(self) -> bool:
        if self.live is not None:
            return self.live
        try:
            return bool(self.out().isatty())
        except (AttributeError, ValueError):
            return False


_current: ContextVar[_Settings | None] = ContextVar("dqn_swap_progress", default=None)


@contextmanager
def showing(stream: TextIO | None = None, *, live: bool | None = None, prefix: str = "",
            clock: Callable[[], float] | None = None, quiet: float = QUIET_SECONDS,
            live_every: float = LIVE_EVERY, plain_every: float = PLAIN_EVERY) -> Iterator[None]:
    """Inside the block every :func:`progress` reports (module docstring).

    ``stream``: where (default standard error); ``live``: rewrite one line in place (default: when
    the stream is a terminal); ``prefix``: put before each line; ``clock``: seconds (tests pass a
    fake one); ``quiet``, ``live_every``, ``plain_every``: the intervals of the module docstring.
    A nested block inherits the outer one's settings unless it gives its own."""
    outer = _current.get()
    if outer is not None:
        s = _Settings(stream if stream is not None else outer.stream, live if live is not None else outer.live,
                      clock or outer.clock, prefix or outer.prefix, quiet, live_every, plain_every, outer.width)
    else:
        s = _Settings(stream, live, clock or time.monotonic, prefix, quiet, live_every, plain_every)
    token = _current.set(s)
    try:
        yield
    finally:
        _current.reset(token)


def is_showing() -> bool:
    """Whether progress is switched on here (inside :func:`showing`)."""
    return _current.get() is not None


class Progress:
    """The progress of one run; call it with the current state (a string, or a function making one)."""

    def __init__(self, name: str, settings: _Settings | None) -> None:
        self.name = name
        self._s = settings
        self._start = settings.clock() if settings is not None else 0.0
        self._last = -float("inf")
        self._text: Text = ""
        self.written = 0  # lines (or rewrites of the live line) written so far

    @property
    def enabled(self) -> bool:
        return self._s is not None

    def elapsed(self) -> float:
        """Seconds since the run began (0 when progress is off)."""
        return self._s.clock() - self._start if self._s is not None else 0.0

    def __call__(self, text: Text, force: bool = False) -> None:
        """Report the current state; written when its interval has passed (``force``: now, once the
        quiet interval is over).  Raises :class:`~dqn_swap.stop.Stopped` for a signal whose first
        exception was lost (:func:`dqn_swap.stop.check`): every long loop reports here."""
        check_stop()
        s = self._s
        if s is None:
            return
        self._text = text
        now = s.clock()
        if now - self._start < s.quiet:
            return
        live = s.is_live()
        if not force and now - self._last < (s.live_every if live else s.plain_every):
            return
        self._last = now
        self._write(live, now)

    def _line(self, now: float) -> str:
        text = self._text() if callable(self._text) else self._text
        return f"{self._s.prefix}{self.name}: {text}{', ' if text else ''}{now - self._start:.0f} s"

    def _write(self, live: bool, now: float) -> None:
        s = self._s
        out = s.out()
        line = self._line(now)
        if live:
            pad = max(s.width[0] - len(line), 0)
            out.write("\r" + line + " " * pad)
            s.width[0] = len(line)
        else:
            out.write(line + "\n")
        out.flush()
        self.written += 1

    def close(self, text: Text | None = None) -> None:
        """The run is over: finish the live line (with ``text`` if given), or write the last state once
        more as a plain line; nothing if no line was written."""
        s = self._s
        if s is None or not self.written:
            return
        if text is not None:
            self._text = text
        now = s.clock()
        if s.is_live():
            self._write(True, now)
            s.out().write("\n")
            s.out().flush()
            s.width[0] = 0
        else:
            self._write(False, now)
        self._s = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(name: str, enabled: bool | None = None) -> Progress:
    """A :class:`Progress` for a run of ``name``: on inside :func:`showing` (or with ``enabled=True``,
    then on standard error), off otherwise (``enabled=False``: off anyway)."""
    s = _current.get()
    if enabled is False:
        s = None
    elif enabled and s is None:
        s = _Settings(None, None, time.monotonic)
    return Progress(name, s)


__all__ = ["LIVE_EVERY", "PLAIN_EVERY", "QUIET_SECONDS", "Progress", "is_showing", "progress", "showing"]
