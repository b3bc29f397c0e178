"""The TD step of the DQN (dqn_swap.agents.dqn.fitting.td_update) against hand-computed targets.

Two toy graphs and a Q-function linear in one-hot node features, ``Q(node) = w[feature]``, so
every target and gradient is a sum of a few numbers:

* graph 0: three nodes, features e0, e1, e2; graph 1: two nodes, features e1, e2;
* online weights ``w = (3, 1, 2)``, target weights ``w' = (10, 20, 30)``.

Transition A: graph 0, action 1, reward -1, not terminal, discount 0.9, next state with node 2
invalid.  Double DQN (van Hasselt et al. 2016) takes the next action by the online net among
the valid nodes {0, 1} (node 0, ``w[0] = 3``) and values it by the target net: ``y = -1 + 0.9 *
10 = 8``; plain DQN takes the target's own maximum over valid nodes: ``y = -1 + 0.9 * 20 = 17``.
Transition B: graph 1, action 0, reward 2, terminal: ``y = 2`` whatever the nets say.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dqn_swap.agents.dqn.fitting import td_update
from dqn_swap.agents.dqn.buffer import ReplayBuffer, Transition
from dqn_swap.agents.dqn.config import DQNConfig
from dqn_swap.env.swap_recompute import DynamicState

FEATURES = {0: torch.eye(3), 1: torch.eye(3)[1:]}  # graph key -> one-hot node features


class ToyBatcher:
    """The :class:`~dqn_swap.agents.dqn.policy.GraphBatcher` interface over the toy graphs."""

    def batch(self, items):  # noqa: ANN001, ANN201
        x = torch.cat([FEATURES[k] for k, _ in items])
        sizes = [len(FEATURES[k]) for k, _ in items]
        b = torch.repeat_interleave(torch.arange(len(items)), torch.tensor(sizes))
        offsets = torch.tensor(np.concatenate([[0], np.cumsum(sizes)[:-1]]), dtype=torch.long)
        return x, None, None, b, None, len(items), offsets

    def valid_mask(self, items):  # noqa: ANN001, ANN201
        return torch.from_numpy(np.concatenate([s.valid for _, s in items]))


class LinearQ(torch.nn.Module):
    """``Q(node) = x_node . w``: the toy stand-in for :class:`~dqn_swap.agents.dqn.policy.QNetwork`."""

    def __init__(self, w: list[float]) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(w))

    def forward(self, x, ei, ea, b, cur, n):  # noqa: ANN001, ANN201
        return x @ self.w


def state(valid: list[bool]) -> DynamicState:
    n = len(valid)
    return DynamicState(valid=np.array(valid), current=0, limit=0.5, deficit=0.0,
                        time_to_violation=np.zeros(n, dtype=np.float32), chosen=np.zeros(n, dtype=bool))


A = Transition(0, state([True, True, True]), 1, -1.0, 0, state([True, True, False]), False, 0.9)
B = Transition(1, state([True, True]), 0, 2.0, 1, state([True, True]), True, 0.81)


def one_step(double_q: bool, target_network: bool = True, lr: float = 0.1):  # noqa: ANN201
    """One TD step on a batch of 4 drawn (seeded) from a buffer holding A and B; returns the
    batch's indices, the loss, the online and target nets."""
    torch.manual_seed(0)
    rb = ReplayBuffer(2, np.random.default_rng(3))
    rb.add(A)
    rb.add(B)
    idx = np.random.default_rng(3).integers(0, 2, size=4)  # what the buffer will sample
    online, target = LinearQ([3.0, 1.0, 2.0]), LinearQ([10.0, 20.0, 30.0])
    config = DQNConfig(batch_size=4, double_q=double_q, target_network=target_network, mask_target=True,
                       loss="mse", max_grad_norm=1e9)
    opt = torch.optim.SGD(online.parameters(), lr=lr)
    loss, qmean, margin = td_update(online, target, ToyBatcher(), rb, opt, config, beta=1.0)
    return idx, loss, qmean, margin, online, target


@pytest.mark.parametrize(("double_q", "y_a"), [(True, 8.0), (False, 17.0)])
def test_the_target_and_the_step_match_the_hand_computation(double_q: bool, y_a: float) -> None:
    idx, loss, qmean, margin, online, target = one_step(double_q)
    assert set(idx.tolist()) == {0, 1}  # the seed draws both transitions
    y = np.where(idx == 0, y_a, 2.0)  # B is terminal: its target is its reward alone
    q_sa = np.array([1.0, 1.0])[idx]  # A: graph 0 node 1 (e1); B: graph 1 node 0 (e1); w[1] = 1
    assert loss == pytest.approx(float(np.mean((y - q_sa) ** 2)))
    assert qmean == pytest.approx(1.0) and margin == 0.0
    # d loss / d w = -(2 / N) sum (y - q) x: every action's feature is e1, so only w[1] moves
    grad = np.zeros(3)
    grad[1] = -2.0 / len(idx) * float(np.sum(y - q_sa))
    assert online.w.detach().numpy() == pytest.approx(np.array([3.0, 1.0, 2.0]) - 0.1 * grad)
    # the target is a constant: no gradient reaches the target net, which does not move
    assert target.w.grad is None and target.w.detach().tolist() == [10.0, 20.0, 30.0]


def test_terminal_transitions_ignore_the_next_state() -> None:
    """B alone (terminal): the same step whatever the target net holds."""
    results = []
    for tw in ([10.0, 20.0, 30.0], [-5.0, 100.0, 7.0]):
        rb = ReplayBuffer(1, np.random.default_rng(0))
        rb.add(B)
        online, target = LinearQ([3.0, 1.0, 2.0]), LinearQ(tw)
        config = DQNConfig(batch_size=2, loss="mse", max_grad_norm=1e9)
        loss, _, _ = td_update(online, target, ToyBatcher(), rb, torch.optim.SGD(online.parameters(), lr=0.1),
                               config, beta=1.0)
        results.append((loss, online.w.detach().tolist()))
    assert results[0] == results[1]
    assert results[0][0] == pytest.approx((2.0 - 1.0) ** 2)


def test_without_a_target_network_the_online_net_bootstraps_without_gradient() -> None:
    """``target_network=False``: the online net values the next state (A: valid {0, 1}, max w = 3,
    ``y = -1 + 0.9 * 3 = 1.7``), still under no_grad, so the gradient is only through Q(s, a)."""
    rb = ReplayBuffer(1, np.random.default_rng(0))
    rb.add(A)
    online, target = LinearQ([3.0, 1.0, 2.0]), LinearQ([10.0, 20.0, 30.0])
    config = DQNConfig(batch_size=1, target_network=False, double_q=False, loss="mse", max_grad_norm=1e9)
    loss, _, _ = td_update(online, target, ToyBatcher(), rb, torch.optim.SGD(online.parameters(), lr=0.5),
                           config, beta=1.0)
    y = -1.0 + 0.9 * 3.0
    assert loss == pytest.approx((y - 1.0) ** 2)
    # through Q(s, a) only: w[1] -= 0.5 * (-2 (y - 1)); a gradient through y would also move w[0]
    assert online.w.detach().numpy() == pytest.approx([3.0, 1.0 + 0.5 * 2 * (y - 1.0), 2.0])
