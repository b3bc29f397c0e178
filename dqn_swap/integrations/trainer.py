"""Planned training inside Hugging Face's ``Trainer``: one callback.

::

    from dqn_swap.trainer import AutoPlanCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[AutoPlanCallback("50%")])
    trainer.train()

The callback turns :func:`dqn_swap.autoplan` on for the trainer's model and optimizer when
training begins.  Every training forward pass opens a planned step (a forward pre-hook on
the model, placed first), and the step closes when the trainer is done with that micro-batch's
backward: at ``on_substep_end`` (a micro-batch of gradient accumulation) or
``on_pre_optimizer_step`` (the last one).  So the step is still open when ``training_step``
returns (the loss bookkeeping and gradient clipping run inside it, and in its trace): until
it closes, ``planned.last`` and ``planned.last_entry`` describe the micro-step before, which
under gradient accumulation is the other signature's plan.  Read them from a callback placed
after this one, at those two events.  Evaluation passes (no gradients, or the model in
eval mode) are left alone.  The optimizer the trainer steps (the one inside accelerate's
wrapper) reports its steps to the recorder through its own step hooks.

Planned training reports where the Trainer's users look.  Every time the trainer logs, the
callback adds :meth:`~dqn_swap.integrations.AutoPlan.figures` (``dqn_swap/plans``,
``dqn_swap/memory_limit_bytes``, ``dqn_swap/planned_peak_bytes``, ``dqn_swap/predicted_overhead``,
``dqn_swap/safe_steps`` ...) to that entry of ``trainer.state.log_history`` and to the logs the
callbacks after it receive.  The reporting callbacks of ``report_to`` come first in a Trainer's
list, so where ``report_to`` names TensorBoard the callback writes the same figures itself, as a
run of its own beside the trainer's: ``logging_dir/dqn_swap`` (transformers 4), or
``output_dir/runs/dqn_swap`` (5, whose runs are ``output_dir/runs/DATE_HOST``).

Needs ``transformers`` (``pip install 'dqn-swap[hf]'``).
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - the hf extra is missing
    raise ImportError("dqn_swap.trainer needs the transformers package: pip install 'dqn-swap[hf]'") from e

from .planned_loop import AutoPlan, autoplan
from ..limits import LimitSpec


def _inner_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (or the optimizer itself)."""
    # AcceleratedOptimizer is a torch Optimizer subclass that never ran Optimizer.__init__ (no hooks).
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


class AutoPlanCallback(TrainerCallback):
    """Turns :func:`dqn_swap.autoplan` on in a ``transformers.Trainer`` (module docstring).

    Args:
        memory_limit: any form of :mod:`dqn_swap.limits` (``"50%"``, ``"8GiB"``).
        **options: passed to :func:`dqn_swap.autoplan` (``planner``, ``cache``, ``allow_infeasible``,
            ``new_shapes``, ``verbose`` ...).

    After training, :attr:`planned` is the :class:`~dqn_swap.integrations.AutoPlan` (its ``log``,
    ``entries`` and ``stats``).
    """

    def __init__(self, memory_limit: LimitSpec, **options: Any) -> None:
        self.memory_limit = memory_limit
        self.options = options
        self.planned: AutoPlan | None = None
        self._model: torch.nn.Module | None = None
        self._hook: Any = None
        self._open: Any = None  # the step under way
        self._scalars: Any = None  # ScalarLog under logging_dir, where report_to names tensorboard

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("AutoPlanCallback: the trainer gave no model at on_train_begin")
        if self.planned is None or self._model is not model:
            self.options.setdefault("verbose", False)
            self.planned = autoplan(model, self.memory_limit, optimizer=_inner_optimizer(optimizer), **self.options)
            self._model = model
            self._hook = model.register_forward_pre_hook(self._open_step, prepend=True)
        report_to = getattr(args, "report_to", None) or []
        report_to = [report_to] if isinstance(report_to, str) else list(report_to)
        if "tensorboard" in report_to or "all" in report_to:
            import os

            from ..scalars import ScalarLog

            # transformers 4: beside the trainer's run in logging_dir; 5 names its runs
            # output_dir/runs/DATE_HOST, which TensorBoard shows beside output_dir/runs/dqn_swap
            logging_dir = getattr(args, "logging_dir", None)
            folder = (os.path.join(logging_dir, "dqn_swap") if logging_dir
                      else os.path.join(args.output_dir, "runs", "dqn_swap"))
            self._scalars = ScalarLog(folder, prefix="train/")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        """The planned figures join this log entry (module docstring)."""
        if self.planned is None or logs is None:
            return
        figures = self.planned.figures()
        logs.update(figures)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(figures)
        if self._scalars is not None:
            self._scalars.write(figures, state.global_step)

    def _open_step(self, module: torch.nn.Module, args: Any) -> None:
        if self._open is not None or not (module.training and torch.is_grad_enabled()):
            return
        assert self.planned is not None
        step = self.planned.step()
        step.__enter__()
        self._open = step

    def _close_step(self) -> None:
        step, self._open = self._open, None
        if step is not None:
            step.__exit__(None, None, None)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_step()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_step()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.planned is not None:
            self.planned.remove()
            p = self.planned
            n = sum(len(v) for v in p.variants.values())
            self.planned._note(f"training ended: {n} plan(s) for {len(p.variants)} signature(s) "
                               f"({p.replans} planned again for larger shapes or more bytes beside them), "
                               f"{p.safe_steps} of {p.steps} steps left their plan and ran in safe mode")
        self._model = None  # another train() starts a new autoplan
        if self._scalars is not None:
            self._scalars.close()
            self._scalars = None


__all__ = ["AutoPlanCallback"]
