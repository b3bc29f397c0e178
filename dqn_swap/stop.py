"""Stopping on SIGINT and SIGTERM: one line, exit 130 or 143, and no partial output.

An interrupt means *stop*, not "keep the best so far": a command that is stopped writes nothing
more, and what it had written stays whole, because every file goes through
:func:`dqn_swap.files.write_atomically` (a temporary file, then one rename).  Two places need more:

* a command that writes several outputs (``compare``'s table, CSV and plots) writes them inside
  :func:`outputs_together`: a signal that arrives meanwhile waits until all of them are written,
  then stops the command, whose line says that its outputs are complete;
* ``train`` keeps a resume file at every evaluation: a run stopped after one says how to continue
  it (``--resume``); a run stopped before any leaves nothing behind, not even its log folder.

:func:`installed` makes SIGINT and SIGTERM raise :class:`Stopped` (a ``KeyboardInterrupt``), so one
``except KeyboardInterrupt`` serves both.  Its handlers also note the signal, because an exception
raised by a signal handler can be lost on its way: Python drops it when the handler runs inside a
finaliser (``__del__``, a weakref callback: "Exception ignored in ..."), and a library that catches
broadly (``except Exception`` around a Numba kernel's ``SystemError``) can drop it too.  Every
progress report (:mod:`dqn_swap.progress`) calls :func:`check`, which raises a noted signal again, so
a long run stops at its next report whatever swallowed the first exception.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


class Stopped(KeyboardInterrupt):
    """The command was stopped by a signal; ``detail`` says what was kept (one line)."""

    def __init__(self, signum: int = signal.SIGINT, detail: str = "") -> None:
        super().__init__(detail)
        self.signum = int(signum)
        self.detail = detail

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


#: The signals :func:`installed`'s handlers were given, first first (emptied by :func:`installed` and :func:`clear`).
_noted: list[int] = []


def _raise_stopped(signum: int, frame: object) -> None:
    _noted.append(signum)
    raise Stopped(signum)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM raise :class:`Stopped` and are noted for :func:`check` (main thread
    only, where Python runs signal handlers); the handlers before are restored after.  A signal the
    process was started with ignored stays ignored, and a SIGINT handler other than Python's default
    is left alone."""
    clear()

    def ours(s: int, before: object) -> bool:
        return before is signal.default_int_handler if s == signal.SIGINT else before is not signal.SIG_IGN

    try:
        with _handled_by(_raise_stopped, ours):
            yield
    finally:
        clear()


def check() -> None:
    """Raise :class:`Stopped` if a signal was noted inside :func:`installed` (module docstring: its first
    exception may have been lost); a clock reading's cost, so long loops call it freely."""
    if _noted:
        raise Stopped(_noted[0])


def clear() -> None:
    """Forget the noted signals (a command that handled its stop, before the next one in this process)."""
    _noted.clear()


def as_stopped(e: KeyboardInterrupt) -> Stopped:
    """``e`` as a :class:`Stopped` (a plain ``KeyboardInterrupt`` is SIGINT's)."""
    return e if isinstance(e, Stopped) else Stopped(signal.SIGINT)


@contextlib.contextmanager
def signals_noted(received: list[int]) -> Iterator[None]:
    """Inside, SIGINT and SIGTERM append their number to ``received`` instead of raising (main thread
    only: elsewhere Python runs no signal handler); the handlers before are restored after.  A signal
    ignored before stays ignored: a command a shell started in the background (``dqn-swap plan ... &``
    in a script) inherits SIGINT ignored, so that Ctrl-C at the terminal is not meant for it."""
    def note(signum: int, frame: object) -> None:
        received.append(signum)

    with _handled_by(note, lambda s, before: before is not signal.SIG_IGN):
        yield


@contextlib.contextmanager
def _handled_by(handler: Callable[[int, object], None], takes: Callable[[int, object], bool]) -> Iterator[None]:
    """Inside, ``handler`` handles SIGINT and SIGTERM where ``takes(signal, handler before)`` says so
    (main thread only: elsewhere Python runs no signal handler); the handlers before come back after."""
    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM) if takes(s, signal.getsignal(s))}
    try:
        yield
    finally:
        for s, before in old.items():
            signal.signal(s, before)


@contextlib.contextmanager
def outputs_together(what: str) -> Iterator[None]:
    """Write several outputs as one: SIGINT and SIGTERM received inside wait until the block ends,
    then raise :class:`Stopped` saying ``what`` was written whole."""
    received: list[int] = []
    with signals_noted(received):
        yield
    if received:
        raise Stopped(received[0], f"{what} were written whole before stopping")


def kernel_interruption(error: SystemError) -> BaseException:
    """What a compiled (Numba) kernel's ``SystemError`` stands for: the ``KeyboardInterrupt`` (or
    :class:`Stopped`) a signal handler raised while the kernel ran, else the error itself.

    Numba runs Python callbacks inside a kernel (it unpickles constants there); a signal that
    arrives then has its handler's exception raised in that callback, which Numba reports as a
    ``SystemError`` caused by it.  Ctrl-C and ``kill`` must stop a command the same way whatever
    it was computing: ``except SystemError as e: raise kernel_interruption(e) from None``."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, KeyboardInterrupt):
        cause = cause.__cause__ or cause.__context__
    return cause if cause is not None else error


__all__ = ["Stopped", "as_stopped", "check", "clear", "installed", "kernel_interruption", "outputs_together", "signals_noted"]
