"""The DQN paper's Algorithm 1 on one page, as CleanRL writes its ``dqn.py``.

What :class:`~.training.Training` runs, without its side concerns (evaluations, resume files,
demonstrations, logs): the environments, the Q-network and its target, the replay memory, then one
loop that explores epsilon-greedily, stores n-step transitions, fits the network on mini-batches
and refreshes the target.  Read this to see the algorithm; ``tests/agents/test_dqn_train.py``
checks that it trains, step for step, the network the full run trains.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

from dqn_swap.limits import LimitSpec
from dqn_swap.trace import Trace

from .buffer import NStepAccumulator, ReplayBuffer
from .config import DQNConfig
from .fitting import learning_rate_at, linear_schedule, make_envs, td_update
from .policy import GraphBatcher, QNetwork, q_values


def train_reference(traces: Trace | Sequence[Trace], memory_limits: LimitSpec | Sequence[LimitSpec],
                    config: DQNConfig) -> tuple[QNetwork, QNetwork, torch.optim.Optimizer]:
    """Train a Q-network with Algorithm 1 for ``config.total_timesteps`` steps; the last network, its
    target and the optimiser."""
    # seeding, environments (one per trace and limit), networks, replay memory
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    envs = make_envs(traces, memory_limits, None, config)
    batcher = GraphBatcher()
    keys = [batcher.register(e.graph) for e in envs]
    q_net = QNetwork(config)
    target_net = copy.deepcopy(q_net)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=config.learning_rate)
    rb = ReplayBuffer(config.buffer_size, rng, config.prioritized, config.per_alpha)
    nstep = NStepAccumulator(config.n_step, config.gamma)

    # episodes cycle through the cells in a random order
    order = rng.permutation(len(envs))
    episode = 0
    i = int(order[0])
    envs[i].reset(seed=int(rng.integers(2**31)))
    env, key = envs[i], keys[i]
    state = env.state()
    duration = config.exploration_fraction * config.total_timesteps
    for step in range(config.total_timesteps):
        # act: epsilon-greedy over the valid actions
        epsilon = linear_schedule(config.start_e, config.end_e, duration, step)
        valid = np.flatnonzero(state.valid)
        if rng.random() < epsilon:
            action = int(rng.choice(valid))
        else:
            with torch.no_grad():
                q, _, _ = q_values(q_net, batcher, [(key, state)])
            action = int(valid[np.argmax(q.numpy()[valid])])
        _, reward, terminated, truncated, _ = env.step(action)
        next_state = env.state()
        # store: n-step transitions (Eq. 4)
        for tr in nstep.push(key, state, action, reward * config.reward_scale, key, next_state, terminated, truncated):
            rb.add(tr)
        state = next_state
        if terminated or truncated:
            episode += 1
            i = int(order[episode % len(envs)])
            envs[i].reset(seed=int(rng.integers(2**31)))
            env, key = envs[i], keys[i]
            state = env.state()
            nstep.clear()
        # fit: one mini-batch of Eq. 5 every train_frequency steps
        if step >= config.learning_starts and step % config.train_frequency == 0 and len(rb):
            beta = config.per_beta + (1.0 - config.per_beta) * step / config.total_timesteps
            for group in optimizer.param_groups:  # constant unless lr_warmup or lr_decay
                group["lr"] = learning_rate_at(config, step)
            td_update(q_net, target_net, batcher, rb, optimizer, config, beta, None)
        if config.target_network and step % config.target_update == 0:
            target_net.load_state_dict(q_net.state_dict())
    return q_net, target_net, optimizer


__all__ = ["train_reference"]
