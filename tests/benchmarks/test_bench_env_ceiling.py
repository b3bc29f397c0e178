"""``benchmarks/bench_env_ceiling.py``: a plan replayed in the agent's environment, with and without
recompute chains."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_env_ceiling as bc  # noqa: E402
from dqn_swap.agents import get_planner  # noqa: E402
from dqn_swap.limits import resolve_limit  # noqa: E402


def test_a_plan_with_a_recompute_chain_is_reached_only_with_chains_on(tiny_resnet_trace) -> None:
    """torch.compile's knapsack removes a chain of activations on ResNet-14-tiny at 50 %: without
    chains the environment cannot offer all of them and the replay does not fit; with chains it
    replays the plan to the plan's own makespan."""
    trace = tiny_resnet_trace
    plan = get_planner("knapsack").plan(trace, resolve_limit(trace, "50%"), trace.meta["profile"])
    assert plan.figures["feasible"]
    off, on = bc.replay(trace, plan, chains=False), bc.replay(trace, plan, chains=True)
    for r in (off, on):  # every action of the plan is a node of the graph, at the plan's own event
        assert r["nodes"] == len(plan.actions)
        assert abs(r["nodes_overhead"] - plan.figures["overhead"]) < 1e-12
    assert not off["feasible"] and off["ratio"] == bc.UNFIT and off["actions"] < len(plan.actions)
    assert on["feasible"] and on["actions"] == len(plan.actions)
    assert abs(on["ratio"] - 1.0) < 1e-12 and abs(on["overhead"] - plan.figures["overhead"]) < 1e-12


def test_the_geometric_mean_counts_an_unfit_replay_as_unfit() -> None:
    assert abs(bc.geomean([1.0, bc.UNFIT]) - bc.UNFIT ** 0.5) < 1e-12
