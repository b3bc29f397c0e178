"""Planning in the user's own loop: :func:`autoplan` (one line around a model and its optimizer) and
the Hugging Face ``Trainer`` callback (:class:`~dqn_swap.integrations.trainer.AutoPlanCallback`,
imported from :mod:`dqn_swap.trainer`).

They sit above the rest of the package: they record with the core, plan with the agents and train
with the runtime.  Rooms: :mod:`.planned_loop` (:class:`AutoPlan`, :func:`autoplan`),
:mod:`.loop_recording` (recording a live step), :mod:`.loop_planning` (planning it, and the cache),
:mod:`.signature` (what makes two steps one iteration), :mod:`.settings` (modes and the error) and
:mod:`.trainer`.
"""

from __future__ import annotations

from .planned_loop import AutoPlan, autoplan
from .settings import AutoPlanError
from .signature import batch_size_of, bucket, signature

__all__ = ["AutoPlan", "AutoPlanError", "autoplan", "batch_size_of", "bucket", "signature"]
