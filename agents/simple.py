"""Planners that follow a fixed rule, for experiments and tests (kind ``simple``).

Not from the papers (their baselines are in :mod:`dqn_swap.agents.baselines`): each is the
plain rule its name says, built on :func:`dqn_swap.planners.manual_plan` (every action right
after its tensor's last forward use, checked and scheduled by the simulator).

* ``swap-all``: swap every activation a plan may move (:func:`~dqn_swap.planners.saved_activations`);
* ``recompute-all``: recompute every one the simulator allows to
  (:func:`~dqn_swap.planners.recomputable_activations`);
* ``greedy-swap``: swap the largest activations, one more at a time, until the simulator
  finds the plan fits the limit (all of them when none does).
"""

from __future__ import annotations

from dqn_swap.cost import DeviceProfile, profile_of
from dqn_swap.limits import plan_bytes
from dqn_swap.plan import Action, ActionKind, Plan
from dqn_swap.planners import last_forward_event, manual_plan, recomputable_activations, saved_activations
from dqn_swap.trace import Trace


class SwapAllPlanner:
    """``swap-all``: every activation a plan may move is swapped."""

    name = "swap-all"

    def plan(self, trace: Trace, memory_limit: int, profile: DeviceProfile | str | None = None) -> Plan:
        memory_limit = plan_bytes(memory_limit, f"planner {self.name!r}")
        return manual_plan(trace, swap=saved_activations(trace), memory_limit=int(memory_limit), planner=self.name,
                           profile=profile)


class RecomputeAllPlanner:
    """``recompute-all``: every activation the simulator allows to recompute is recomputed."""

    name = "recompute-all"

    def plan(self, trace: Trace, memory_limit: int, profile: DeviceProfile | str | None = None) -> Plan:
        memory_limit = plan_bytes(memory_limit, f"planner {self.name!r}")
        return manual_plan(trace, recompute=recomputable_activations(trace), memory_limit=int(memory_limit),
                           planner=self.name, profile=profile)


class GreedySwapPlanner:
    """``greedy-swap``: the largest activations are swapped until the plan fits.

    The activations are taken in decreasing size (ties in packing order); the plan is the
    shortest such prefix that the simulator finds feasible under the limit, or all of them.
    """

    name = "greedy-swap"

    def plan(self, trace: Trace, memory_limit: int, profile: DeviceProfile | str | None = None) -> Plan:
        memory_limit = plan_bytes(memory_limit, f"planner {self.name!r}")
        from dqn_swap.simulator import Simulator

        limit = int(memory_limit)
        sim = Simulator(trace, limit, profile_of(trace, profile))
        order = sorted(saved_activations(trace), key=lambda t: -int(trace.tensor_nbytes[t]))
        actions: list[Action] = []
        chosen = len(order)
        for k, tid in enumerate(order):
            if sim.run(list(actions)).feasible:
                chosen = k
                break
            actions.append(Action(last_forward_event(trace, tid), tid, ActionKind.SWAP))
        return manual_plan(trace, swap=order[:chosen], memory_limit=limit, planner=self.name, profile=profile)


__all__ = ["GreedySwapPlanner", "RecomputeAllPlanner", "SwapAllPlanner"]
