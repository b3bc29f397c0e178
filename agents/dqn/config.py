"""Hyper-parameters of the DQN agent: one frozen dataclass, stored in every checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DQNConfig:
    """Everything that defines an agent and how it was trained.

    Network (section 4.4, 4.9): ``p`` embedding size (32: half the paper's
    64, for training speed on two CPU cores), ``T`` structure2vec iterations, ``readout`` ``"sum"`` (Eq. 2 as written) or ``"mean"`` (ours:
    the graph state does not grow with the graph, which helps one agent serve
    graphs of very different sizes), ``bias`` adds biases to the linear maps,
    ``aggr`` ``"sum"`` (Eq. 1) or ``"mean"`` (ours: neighbourhood averages),
    ``head_features`` (ours: the Q head also reads the node's own features).

    Environment: ``graph`` (``"candidates"`` or ``"events"``, see
    :mod:`env.candidates`), ``recompute_chains`` (False: a recompute action
    that would need another removed tensor re-run first is invalid, see
    :class:`env.SwapRecomputeEnv`), ``reward`` (``"whole"``: every action is
    charged its whole cost when taken; ``"accrued"``: only the stalls before
    the first excess, see :class:`env.SwapRecomputeEnv`), penalties.

    Fitted Q-iteration (section 4.10, Algorithm 1) and named improvements:
    ``target_network`` (a frozen copy updated every ``target_update`` steps;
    off: the paper's Eq. 5 with the online weights), ``n_step`` returns
    (1: the paper), ``double_q``, ``prioritized`` replay (proportional,
    ``per_alpha``, ``per_beta``), ``mask_target`` (the max in Eq. 5 only over
    valid actions of the next state).  ``gamma`` 1: the returns of an episode
    add up to minus the plan's overhead, which is what we minimise.
    ``reward_scale`` multiplies rewards inside the learner only.
    """

    # network
    p: int = 32
    T: int = 4
    readout: str = "mean"
    head: str = "eq3"
    head_features: bool = True
    aggr: str = "mean"
    bias: bool = True
    # environment
    graph: str = "candidates"
    recompute_chains: bool = False
    reward: str = "whole"
    infeasible_penalty: float = 1.0
    invalid_penalty: float = 0.1
    # learning
    total_timesteps: int = 20_000
    learning_rate: float = 1e-3
    buffer_size: int = 50_000
    batch_size: int = 32
    gamma: float = 1.0
    reward_scale: float = 10.0
    learning_starts: int = 500
    train_frequency: int = 4
    loss: str = "mse"
    max_grad_norm: float = 10.0
    start_e: float = 1.0
    end_e: float = 0.02
    exploration_fraction: float = 0.5
    # improvements (ablation switches)
    target_network: bool = True
    target_update: int = 500
    n_step: int = 3
    double_q: bool = True
    prioritized: bool = False
    per_alpha: float = 0.6
    per_beta: float = 0.4
    mask_target: bool = True
    # evaluation / bookkeeping
    eval_every: int = 2_000
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DQNConfig":
        """The configuration stored in a checkpoint; keys that older checkpoints lack take the
        value those agents were trained with (:data:`BEFORE_KEYS`), not today's default."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown DQN configuration keys: {', '.join(sorted(unknown))}")
        return cls(**{**BEFORE_KEYS, **d})

    def replace(self, **changes: Any) -> "DQNConfig":
        return dataclasses.replace(self, **changes)


#: What agents saved before a setting existed were trained and run with.
BEFORE_KEYS: dict[str, Any] = {"recompute_chains": True, "reward": "accrued", "aggr": "sum",
                               "head_features": False}
