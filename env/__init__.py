"""Gymnasium environment for planning tensor swapping and recomputation.

``import dqn_swap.env`` registers ``dqn_swap/SwapRecompute-v0``::

    import gymnasium, dqn_swap.env
    e = gymnasium.make("dqn_swap/SwapRecompute-v0", trace=trace, memory_limit="50%")

See :class:`dqn_swap.env.SwapRecomputeEnv` for the specification.
"""

from gymnasium.envs.registration import register, registry

from .candidates import FEATURES, GRAPHS, ActionGraph, build_action_graph
from .swap_recompute import DynamicState, SwapRecomputeEnv

ENV_ID = "dqn_swap/SwapRecompute-v0"

if ENV_ID not in registry:
    # No TimeLimit wrapper: the environment truncates itself (max_episode_steps argument).
    register(id=ENV_ID, entry_point="dqn_swap.env.swap_recompute:SwapRecomputeEnv", disable_env_checker=False)

__all__ = ["ENV_ID", "FEATURES", "GRAPHS", "ActionGraph", "DynamicState", "SwapRecomputeEnv",
           "build_action_graph"]
