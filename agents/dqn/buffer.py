"""Experience replay (the set D of Algorithm 1), optionally prioritised, with n-step returns.

States are stored compactly: the graph key and the :class:`~dqn_swap.env.swap_recompute.DynamicState`
(validity bits and the few changing numbers), never the whole observation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from dqn_swap.env.swap_recompute import DynamicState


@dataclass
class Transition:
    key: int
    state: DynamicState
    action: int
    reward: float  # n-step discounted sum
    next_key: int
    next_state: DynamicState
    done: bool  # terminated (not truncated) within the n steps
    discount: float  # gamma ** n for the bootstrap term


class NStepAccumulator:
    """Turns 1-step transitions of one episode into n-step ones (n=1: unchanged)."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.queue: deque[tuple[int, DynamicState, int, float]] = deque()

    def push(self, key: int, state: DynamicState, action: int, reward: float, next_key: int,
             next_state: DynamicState, terminated: bool, truncated: bool) -> list[Transition]:
        self.queue.append((key, state, action, reward))
        out = []
        if len(self.queue) >= self.n:
            out.append(self._emit(next_key, next_state, terminated))
        if terminated or truncated:
            while self.queue:
                out.append(self._emit(next_key, next_state, terminated))
        return out

    def _emit(self, next_key: int, next_state: DynamicState, terminated: bool) -> Transition:
        ret, disc = 0.0, 1.0
        for _, _, _, r in self.queue:
            ret += disc * r
            disc *= self.gamma
        key, state, action, _ = self.queue.popleft()
        return Transition(key, state, action, ret, next_key, next_state, terminated, disc)

    def clear(self) -> None:
        self.queue.clear()


class ReplayBuffer:
    """Uniform replay, or proportional prioritised replay (Schaul et al., 2016) with ``alpha > 0``."""

    def __init__(self, capacity: int, rng: np.random.Generator, prioritized: bool = False,
                 alpha: float = 0.6) -> None:
        self.capacity = int(capacity)
        self.rng = rng
        self.prioritized = prioritized
        self.alpha = alpha
        self.data: list[Transition | None] = [None] * self.capacity
        self.priority = np.zeros(self.capacity, dtype=np.float64)
        self.pos = 0
        self.size = 0
        self.max_priority = 1.0

    def __len__(self) -> int:
        return self.size

    def add(self, t: Transition) -> None:
        # compact storage: float16 times, validity as bools
        for st in (t.state, t.next_state):
            if st.time_to_violation.dtype != np.float16:
                object.__setattr__(st, "time_to_violation", st.time_to_violation.astype(np.float16))
            if st.swap_slack is not None and st.swap_slack.dtype != np.float16:
                object.__setattr__(st, "swap_slack", st.swap_slack.astype(np.float16))
        self.data[self.pos] = t
        self.priority[self.pos] = self.max_priority
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, beta: float = 0.4) -> tuple[list[Transition], np.ndarray, np.ndarray]:
        """``(transitions, indices, importance weights)``; weights are 1 without prioritisation."""
        if self.prioritized:
            p = self.priority[: self.size] ** self.alpha
            p /= p.sum()
            idx = self.rng.choice(self.size, size=batch_size, p=p)
            w = (self.size * p[idx]) ** (-beta)
            w /= w.max()
        else:
            idx = self.rng.integers(0, self.size, size=batch_size)
            w = np.ones(batch_size)
        return [self.data[i] for i in idx], idx, w.astype(np.float32)

    def update_priorities(self, idx: np.ndarray, td_error: np.ndarray) -> None:
        if not self.prioritized:
            return
        pr = np.abs(td_error) + 1e-6
        self.priority[idx] = pr
        self.max_priority = max(self.max_priority, float(pr.max()))
