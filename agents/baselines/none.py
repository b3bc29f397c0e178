"""The reference point: no swapping, no recomputation."""

from __future__ import annotations

from typing import Any

from .base import ActionSet, BasePlanner, Evaluator, TraceFacts


class NonePlanner(BasePlanner):
    """Plan nothing; the figures say whether the trace fits the limit as it is."""

    name = "none"
    limitation = "it plans nothing: the iteration needs its unplanned peak"

    def choose(self, facts: TraceFacts, evaluator: Evaluator) -> tuple[ActionSet, dict[str, Any]]:
        return (), {}
