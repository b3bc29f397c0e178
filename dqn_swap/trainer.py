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

Needs ``transformers`` (``pip install 'dqn-swap[hf]'``).
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - the hf extra is missing
    raise ImportError("dqn_swap.trainer needs the transformers package: pip install 'dqn-swap[hf]'") from e

from .user_loop import AutoPlan, autoplan
from .limits import LimitSpec


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

    After training, :attr:`planned` is the :class:`~dqn_swap.user_loop.AutoPlan` (its ``log``,
    ``entries`` and ``stats``).
    """

    def __init__(self, memory_limit: LimitSpec, **options: Any) -> None:
        self.memory_limit = memory_limit
        self.options = options
        self.planned: AutoPlan | None = None
        self._model: torch.nn.Module | None = None
        self._hook: Any = None
        self._open: Any = None  # the step under way

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("AutoPlanCallback: the trainer gave no model at on_train_begin")
        if self.planned is None or self._model is not model:
            self.options.setdefault("verbose", False)
            self.planned = autoplan(model, self.memory_limit, optimizer=_inner_optimizer(optimizer), **self.options)
            self._model = model
            self._hook = model.register_forward_pre_hook(self._open_step, prepend=True)

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


__all__ = ["AutoPlanCallback"]
