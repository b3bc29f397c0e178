"""The side concerns of a training run, as callbacks (Stable-Baselines3's pattern): TensorBoard
logs, the progress bar on a terminal, and a plain line per evaluation elsewhere.

The run (:mod:`.training`) calls every callback at the same points: a scalar or a text to log,
an evaluation made, a step taken, the run's end.  A hook a callback does not need is the base
class's, which does nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any


class TrainingCallback:
    """One side concern of a training run; each hook is called at its point of the run."""

    def on_scalar(self, tag: str, value: float, step: int) -> None:
        """A figure of the run at ``step`` (losses, episode returns, evaluations)."""

    def on_text(self, tag: str, text: str) -> None:
        """A text of the run (its configuration, its demonstrations)."""

    def on_evaluation(self, ev: dict[str, Any], best: dict[str, Any], step: int) -> None:
        """The greedy agent was evaluated at ``step`` (``ev``); ``best`` is the best so far."""

    def on_step(self) -> None:
        """One environment step was taken."""

    def close(self) -> None:
        """The run ended (or stopped): release what the callback holds."""


class TensorBoardLog(TrainingCallback):
    """Scalars and texts into ``log_dir/run_name`` (TensorBoard's event files)."""

    def __init__(self, log_dir: str | os.PathLike[str], run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(log_dir) / run_name))

    def on_scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def on_text(self, tag: str, text: str) -> None:
        self.writer.add_text(tag, text)

    def close(self) -> None:
        self.writer.close()


class ProgressBar(TrainingCallback):
    """A tqdm bar of the steps on a terminal, with the last and the best score."""

    def __init__(self, total: int, initial: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, desc="train", unit="step")

    def on_evaluation(self, ev: dict[str, Any], best: dict[str, Any], step: int) -> None:
        self.bar.set_postfix(score=f"{ev['score']:.4f}", best=f"{best['score']:.4f}")

    def on_step(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class PlainLines(TrainingCallback):
    """Off a terminal (a log file, a pipe): one line per evaluation on standard error."""

    def __init__(self, total: int, started: float) -> None:
        self.total = total
        self.started = started

    def on_evaluation(self, ev: dict[str, Any], best: dict[str, Any], step: int) -> None:
        what = f"{ev['phase']} agent" if ev.get("phase") else f"step {step:,} of {self.total:,}"
        print(f"train: {what}, score {ev['score']:.4f} (overhead {ev['overhead']:.4f}, feasible "
              f"{ev['feasible']:.0%}), best {best['score']:.4f} at step {best.get('step', step):,}, "
              f"{time.perf_counter() - self.started:.0f} s", file=sys.stderr, flush=True)


def progress_callbacks(progress: bool | None, total: int, initial: int, started: float) -> list[TrainingCallback]:
    """What shows a run's progress: a bar on a terminal, plain lines elsewhere, nothing with ``progress=False``."""
    if progress is False:
        return []
    return [ProgressBar(total, initial)] if sys.stderr.isatty() else [PlainLines(total, started)]


__all__ = ["PlainLines", "ProgressBar", "TensorBoardLog", "TrainingCallback", "progress_callbacks"]
