"""What every training run shares: the environments of its cells, the greedy evaluation, the
exploration schedule and the TD update (Eq. 5) with its demonstration losses; and whether an agent
can be compared with a run's (:func:`mismatch`).  The run's phases (:mod:`.training`) and the
one-page loop (:mod:`.reference_loop`) are made of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dqn_swap.cost import DeviceProfile
from dqn_swap.trace import Trace
from dqn_swap.limits import LimitSpec, MemoryLimit
from dqn_swap.env.swap_recompute import SwapRecomputeEnv

from .buffer import ReplayBuffer
from .agent_file import (ENVIRONMENT_FIELDS, environment_difference)
from .config import DQNConfig
from .planner import greedy_episode, make_env
from .policy import GraphBatcher, QEnsemble, QNetwork, masked_argmax, q_values
from torch_geometric.utils import scatter


def linear_schedule(start: float, end: float, duration: float, t: int) -> float:
    slope = (end - start) / max(duration, 1.0)
    return max(slope * t + start, end)


def learning_rate_at(config: DQNConfig, step: int) -> float:
    """The learning rate of the update at ``step``: ``learning_rate``, raised linearly from zero over
    the first ``lr_warmup`` of the learning steps (those after ``learning_starts``) and, with
    ``lr_decay``, lowered linearly to zero at the last step.  Both are off by default (the paper's
    constant rate); :func:`~.algorithm.finetune` turns them on (its docstring says why)."""
    lr = config.learning_rate
    learning = max(config.total_timesteps - config.learning_starts, 1)
    t = step - config.learning_starts
    if config.lr_warmup > 0:
        lr *= min(1.0, (t + 1) / (config.lr_warmup * learning))
    if config.lr_decay:
        lr *= max(0.0, 1.0 - t / learning)
    return lr


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def make_envs(traces: Trace | Sequence[Trace], memory_limits: LimitSpec | Sequence[LimitSpec],
              profile: str | DeviceProfile | None, config: DQNConfig) -> list[SwapRecomputeEnv]:
    """One environment per (trace, limit); the static graph of a trace is built once."""
    envs = []
    for trace in _as_list(traces):
        graph = None
        for limit in _as_list(memory_limits):
            env = make_env(trace, limit, profile, config, action_graph=graph)
            graph = env.graph
            env.name = f"{trace.meta.get('model', trace.fingerprint[:8])}@{_limit_label(trace, limit)}"
            envs.append(env)
    return envs


def _limit_label(trace: Trace, limit: LimitSpec) -> str:
    parsed = MemoryLimit.parse(limit)
    return f"{parsed.value:g}%" if parsed.kind == "percent" else str(parsed.resolve(trace))


def evaluate(net: QNetwork, batcher: GraphBatcher, envs: Sequence[SwapRecomputeEnv]) -> dict[str, Any]:
    """Greedy plan on every environment; ``score`` is the mean of overhead plus penalties."""
    per_env = {}
    for env in envs:
        per_env[env.name] = greedy_episode(net, batcher, env)
    rows = list(per_env.values())
    return {"score": float(np.mean([-r["return"] for r in rows])),
            "overhead": float(np.mean([r["overhead"] for r in rows])),
            "feasible": float(np.mean([r["feasible"] for r in rows])),
            "peak_bytes": float(np.mean([r["peak_bytes"] for r in rows])),
            "n_swap": float(np.mean([r["n_swap"] for r in rows])),
            "n_recompute": float(np.mean([r["n_recompute"] for r in rows])),
            "per_env": per_env}


def margin_loss(q: torch.Tensor, valid: torch.Tensor, batch: torch.Tensor, offsets: torch.Tensor,
                actions: torch.Tensor, rows: torch.Tensor, margin: float) -> torch.Tensor:
    """DQfD's large-margin loss (Hester et al. 2018, Eq. 2) over the graphs ``rows`` of a batch:
    mean of ``max_a [Q(s, a) + margin * (a != a_E)] - Q(s, a_E)``, the max over valid actions."""
    n = len(offsets)
    expert = torch.zeros_like(q, dtype=torch.bool)
    expert[offsets + actions] = True
    augmented = torch.where(valid, q + margin * (~expert).float(), torch.full_like(q, -torch.inf))
    best = scatter(augmented, batch, dim=0, dim_size=n, reduce="max")
    return (best[rows] - q[offsets[rows] + actions[rows]]).mean()


def imitation_loss(q: torch.Tensor, valid: torch.Tensor, batch: torch.Tensor, offsets: torch.Tensor,
                   actions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the demonstrated action under the softmax of Q over each state's valid
    actions, for the graphs ``rows`` of a batch: mean of ``log sum_a exp Q(s, a) - Q(s, a_E)``,
    the sum over valid actions (``demo_loss="cross_entropy"``, ours)."""
    n = len(offsets)
    masked = torch.where(valid, q, torch.full_like(q, -torch.inf))
    top = scatter(masked, batch, dim=0, dim_size=n, reduce="max").detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    mass = scatter(torch.where(valid, torch.exp(q - top[batch]), torch.zeros_like(q)), batch, dim=0, dim_size=n,
                   reduce="sum")
    lse = top + torch.log(mass)
    return (lse[rows] - q[offsets[rows] + actions[rows]]).mean()


def td_update(q_net: QNetwork, target_net: QNetwork, batcher: GraphBatcher, rb: ReplayBuffer,
              optimizer: torch.optim.Optimizer, config: DQNConfig, beta: float,
              demo_rb: ReplayBuffer | None = None) -> tuple[float, float, float]:
    """One gradient step on Eq. 4 over a replay mini-batch; returns (TD loss, mean Q, margin loss).

    With ``demo_rb`` (demonstrations), ``demo_fraction`` of the batch comes from it (all of it
    while ``rb`` is empty: pre-training), and :func:`margin_loss` (or :func:`imitation_loss`, by
    ``demo_loss``) on those samples, times ``demo_weight``, joins the TD loss.
    """
    n_demo = 0
    if demo_rb is not None and len(demo_rb):
        n_demo = config.batch_size if not len(rb) else int(round(config.demo_fraction * config.batch_size))
    n_main = config.batch_size - n_demo
    batch, idx, weights = rb.sample(n_main, beta) if n_main else ([], np.zeros(0, dtype=np.int64),
                                                                    np.zeros(0, dtype=np.float32))
    if n_demo:
        demo_batch, _, _ = demo_rb.sample(n_demo)
        batch = batch + demo_batch
        weights = np.concatenate([weights, np.ones(n_demo, dtype=np.float32)])
    items = [(t.key, t.state) for t in batch]
    next_items = [(t.next_key, t.next_state) for t in batch]
    actions = torch.tensor([t.action for t in batch], dtype=torch.long)
    rewards = torch.tensor([t.reward for t in batch], dtype=torch.float32)
    not_done = torch.tensor([0.0 if t.done else 1.0 for t in batch])
    discount = torch.tensor([t.discount for t in batch], dtype=torch.float32)
    with torch.no_grad():  # Eq. 5: y is a constant
        evaluator = target_net if config.target_network else q_net
        q_next, b_next, off_next = q_values(evaluator, batcher, next_items)
        n = len(batch)
        valid = batcher.valid_mask(next_items) if config.mask_target else torch.ones_like(q_next, dtype=torch.bool)
        if config.double_q:
            q_sel = q_values(q_net, batcher, next_items)[0] if evaluator is not q_net else q_next
            a_star = masked_argmax(q_sel, valid, b_next, n, off_next)
            v_next = q_next[off_next + a_star]
        else:
            qm = torch.where(valid, q_next, torch.full_like(q_next, -torch.inf))
            v_next = scatter(qm, b_next, dim=0, dim_size=n, reduce="max")
        v_next = torch.where(torch.isfinite(v_next), v_next, torch.zeros_like(v_next))
        y = rewards + discount * not_done * v_next
    q, node_batch, off = q_values(q_net, batcher, items)
    q_sa = q[off + actions]
    td = y - q_sa
    w = torch.from_numpy(weights)
    loss = (w * (td.pow(2) if config.loss == "mse" else F.smooth_l1_loss(q_sa, y, reduction="none"))).mean()
    margin = torch.zeros(())
    if n_demo:
        rows = torch.arange(n_main, n_main + n_demo)
        if config.demo_loss == "cross_entropy":
            margin = imitation_loss(q, batcher.valid_mask(items), node_batch, off, actions, rows)
        else:
            margin = margin_loss(q, batcher.valid_mask(items), node_batch, off, actions, rows, config.demo_margin)
        loss = loss + config.demo_weight * margin
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(q_net.parameters(), config.max_grad_norm)
    optimizer.step()
    if n_main:
        rb.update_priorities(idx, td[:n_main].detach().numpy())
    return float(loss.item()), float(q_sa.mean().item()), float(margin.item())


#: The settings that make the Q-network what it is (a reference agent must share them).
NETWORK_FIELDS = ("p", "T", "readout", "head", "head_features", "swap_slack", "aggr", "bias")


def mismatch(ref: QNetwork | QEnsemble, ref_config: DQNConfig, config: DQNConfig) -> str | None:
    if isinstance(ref, QEnsemble):
        return "it is an ensemble"
    differ = environment_difference(ref_config, config, ENVIRONMENT_FIELDS)
    if differ:
        return f"it plans in another environment ({differ})"
    differ = environment_difference(ref_config, config, NETWORK_FIELDS)
    if differ:
        return f"its network is another ({differ})"
    return None
