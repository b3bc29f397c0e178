"""The DQN's experience replay (dqn_swap.agents.dqn.buffer): capacity, wrap-around, sampling, n-step returns."""

from __future__ import annotations

import numpy as np
import pytest

from dqn_swap.agents.dqn.buffer import NStepAccumulator, ReplayBuffer, Transition
from dqn_swap.env.swap_recompute import DynamicState


def state(tag: int, nodes: int = 3) -> DynamicState:
    """A state told apart by ``current`` (``tag``)."""
    return DynamicState(valid=np.ones(nodes, dtype=bool), current=tag, limit=0.5, deficit=0.1,
                        time_to_violation=np.full(nodes, 0.25, dtype=np.float32), chosen=np.zeros(nodes, dtype=bool))


def transition(tag: int) -> Transition:
    return Transition(key=0, state=state(tag), action=tag % 3, reward=float(tag), next_key=0,
                      next_state=state(tag + 1), done=False, discount=1.0)


def test_capacity_and_wrap_around() -> None:
    rb = ReplayBuffer(3, np.random.default_rng(0))
    assert len(rb) == 0
    for tag in range(5):
        rb.add(transition(tag))
    assert len(rb) == 3 and rb.pos == 2
    # the two oldest (0 and 1) were overwritten in place: slot i holds the newest with tag % 3 == i
    assert [t.reward for t in rb.data] == [3.0, 4.0, 2.0]
    # stored compactly: times as float16
    assert all(t.state.time_to_violation.dtype == np.float16 for t in rb.data)


def test_uniform_sampling_is_seeded_and_shaped() -> None:
    def sampled(seed: int) -> tuple[list[float], np.ndarray, np.ndarray]:
        rb = ReplayBuffer(10, np.random.default_rng(seed))
        for tag in range(4):
            rb.add(transition(tag))
        batch, idx, w = rb.sample(64)
        return [t.reward for t in batch], idx, w

    rewards, idx, w = sampled(7)
    assert len(rewards) == 64 and idx.shape == (64,) and w.shape == (64,) and w.dtype == np.float32
    assert np.all(w == 1.0)
    assert set(idx.tolist()) <= {0, 1, 2, 3} and len(set(idx.tolist())) == 4  # only filled slots, all of them
    assert rewards == [float(i) for i in idx]
    again = sampled(7)
    assert again[0] == rewards and np.array_equal(again[1], idx)
    assert not np.array_equal(sampled(8)[1], idx)


def test_prioritised_sampling_follows_the_priorities() -> None:
    """Proportional prioritisation (Schaul et al. 2016): P(i) = p_i^alpha / sum p^alpha and
    importance weights (N P(i))^-beta, normalised by their maximum."""
    rb = ReplayBuffer(4, np.random.default_rng(0), prioritized=True, alpha=1.0)
    for tag in range(4):
        rb.add(transition(tag))
    assert np.all(rb.priority == 1.0)  # new transitions get the largest priority seen
    rb.update_priorities(np.array([0, 1, 2, 3]), np.array([0.0, 1.0, 1.0, 2.0]))
    assert rb.max_priority == pytest.approx(2.0 + 1e-6)
    _, idx, w = rb.sample(4000, beta=1.0)
    counts = np.bincount(idx, minlength=4) / 4000
    p = np.array([0.0, 1.0, 1.0, 2.0]) + 1e-6  # |TD error| + epsilon
    p /= p.sum()
    assert counts == pytest.approx(p, abs=0.03)
    expected = (4 * p[idx]) ** -1.0
    assert w == pytest.approx(expected / expected.max(), rel=1e-5)
    rb.add(transition(9))  # a new transition: the maximum priority
    assert rb.priority[0] == rb.max_priority


def test_n_step_returns_and_their_discount() -> None:
    """Three 1-step transitions of one episode with n = 2, gamma = 0.5: each n-step transition
    sums the next n rewards discounted, bootstraps with gamma^n from the state n steps on, and at
    the episode's end the shorter tails are emitted with gamma^k and the terminal flag."""
    acc = NStepAccumulator(2, 0.5)
    out = acc.push(0, state(0), 0, 1.0, 0, state(1), False, False)
    assert out == []
    out = acc.push(0, state(1), 1, 2.0, 0, state(2), False, False)
    assert len(out) == 1
    first = out[0]
    assert first.state.current == 0 and first.action == 0 and first.next_state.current == 2
    assert first.reward == 1.0 + 0.5 * 2.0 and first.discount == 0.25 and not first.done
    out = acc.push(0, state(2), 2, 4.0, 0, state(3), True, False)
    assert [(t.state.current, t.reward, t.discount, t.done) for t in out] == [
        (1, 2.0 + 0.5 * 4.0, 0.25, True), (2, 4.0, 0.5, True)]
    assert all(t.next_state.current == 3 for t in out) and not acc.queue


def test_truncation_flushes_without_the_terminal_flag() -> None:
    acc = NStepAccumulator(3, 1.0)
    acc.push(0, state(0), 0, 1.0, 0, state(1), False, False)
    out = acc.push(0, state(1), 1, 1.0, 0, state(2), False, True)
    assert [(t.reward, t.discount, t.done) for t in out] == [(2.0, 1.0, False), (1.0, 1.0, False)]
    acc.push(0, state(5), 0, 1.0, 0, state(6), False, False)
    acc.clear()
    assert not acc.queue


def test_one_step_is_the_transition_itself() -> None:
    acc = NStepAccumulator(1, 0.9)
    (t,) = acc.push(3, state(0), 2, -0.5, 4, state(1), False, False)
    assert (t.key, t.action, t.reward, t.next_key, t.discount, t.done) == (3, 2, -0.5, 4, 0.9, False)
