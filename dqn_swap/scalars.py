"""Planned training's figures as TensorBoard scalars (``autoplan(..., tensorboard=FOLDER)`` and
the ``Trainer`` callback), under the tag prefix ``dqn_swap/``."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ScalarLog"]


class ScalarLog:
    """A TensorBoard event file in ``folder``, written lazily (nothing is created before the first
    figures).

    Args:
        folder: the folder of the event file (made if missing).
        prefix: put before every figure's name (``"train/"`` to sit beside a Trainer's own tags).

    Example::

        log = ScalarLog("runs/planned")
        log.write({"dqn_swap/planned_peak_bytes": 1.2e9}, step=10)
        log.close()
    """

    def __init__(self, folder: str | os.PathLike[str], prefix: str = "") -> None:
        self.folder = os.fspath(folder)
        self.prefix = prefix
        self._writer: Any = None

    def write(self, figures: dict[str, Any], step: int) -> None:
        """One scalar per figure that is a number (others are left out)."""
        numbers = {k: float(v) for k, v in figures.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not numbers:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.folder)
        for name, value in numbers.items():
            self._writer.add_scalar(self.prefix + name, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
