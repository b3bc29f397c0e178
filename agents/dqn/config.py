"""Hyper-parameters of the DQN agent: one frozen dataclass, stored in every agent file."""

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
    ``head_features`` (ours: the Q head also reads the node's own features),
    ``swap_slack`` (ours: the network also reads the observation's ``swap_slack``
    column, when a swap's copy out would end against the copies already queued;
    see :class:`dqn_swap.env.SwapRecomputeEnv`).

    Environment: ``graph`` (``"candidates"``, ``"dataflow"`` or ``"events"``, see
    :mod:`dqn_swap.env.candidates`), ``recompute_chains`` (False: a recompute action
    that would need another removed tensor re-run first is invalid, see
    :class:`dqn_swap.env.SwapRecomputeEnv`), ``max_chain`` (with chains off, the
    largest group of removals linked that way that is still offered; 1: none),
    ``reward`` (``"whole"``: every action is
    charged its whole cost when taken; ``"accrued"``: only the stalls before
    the first excess, see :class:`dqn_swap.env.SwapRecomputeEnv`), penalties.

    Learning rate (ours): ``lr_warmup`` raises it linearly from zero over that fraction of the
    updates, ``lr_decay`` lowers it linearly to zero at the last step
    (:func:`~.fitting.learning_rate_at`); both off when training from scratch, on when fine-tuning
    (:func:`~.algorithm.finetune` says why).

    Fitted Q-iteration (section 4.10, Algorithm 1) and named improvements:
    ``target_network`` (a frozen copy updated every ``target_update`` steps;
    off: the paper's Eq. 5 with the online weights), ``n_step`` returns
    (1: the paper), ``double_q``, ``prioritized`` replay (proportional,
    ``per_alpha``, ``per_beta``), ``mask_target`` (the max in Eq. 5 only over
    valid actions of the next state).  ``gamma`` 1: the returns of an episode
    add up to minus the plan's overhead, which is what we minimise.
    ``reward_scale`` multiplies rewards inside the learner only.

    Demonstrations (Hester et al. 2018, DQfD; :mod:`dqn_swap.agents.dqn.demonstrations`):
    ``demonstrations`` ``"best-baseline"`` replays the best baseline's plan of every
    training cell into a replay memory kept for the whole run; ``demo_pretrain_steps``
    updates on it alone come first, then ``demo_fraction`` of every mini-batch is drawn
    from it, with the large-margin loss (margin ``demo_margin``, weight ``demo_weight``)
    on those samples.  ``"self"`` (ours, for fine-tuning): each cell's first demonstration is the
    ``dqn-search`` lookahead's episode with the network the run starts from, no baseline planned.
    ``"none"``: the paper's learner.  ``demo_loss="cross_entropy"``
    (ours) imitates by cross-entropy instead: the softmax of Q over the state's valid
    actions, against the demonstrated one, so that every other action is pushed below it,
    not only the best one by a margin.

    Search as the improvement operator (ours, in the spirit of expert iteration): with
    ``demo_improve="search"`` every evaluation also plans each training cell with the
    ``dqn-search`` lookahead (top ``search_k`` actions by Q, one step in the simulator) and
    keeps that episode as the cell's demonstration where it beats the current one; the
    greedy policy is then trained towards what search with its own Q finds.

    Expert iteration (Anthony et al., "Thinking Fast and Slow with Deep Learning and Tree
    Search", NeurIPS 2017; ours in this setting): ``demo_improve="polish"`` makes the whole
    ``dqn-search`` the teacher.  The cells' demonstrations start from the best baseline's plan
    polished by local search (:mod:`dqn_swap.agents.local_search`); every
    ``demo_improve_every`` steps (0: at every evaluation) each cell is planned again by the
    lookahead with the current Q, that plan and the cell's current demonstration are polished
    (``demo_polish_simulations`` simulations each), and the better replay replaces the
    demonstration where it beats it.  The greedy policy learns, through the large-margin loss,
    to take in one pass the actions the search found.  ``demo_dagger`` adds, at every round,
    the greedy agent's own states where it strays from the teacher's plan, labelled with the
    teacher's action (DAgger, :func:`dqn_swap.agents.dqn.demonstrations.corrections`; the last
    ``demo_dagger_keep`` per cell are kept).

    Distillation (ours): ``demo_teacher`` names agent files, comma-separated (``"ensemble,ensemble_groups"``;
    shipped agents go by their names).  Their plan of each cell, decoded by members as
    :class:`~dqn_swap.agents.dqn.planner.DQNPlanner` ``(members=True)`` does (the first file, each of
    its agents, and every further file in its own environment; the simulator keeps the fastest),
    joins the baselines' as a candidate demonstration, so that one agent learns to take in one pass
    what several greedy passes found.  Measured in docs/learning.md ("Distilling the members"): it
    helps agents alone, not their ensemble.
    """

    # network
    p: int = 32
    T: int = 4
    readout: str = "mean"
    head: str = "eq3"
    head_features: bool = True
    swap_slack: bool = False
    aggr: str = "mean"
    bias: bool = True
    # environment
    graph: str = "candidates"
    recompute_chains: bool = False
    max_chain: int = 1
    reward: str = "whole"
    infeasible_penalty: float = 1.0
    invalid_penalty: float = 0.1
    # learning
    total_timesteps: int = 20_000
    learning_rate: float = 1e-3
    lr_warmup: float = 0.0
    lr_decay: bool = False
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
    # demonstrations
    demonstrations: str = "none"
    demo_fraction: float = 0.25
    demo_margin: float = 0.8
    demo_loss: str = "margin"
    demo_weight: float = 1.0
    demo_pretrain_steps: int = 0
    demo_improve: str = "none"
    search_k: int = 4
    demo_improve_every: int = 0
    demo_polish_simulations: int = 4_000
    demo_dagger: bool = False
    demo_dagger_keep: int = 200
    demo_teacher: str = ""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _check(field.name, getattr(self, field.name))
        if self.demo_improve != "none" and self.demonstrations == "none":
            raise ValueError("DQN setting demo_improve needs demonstrations (set demonstrations=best-baseline or self)")
        if self.demo_teacher and self.demonstrations != "best-baseline":
            raise ValueError("DQN setting demo_teacher needs demonstrations (set demonstrations=best-baseline)")
        if self.demo_dagger and self.demo_improve != "polish":
            raise ValueError("DQN setting demo_dagger needs demo_improve=polish (its teacher)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DQNConfig":
        """The configuration stored in an agent file; keys that older ones lack take the
        value those agents were trained with (:data:`BEFORE_KEYS`), not today's default."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown DQN configuration keys: {', '.join(sorted(unknown))}")
        return cls(**{**BEFORE_KEYS, **d})

    def replace(self, **changes: Any) -> "DQNConfig":
        return dataclasses.replace(self, **changes)


#: What agents saved before a setting existed were trained and run with.
BEFORE_KEYS: dict[str, Any] = {"recompute_chains": True, "max_chain": 1, "swap_slack": False, "reward": "accrued",
                               "aggr": "sum", "head_features": False}


# What each setting may be: (type, low, high) for numbers (inclusive; None: unbounded), or the choices.
_RULES: dict[str, Any] = {
    "p": (int, 1, 1024), "T": (int, 1, 32), "readout": ("sum", "mean"), "head": ("eq3", "mlp"),
    "head_features": bool, "swap_slack": bool, "aggr": ("sum", "mean"), "bias": bool,
    "graph": ("candidates", "dataflow", "events"), "recompute_chains": bool, "max_chain": (int, 1, 64),
    "reward": ("whole", "accrued"), "infeasible_penalty": (float, 0, None),
    "invalid_penalty": (float, 0, None), "total_timesteps": (int, 1, 10**9), "learning_rate": (float, 1e-12, 10),
    "lr_warmup": (float, 0, 1), "lr_decay": bool,
    "buffer_size": (int, 1, 10**8), "batch_size": (int, 1, 65536), "gamma": (float, 0, 1),
    "reward_scale": (float, 1e-12, 1e6), "learning_starts": (int, 0, 10**9), "train_frequency": (int, 1, 10**6),
    "loss": ("mse", "huber"), "max_grad_norm": (float, 0, None), "start_e": (float, 0, 1), "end_e": (float, 0, 1),
    "exploration_fraction": (float, 1e-12, 1), "target_network": bool, "target_update": (int, 1, 10**9),
    "n_step": (int, 1, 1000), "double_q": bool, "prioritized": bool, "per_alpha": (float, 0, 1),
    "per_beta": (float, 0, 1), "mask_target": bool, "eval_every": (int, 1, 10**9), "seed": (int, 0, 2**63 - 1),
    "demonstrations": ("none", "best-baseline", "self"), "demo_fraction": (float, 0, 1), "demo_margin": (float, 0, None),
    "demo_loss": ("margin", "cross_entropy"),
    "demo_weight": (float, 0, None), "demo_pretrain_steps": (int, 0, 10**9),
    "demo_improve": ("none", "search", "polish"), "search_k": (int, 1, 1000),
    "demo_improve_every": (int, 0, 10**9), "demo_polish_simulations": (int, 1, 10**8),
    "demo_dagger": bool, "demo_dagger_keep": (int, 1, 10**7), "demo_teacher": str,
}


def _check(name: str, value: Any) -> None:
    """Refuse a setting outside its rule with one line that names it (``--set``, agent files)."""
    import math

    rule = _RULES.get(name)
    if rule is None:
        return
    if rule is str:
        if not isinstance(value, str):
            raise ValueError(f"DQN setting {name} must be text, not {value!r}")
        return
    if rule is bool:
        if not isinstance(value, bool):
            raise ValueError(f"DQN setting {name} must be True or False, not {value!r}")
        return
    if isinstance(rule, tuple) and rule and isinstance(rule[0], str):
        if value not in rule:
            raise ValueError(f"DQN setting {name} must be one of {', '.join(rule)}, not {value!r}")
        return
    kind, low, high = rule
    ok_type = (isinstance(value, int) and not isinstance(value, bool)) if kind is int else (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
    what = "a whole number" if kind is int else "a finite number"
    bounds = "" if low is None and high is None else (
        f" from {low:g} to {high:g}" if high is not None else f" of at least {low:g}")
    if not ok_type or (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"DQN setting {name} must be {what}{bounds}, not {value!r}")
