"""Planned training inside Hugging Face's ``Trainer``: ``from dqn_swap.trainer import AutoPlanCallback``.

The callback lives with the other integrations (:mod:`dqn_swap.integrations.trainer`, where its
documentation is); this is the path users import it by.
"""

from .integrations.trainer import AutoPlanCallback

__all__ = ["AutoPlanCallback"]
