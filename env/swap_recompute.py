"""The swap/recompute planning environment (sections 4.5-4.10 of the DQN paper)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dqn_swap.cost import DeviceProfile, profile_of
from dqn_swap.limits import LimitSpec, resolve_limit
from dqn_swap.plan import Action, Plan
from dqn_swap.stop import kernel_interruption
from dqn_swap.trace import Trace

from .candidates import (F_CHOSEN, F_DEFICIT, F_EXEC, F_LIMIT, F_SLACK, F_TVIOL, F_VALID, FEATURES, N_FEATURES,
                         RECOMPUTE, SWAP, ActionGraph, build_action_graph, recompute_links)


@dataclass(frozen=True)
class DynamicState:
    """What changes between steps: the learner's fast path (see :meth:`SwapRecomputeEnv.state`).

    ``valid`` (bool per node), ``current`` (node under execution), ``deficit``
    and ``limit`` (transformed scalars), ``time_to_violation`` and
    ``swap_slack`` (float per node, zero where not valid; ``swap_slack`` also
    zero on recompute nodes, and None where the environment does not compute it)
    and ``chosen`` (bool per node: its action is in the plan) are all the
    observation adds to the static :class:`~dqn_swap.env.candidates.ActionGraph`.
    """

    valid: np.ndarray
    current: int
    limit: float
    deficit: float
    time_to_violation: np.ndarray
    chosen: np.ndarray
    swap_slack: np.ndarray | None = None


class SwapRecomputeEnv(gym.Env):
    """Choose tensors to swap to host memory or to recompute until a training
    iteration fits in a memory limit.

    ## Description

    The environment of section 4 of Chen, "GPU memory management for neural
    networks using deep Q-network".  One episode builds one plan for one
    recorded training iteration (a :class:`~dqn_swap.trace.Trace`) and one
    memory limit.  Every transition and reward comes from
    :class:`dqn_swap.simulator.Simulator` (one instance per environment, run
    once per step); the environment has no model of time of its own.

    The agent acts at *decision points* only: the op at which the simulated
    iteration, with the actions chosen so far, first needs more memory than
    the limit (the simulator's ``infeasible.op``).  This is the node under
    execution of section 4.6, advanced by the simulator straight to the next
    place where an action is needed, so that episodes are as long as the
    plan (tens to thousands of actions), not as the trace (up to 10^5
    events).  Doing nothing at other nodes is implied.

    ## Action Space

    ``Discrete(n_nodes)``: the index of a node (section 4.5).  Node 0 stands
    for *doing nothing*; every other action node stands for exactly one
    action: **swap** (offload the tensor after its decision event and
    prefetch it before its next read) or **recompute** (free it after its
    decision event and re-run its producer before its next read).  Decision
    events and action nodes are chosen by the heuristic of
    :mod:`dqn_swap.env.candidates`.  In the ``"events"`` graph, nodes that stand for
    no action exist too; they are never valid.

    An action is valid when its tensor has no action yet and it frees memory
    at the decision point (its decision event runs before that op and its
    next read after it).  With ``recompute_chains=False`` a recompute action
    is also invalid when it would form a chain with one already chosen: its
    producer reads a removed tensor, or it is read by a removed tensor's
    producer (the simulator re-runs transient inputs once per target, so a
    chain of ``k`` removals costs ``O(k^2)`` re-runs).  ``max_chain`` (ours,
    default 1) relaxes that rule: removals linked that way form groups, and a
    removal is valid while the group it would join holds at most
    ``max_chain`` tensors, so short chains (a block's normalisation and
    activation outputs, removed together) are offered and long ones are not.
    *Do nothing* is valid only when no other action is (the plan is already
    feasible, or nothing can help).
    ``info["action_mask"]`` and :meth:`action_masks` give the valid actions.
    An invalid action changes nothing and costs ``invalid_penalty``; it never
    raises.

    ## Observation Space

    A :class:`gymnasium.spaces.Graph`: ``nodes`` ``(n_nodes, 12)`` float32,
    ``edges`` ``(n_edges, 1)`` float32 time lags, ``edge_links``
    ``(n_edges, 2)`` (both directions).  Node feature columns
    (:data:`dqn_swap.env.candidates.FEATURES`):

    ====  ===================  ====================================================
    col   name                 meaning
    ====  ===================  ====================================================
    0     size                 ``log1p(bytes / s)``, ``s = (peak - minimum) / 100``
    1     transfer_time        device-to-host copy time, ``log1p(t / (compute/1000))``
    2     recompute_time       producer op's duration, same transform
    3     time_to_next_use     time from the decision event to the next read
    4     action_type          0 nothing, 1 swap, 2 recompute
    5     valid                1 if the action is valid now
    6     memory_limit         ``(limit - minimum) / (peak - minimum)`` (all nodes)
    7     under_execution      1 on the node under execution (last node before
                               the decision point), else 0
    8     deficit              ``log1p((needed - available) / s)`` at the decision
                               point (all nodes)
    9     time_to_violation    time from the decision event to the decision point
                               (valid nodes), time transform
    10    chosen               1 if the node's action is already in the plan
    11    swap_slack           valid swap nodes: how long before the decision point
                               the tensor's copy to the host would end, behind the
                               copies the plan already queues; signed time
                               transform ``sign(t) log1p(|t| / (compute/1000))``
    ====  ===================  ====================================================

    Columns 0-5 are the six features of section 4.4.1; 6 is the memory limit
    (one agent serves many limits); 7-11 are ours.  ``swap_slack`` is
    ``t_v - (t_e + b + d)``: ``t_v`` the decision point's op start and ``t_e`` the
    node's decision event (both on the trace's own clock, without stalls), ``d``
    its copy time, and ``b`` how long the device-to-host engine is still busy at
    ``t_e`` with the plan's swaps decided at or before ``t_e`` (one copy at a time in
    request order, as the simulator runs them).  Negative: the copy cannot free its
    bytes in time, so the op waits for it.  Without it an agent cannot see a
    swap's cost rise with the swaps already chosen; agents trained before it read
    columns 0-10 only (:data:`~dqn_swap.env.candidates.N_FEATURES_BEFORE_SLACK`).
    Edge lags use the time transform.  The static structure never changes during an episode: the fast
    path for learners is :attr:`graph` (an :class:`~dqn_swap.env.candidates.ActionGraph`,
    built once per trace) plus :meth:`state` (a :class:`DynamicState`).

    ## Rewards

    Section 4.7: minus the overhead the action adds, from the simulator:
    ``r_t = -(overhead(A_t) - overhead(A_{t-1}))`` with ``A_t`` the actions so
    far and ``overhead = (makespan - compute) / compute`` (0 for the empty
    plan).  A plan that does not fit yet is measured according to ``reward``:

    * ``"whole"`` (default, ours): over the whole iteration, the simulator
      running past the excesses as if the device had just enough memory there
      (:meth:`~dqn_swap.simulator.Simulator.run` with ``overcommit=True``).
      Each action is charged its whole cost when it is taken -- a removal its
      re-run in backward, an offload its pauses and its late prefetch -- as
      in the examples of section 4.7.
    * ``"accrued"``: the stalls accrued before the first excess only (the
      simulator stops there), so an action's backward costs are charged only
      when the plan fits, often many steps later.

    Either way the returns of an episode add up to minus the simulated
    overhead of the plan it produced (measured as above when it never fits),
    minus penalties: ``infeasible_penalty`` when the episode ends with the
    limit still exceeded, ``invalid_penalty`` per invalid action
    (``info["penalty"]`` is their running sum).  :meth:`step_many` (for
    planners, outside the Gymnasium API) takes several actions valid at the
    same decision point and simulates once; its reward is minus the overhead
    the whole batch adds, so the identity above holds for it too.

    ## Starting State

    The empty plan; the node under execution is the first decision point.
    Deterministic: ``reset(seed=...)`` only seeds ``np_random``.

    ## Episode End

    Terminated (section 4.10) when the simulated plan fits the limit (or
    after *do nothing*), or when it does not fit and no action can help
    (penalised).  Truncated after ``max_episode_steps`` steps (default
    twice the number of action nodes plus 8), which only invalid actions
    can reach.  ``info["plan_actions"]``, ``info["overhead"]``,
    ``info["feasible"]`` describe the plan; :meth:`plan` returns it as a
    :class:`~dqn_swap.plan.Plan`.

    ## Arguments

    ``trace`` (a Trace, or the path of a trace file), ``memory_limit`` (any form
    of :mod:`dqn_swap.limits`: ``"50%"`` of the way from ``trace.minimum_memory``
    to ``trace.peak_bytes``, ``"0.5x"`` the peak, ``"3GiB"``, bytes, or a
    :class:`~dqn_swap.limits.MemoryLimit`; below the minimum is refused),
    ``profile`` (name or :class:`~dqn_swap.cost.DeviceProfile`, default the
    trace's), ``graph`` (``"candidates"``, ``"dataflow"`` or ``"events"``),
    ``infeasible_penalty`` (1.0), ``invalid_penalty`` (0.1),
    ``max_episode_steps``, ``simulator`` (reuse a Simulator for this trace
    and limit), ``action_graph`` (reuse the static graph of this trace),
    ``recompute_chains`` (True: any valid recompute; False: no chains, above),
    ``max_chain`` (with chains off, the largest group of linked removals, above),
    ``swap_slack`` (False: column 11 stays 0, for agents that do not read it; it
    costs a tenth to a quarter of a step),
    ``reward`` (``"whole"`` or ``"accrued"``, above).

    ``gymnasium.make("dqn_swap/SwapRecompute-v0", trace=..., memory_limit=...)``
    works after ``import dqn_swap.env``.

    ## Version History

    * v0: first version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, trace: Trace | str | os.PathLike[str], memory_limit: LimitSpec,
                 profile: str | DeviceProfile | None = None,
                 *, graph: str = "candidates", infeasible_penalty: float = 1.0, invalid_penalty: float = 0.1,
                 max_episode_steps: int | None = None, simulator: Any = None,
                 action_graph: ActionGraph | None = None, recompute_chains: bool = True,
                 max_chain: int = 1, swap_slack: bool = True, reward: str = "whole",
                 render_mode: str | None = None) -> None:
        from dqn_swap.simulator import Simulator

        if isinstance(trace, (str, os.PathLike)):
            trace = Trace.load(trace)
        if not isinstance(trace, Trace):
            raise TypeError(f"trace must be a dqn_swap Trace or the path of a trace file, not {type(trace).__name__}")
        self.profile = profile_of(trace, profile)
        self.trace = trace
        self.memory_limit = resolve_limit(trace, memory_limit)
        self.sim = simulator if simulator is not None else Simulator(trace, self.memory_limit, self.profile)
        self.graph = action_graph if action_graph is not None else build_action_graph(
            trace, self.profile, self.sim.valid_actions(), graph,
            op_inputs=self.sim.index.op_inputs if graph == "dataflow" else None)
        self.infeasible_penalty = float(infeasible_penalty)
        self.invalid_penalty = float(invalid_penalty)
        self.render_mode = render_mode
        g = self.graph
        self.max_episode_steps = int(max_episode_steps or 2 * len(g.action_nodes) + 8)
        lo, hi = trace.minimum_memory, trace.peak_bytes
        self._limit_feature = float(np.clip((self.memory_limit - lo) / max(hi - lo, 1), -1.0, 2.0))
        self.action_space = spaces.Discrete(g.n_nodes)
        self.observation_space = spaces.Graph(
            node_space=spaces.Box(-np.inf, np.inf, (N_FEATURES,), np.float32),
            edge_space=spaces.Box(0.0, np.inf, (1,), np.float32))
        self._edge_links = np.ascontiguousarray(g.edge_index.T)
        self._op_start = trace.op_start
        self._empty = None  # simulated result of the empty plan, computed once
        if reward not in ("whole", "accrued"):
            raise ValueError(f"reward must be 'whole' or 'accrued', not {reward!r}")
        self.reward_mode = reward
        self.recompute_chains = bool(recompute_chains)
        if isinstance(max_chain, bool) or int(max_chain) != max_chain or max_chain < 1:
            raise ValueError(f"max_chain must be a whole number of at least 1, not {max_chain!r}")
        self.max_chain = int(max_chain)
        self.swap_slack = bool(swap_slack)
        self._chain_links = None if self.recompute_chains else recompute_links(trace, self.sim, g)
        # per node, the action as the simulator's arrays (Simulator.run_summary: no Action objects per step)
        self._node_event = g.event.astype(np.int64)
        self._node_tensor = g.tensor.astype(np.int64)
        self._node_kind = np.maximum(g.kind.astype(np.int64) - 1, 0)
        self._node_acts = g.event_op >= 0  # nodes that stand for an action
        acts = np.flatnonzero(self._node_acts)
        by_tensor = acts[np.argsort(self._node_tensor[acts], kind="stable")]
        cut = np.flatnonzero(np.diff(self._node_tensor[by_tensor])) + 1
        #: per acted-on tensor, its action nodes (taking one makes them all invalid)
        self._tensor_nodes = {int(self._node_tensor[grp[0]]): grp for grp in np.split(by_tensor, cut) if len(grp)}
        self._node_action: dict[int, Action] = {}  # made when first taken
        self._event_op = np.ascontiguousarray(g.event_op, dtype=np.int64)
        self._reuse_op = np.ascontiguousarray(g.reuse_op, dtype=np.int64)
        self._event_time = np.ascontiguousarray(g.event_time, dtype=np.float64)
        self._x0 = g.x_static.copy()  # the observation's nodes before any step: static columns and the limit
        self._x0[:, F_LIMIT] = self._limit_feature
        self._node_op = np.ascontiguousarray(g.node_op, dtype=np.int64)
        self._time_scale = float(g.time_scale)
        self._tv_arg = np.empty(g.n_nodes, dtype=np.float64)  # work array of _update_features
        self._is_swap = g.kind == SWAP
        # per node, its tensor's device-to-host copy time (seconds; swap_slack)
        self._node_d2h = np.asarray(self.sim.tt_d2h, dtype=np.float64)[self._node_tensor]
        from .kernels import refresh

        self._refresh = refresh
        self._reset_state()

    # ------------------------------------------------------------------ state
    def _reset_state(self) -> None:
        self.actions: list[Action] = []
        self._nodes: list[int] = []  # the nodes of self.actions, in order
        # the plan as the simulator's arrays (rows: events, tensors, kinds), its first _n columns
        self._plan_arrays = np.zeros((3, self.graph.n_action_tensors + 1), dtype=np.int64)
        self._n = 0
        # action nodes whose tensor has no action yet and that no removal blocks (chains off)
        self._avail = self._node_acts.copy()
        self._chosen = np.zeros(self.graph.n_nodes, dtype=bool)
        self._chain_blocked = np.zeros(self.graph.n_nodes, dtype=bool)
        # chains off with max_chain > 1 (else None): per chosen recompute node its group (a node of
        # it), -1 else; per group node, the group's size
        grouped = self._chain_links is not None and self.max_chain > 1
        self._group = np.full(self.graph.n_nodes, -1, dtype=np.int64) if grouped else None
        self._group_size = np.zeros(self.graph.n_nodes, dtype=np.int64) if grouped else None
        self._overhead = 0.0
        self._penalty = 0.0
        self._steps = 0
        self._done = False
        self._summary = None
        self.episode_return = 0.0
        # the observation's nodes, kept up to date step by step (node_features(state()) from scratch)
        self._x = self._x0.copy()
        self._cur = 0
        self._deficit_feature = 0.0
        self._valid = np.zeros(self.graph.n_nodes, dtype=bool)
        self._tv_nodes = np.zeros(self.graph.n_nodes, dtype=np.int64)  # nodes whose time_to_violation ...
        self._n_tv = 0  # ... is set in _x: the first _n_tv
        self._slack_nodes = np.zeros(0, dtype=np.int64)  # nodes whose swap_slack is set in _x ...
        self._n_slack = 0  # ... (all of _slack_nodes when not 0)

    @property
    def result(self) -> Any:
        """The simulator's :class:`~dqn_swap.simulator.SimResult` of the plan so far (``None``
        before :meth:`reset`); made from the last step's simulation when first asked for."""
        return self._summary.result if self._summary is not None else None

    def _simulate(self) -> None:
        if not self._n and self._empty is not None:
            res = self._empty
        else:
            plan = self._plan_arrays[:, :self._n]
            res = self.sim.run_summary(plan[0], plan[1], plan[2], overcommit=self.reward_mode == "whole")
            if not self._n:
                self._empty = res
        self._summary = res
        self._feasible = feasible = bool(res.feasible)
        if feasible:
            op = -1
            self._deficit = 0.0
        else:
            stuck = res.stuck_op >= 0
            op = int(res.stuck_op) if stuck else int(res.peak_op)
            need = float(res.shortfall) if stuck else float(res.peak_bytes - self.memory_limit)
            self._deficit = max(need, 0.0)
        self._op = op
        self._update_features()

    def _update_features(self) -> None:
        """Bring the valid-action mask and the observation's dynamic columns (all but ``chosen``,
        set by :meth:`_take`) to the state just simulated, in place: what :meth:`state` and
        :meth:`node_features` define (:func:`dqn_swap.env.kernels.refresh`)."""
        g = self.graph
        x = self._x
        op = self._op
        try:
            cur, k = self._refresh(x, self._valid, self._avail, self._event_op, self._reuse_op, self._event_time,
                                   self._node_op, self._tv_nodes, self._n_tv, op,
                                   float(self._op_start[op]) if op >= 0 else 0.0, self._time_scale, self._cur,
                                   F_VALID, F_EXEC, F_TVIOL, self._tv_arg)
        except SystemError as e:  # a signal while the kernel ran (dqn_swap.stop.kernel_interruption)
            raise kernel_interruption(e) from None
        self._cur, self._n_tv = cur, k
        if k:
            x[self._tv_nodes[:k], F_TVIOL] = np.log1p(self._tv_arg[:k])
        if self.swap_slack:
            self._update_slack()
        deficit = float(np.log1p(self._deficit / g.size_scale))
        if deficit != self._deficit_feature:
            x[:, F_DEFICIT] = deficit
            self._deficit_feature = deficit

    def _update_slack(self) -> None:
        """Column ``swap_slack`` of the valid swap nodes (zero elsewhere; see the class docstring)."""
        x = self._x
        if self._n_slack:
            x[self._slack_nodes, F_SLACK] = 0.0
            self._n_slack = 0
        if self._op < 0:
            return
        nodes = np.flatnonzero(self._valid & self._is_swap)
        if not len(nodes):
            return
        t_e = self._event_time[nodes]
        done = t_e + self._node_d2h[nodes]  # when each copy would end on an idle engine
        taken = np.asarray(self._nodes, dtype=np.int64)
        chosen = taken[self._is_swap[taken]]
        if len(chosen):
            # the engine's queue of the plan's copies, in request order: end_i = max(t_i, end_{i-1}) + d_i
            order = np.argsort(self._event_time[chosen], kind="stable")
            t_q, d_q = self._event_time[chosen][order], self._node_d2h[chosen][order]
            cum = np.cumsum(d_q)
            end = cum + np.maximum.accumulate(t_q - (cum - d_q))
            last = np.searchsorted(t_q, t_e, side="right") - 1  # copies requested at or before t_e
            busy = np.where(last >= 0, end[np.maximum(last, 0)], 0.0)
            done = np.maximum(t_e, busy) + self._node_d2h[nodes]
        slack = (float(self._op_start[self._op]) - done) / self._time_scale
        x[nodes, F_SLACK] = np.sign(slack) * np.log1p(np.abs(slack))
        self._slack_nodes, self._n_slack = nodes, len(nodes)

    def _stuck(self) -> bool:
        return not self._feasible and bool(self._valid[0])

    def state(self) -> DynamicState:
        """The dynamic part of the observation (fast path for learners)."""
        return DynamicState(valid=self._valid.copy(), current=self._cur, limit=self._limit_feature,
                            deficit=self._deficit_feature, time_to_violation=self._x[:, F_TVIOL].copy(),
                            chosen=self._chosen.copy(),
                            swap_slack=self._x[:, F_SLACK].copy() if self.swap_slack else None)

    def node_features(self, st: DynamicState | None = None) -> np.ndarray:
        st = st or self.state()
        x = self.graph.x_static.copy()
        x[:, F_VALID] = st.valid
        x[:, F_LIMIT] = st.limit
        x[st.current, F_EXEC] = 1.0
        x[:, F_DEFICIT] = st.deficit
        x[:, F_TVIOL] = st.time_to_violation
        x[:, F_CHOSEN] = st.chosen
        if st.swap_slack is not None:
            x[:, F_SLACK] = st.swap_slack
        return x

    def _obs(self) -> spaces.GraphInstance:
        # fresh arrays every call: users may keep (and modify) what we return
        return spaces.GraphInstance(nodes=self._x.copy(), edges=self.graph.edge_attr.copy(),
                                    edge_links=self._edge_links.copy())

    def action_masks(self) -> np.ndarray:
        """Valid actions now (bool per node)."""
        return self._valid.copy()

    def _info(self) -> dict[str, Any]:
        res = self._summary
        return {"action_mask": self._valid.copy(), "overhead": float(self._overhead),
                "feasible": bool(self._feasible), "penalty": float(self._penalty),
                "plan_actions": tuple(self.actions), "decision_op": int(self._op),
                "deficit_bytes": float(self._deficit),
                "peak_bytes": int(res.peak_bytes) if res is not None else None}

    # -------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # noqa: ANN201
        super().reset(seed=seed)
        self._reset_state()
        self._simulate()
        return self._obs(), self._info()

    def step(self, action):  # noqa: ANN001, ANN201
        if self._summary is None:
            raise RuntimeError("call reset() before step()")
        self._steps += 1
        a = int(action)
        reward = 0.0
        terminated = False
        if self._done:
            raise RuntimeError("episode is over; call reset()")
        if not (0 <= a < self.graph.n_nodes) or not self._valid[a]:
            reward = -self.invalid_penalty
            self._penalty += self.invalid_penalty
        elif a == 0 or self.graph.kind[a] == 0:
            terminated = True
        else:
            self._take(a)
            reward = self._resimulate()
            terminated = self._feasible or self._stuck()
        if terminated and not self._feasible:
            reward -= self.infeasible_penalty
            self._penalty += self.infeasible_penalty
        truncated = not terminated and self._steps >= self.max_episode_steps
        self._done = terminated or truncated
        self.episode_return += reward
        return self._obs(), float(reward), terminated, truncated, self._info()

    def _take(self, node: int) -> None:
        """Add the action of ``node`` to the plan (no simulation)."""
        act = self._node_action.get(node)
        if act is None:
            act = self._node_action[node] = self.graph.action(node)
        self.actions.append(act)
        self._nodes.append(node)
        n, plan = self._n, self._plan_arrays
        plan[0, n] = self._node_event[node]
        plan[1, n] = self._node_tensor[node]
        plan[2, n] = self._node_kind[node]
        self._n = n + 1
        self._avail[self._tensor_nodes[act.tensor]] = False
        self._chosen[node] = True
        self._x[node, F_CHOSEN] = 1.0
        if self._chain_links is not None and self.graph.kind[node] == RECOMPUTE:
            links = self._chain_links[node]
            if self.max_chain == 1:  # no chains: every linked removal is blocked
                self._chain_blocked[links] = True
                self._avail[links] = False
            else:
                self._join_group(node, links)

    def _join_group(self, node: int, links: np.ndarray) -> None:
        """Chains off, ``max_chain > 1``: put the removal ``node`` in one group with the chosen
        removals it links to, then block every unchosen removal whose group would exceed
        ``max_chain`` tensors (groups only grow, so a blocked removal stays blocked)."""
        group, size = self._group, self._group_size
        joined = np.unique(group[links][group[links] >= 0])
        total = 1 + int(size[joined].sum())
        if len(joined):
            group[np.isin(group, joined)] = node
        group[node] = node
        size[node] = total
        members = np.flatnonzero(group == node)
        around = np.unique(np.concatenate([self._chain_links[int(m)] for m in members]))
        for u in around[group[around] < 0].tolist():
            linked = self._chain_links[u]
            groups = np.unique(group[linked][group[linked] >= 0])
            if 1 + int(size[groups].sum()) > self.max_chain:
                self._chain_blocked[u] = True
                self._avail[u] = False

    def _resimulate(self) -> float:
        """Simulate the plan so far; returns minus the overhead added since the last simulation."""
        self._simulate()
        overhead = float(self._summary.overhead)
        reward = -(overhead - self._overhead)
        self._overhead = overhead
        return reward

    def step_many(self, nodes: list[int]) -> tuple[float, bool]:
        """Take several actions at the current decision point, then simulate once.

        A planner's shortcut, not part of the Gymnasium API: ``nodes`` must all
        be valid now; a node that an earlier one of ``nodes`` makes invalid
        (the other action on the same tensor, a recompute chain) is skipped.
        Returns ``(reward, done)``: minus the overhead the batch adds (and the
        infeasibility penalty if the episode ends without a fitting plan).
        """
        if self._summary is None or self._done:
            raise RuntimeError("call reset() before step_many()")
        g = self.graph
        for a in nodes:
            a = int(a)
            if not (0 < a < g.n_nodes) or g.kind[a] == 0 or not self._valid[a]:
                raise ValueError(f"node {a} is not a valid action now")
            if self._avail[a]:  # not made invalid by an earlier node of the batch
                self._take(a)
                self._steps += 1
        reward = self._resimulate()
        self._done = self._feasible or self._stuck()
        if self._done and not self._feasible:
            reward -= self.infeasible_penalty
            self._penalty += self.infeasible_penalty
        self.episode_return += reward
        return float(reward), self._done

    _EPISODE_FIELDS = ("actions", "_nodes", "_plan_arrays", "_n", "_avail", "_chosen", "_chain_blocked",
                       "_group", "_group_size",
                       "_overhead", "_penalty", "_steps", "_done", "_summary", "_feasible", "_op", "_deficit",
                       "_valid", "episode_return", "_x", "_cur", "_deficit_feature", "_tv_nodes", "_n_tv",
                       "_slack_nodes", "_n_slack")

    def snapshot(self) -> tuple:
        """The episode's state, for :meth:`restore` (a planner's lookahead)."""
        return tuple(v.copy() if isinstance(v, (np.ndarray, list)) else v
                     for v in (getattr(self, f) for f in self._EPISODE_FIELDS))

    def restore(self, snap: tuple) -> None:
        """Return to a state taken by :meth:`snapshot`."""
        for f, v in zip(self._EPISODE_FIELDS, snap):
            setattr(self, f, v.copy() if isinstance(v, (np.ndarray, list)) else v)

    # ------------------------------------------------------------ results
    @property
    def feasible(self) -> bool:
        return bool(self._feasible)

    @property
    def deficit_bytes(self) -> float:
        """Bytes missing at the decision point (0 when the plan fits)."""
        return float(self._deficit)

    @property
    def decision_op(self) -> int:
        """The op of the decision point (-1 when the plan fits)."""
        return int(self._op)

    def deficit_ahead(self, ops: int) -> float:
        """Most bytes missing at any of the ``ops`` ops after the decision point, from the
        simulator's instant-swap memory need (``SimResult.memory_need``) of the plan so far."""
        if self._feasible or ops <= 0:
            return 0.0
        need = self._summary.memory_need[self._op + 1: self._op + 1 + int(ops)]  # from the last simulation
        return float(max(int(need.max()) - self.memory_limit, 0)) if len(need) else 0.0

    def plan(self, planner: str = "dqn", settings: dict[str, Any] | None = None) -> Plan:
        """The plan of the actions taken so far, with the simulator's figures."""
        summary = self._summary
        if summary is None or (not summary.feasible and self.reward_mode == "whole"):
            result = self.sim.run(list(self.actions))  # the plan file carries the standard figures
        else:
            result = summary.result
        return Plan(actions=Plan.sorted_actions(self.actions), memory_limit=int(self.memory_limit),
                    trace_fingerprint=self.trace.fingerprint, profile=self.profile.name, planner=planner,
                    settings=dict(settings or {}), figures=result.figures(), schedule=result.schedule)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return (f"step {self._steps}: {len(self.actions)} actions, overhead {self._overhead:.4f}, "
                f"feasible {self._feasible}, decision op {self._op}, deficit {self._deficit:.0f} B")


__all__ = ["FEATURES", "DynamicState", "SwapRecomputeEnv"]
