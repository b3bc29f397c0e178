"""What :func:`~dqn_swap.integrations.autoplan` accepts (its modes, and how many tries and variants it
makes) and the error it raises."""

from __future__ import annotations

import weakref

from ..errors import DqnSwapRuntimeError

#: model -> a weak reference to the AutoPlan attached to it, until its ``remove()``: one per model (two
#: sets of hooks would each record, plan and swap the same tensors); a copy of a model is another key.
#: Weak both ways: the AutoPlan holds its model, so a strong value would keep every planned model alive.
ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attached(model: object) -> object | None:
    """The AutoPlan attached to ``model`` (None: none, or it was removed or collected)."""
    ref = ATTACHED.get(model)
    return ref() if ref is not None else None


NEW_SHAPES = ("plan", "refuse")


SHAPES = ("exact", "bucket")


PLANNING = ("inline", "background")


_RECORDING, _RECORDED = "autoplan.recording", "autoplan.recorded"  # allocator timeline marks


#: Steps recorded, one after the other, once a step has left its plan, until one is a new variant: the
#: step that left is over by then, and the next ones may be of the usual kind (a padded batch every
#: third step).  Each costs one step in safe mode.
RECORD_TRIES = 4


#: Variants planned per signature at most (``max_variants``): past them, a step that leaves every
#: plan runs in safe mode from there.
MAX_VARIANTS = 8


#: Bytes (or 1 % of the trace's state, the larger) more alive at a step's start than its plan was
#: made for, past which the step is recorded and planned again (``AutoPlan._growth``).
GROWTH_SLACK = 1 << 20


class AutoPlanError(DqnSwapRuntimeError):
    """Planned training cannot go on as asked; the message is one line saying why and what to do."""
