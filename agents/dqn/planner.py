"""Planners that use a trained agent, with the baselines' interface.

* ``dqn`` (:class:`DQNPlanner`): greedy decoding of the learned Q-values -- at
  every decision point take the valid action node of highest Q, until the
  plan fits (or nothing can help).  No search: this is the agent's plan.
  ``decode="cover"`` (ours) reads Q once per decision point and takes the
  valid actions of the best one's kind in decreasing Q until their bytes
  cover the memory missing there and over the next ``COVER_AHEAD_OPS`` ops
  (:func:`cover_episode`);
  ``"auto"`` (the default) uses it on graphs of at least
  ``AUTO_COVER_NODES`` action nodes: on large graphs it plans several times faster than
  greedy decoding at about its overhead, while on small graphs greedy decoding, the agent's
  own plan, wins more cells (``benchmarks/bench_dqn.py plan-time`` and ``grid --decode cover``;
  docs/results.md, "Planning time on a large graph").
* ``dqn-search`` (:class:`DQNSearchPlanner`): a separate planner that puts a
  small search on top: at every decision point it tries the ``k`` actions of
  highest Q in the simulator and keeps the one with the best one-step
  lookahead (simulated reward plus the best Q of the state it leads to); it
  polishes that plan and the greedy one by local search in the simulator
  (drop, flip, shift or replace actions while the plan gets faster,
  :mod:`dqn_swap.agents.local_search`; a budget of simulations,
  ``polish_simulations``, by default scaled to the trace, so that a plan is the
  same on any machine; ``polish=False`` turns it off, and ``dqn`` takes
  ``polish=True``) and returns the faster.  Polishing is ours, not the paper's: on the
  held-out test families it brings ``dqn-search`` to or below the best baseline in more
  cells, and the best baseline's plan polished the same way seldom beats it (docs/results.md,
  "Networks never seen: the test families").  The same lookahead
  (:func:`search_episode`) improves the demonstrations during training
  (``DQNConfig.demo_improve="search"``), as search improves the policy in
  expert iteration: the greedy agent learns what search with its own Q finds.

Both load an agent file (default the shipped agent, ``checkpoints/default.pt``) and build
the same environment the agent was trained in; every figure comes from the
simulator.  ``dqn_swap.agents`` registers them under ``dqn`` and ``dqn-search``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dqn_swap.agents import AUTO_COVER_NODES, DQN_DECODINGS
from dqn_swap.cost import DeviceProfile
from dqn_swap.limits import plan_bytes
from dqn_swap.plan import Plan
from dqn_swap.planner_options import checked_seconds, renamed_setting
from dqn_swap.planners import plan_cost
from dqn_swap.progress import Progress, progress
from dqn_swap.trace import Trace
from dqn_swap.checkpoints import path as shipped_agent
from dqn_swap.limits import LimitSpec
from dqn_swap.env.swap_recompute import SwapRecomputeEnv

from ..local_search import polish
from .agent_file import ensemble_training, load_agent, load_ensemble
from .config import DQNConfig
from .demonstrations import DemoStep
from .policy import GraphBatcher, QEnsemble, QNetwork, q_values

DEFAULT_AGENT = shipped_agent("default.pt")  # installed with the package (dqn_swap.checkpoints)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` intra-op threads (default 1), then restore torch's setting.

    The graphs are small (hundreds to ~10^4 nodes, p = 32): one thread is as
    fast as several on an idle machine, and several threads spin and thrash
    on a busy one (3-5x slower measured beside two other jobs on two cores).

    Off the main thread (``autoplan(..., planning="background")`` plans on a worker) torch's
    setting is left alone: it is the process's, and the training thread's kernels, whose float
    sums depend on the number of threads, would run with it meanwhile.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(int(n or 1), 1))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def make_env(trace: Trace, memory_limit: LimitSpec, profile: str | DeviceProfile | None,
             config: DQNConfig, **kwargs: Any) -> SwapRecomputeEnv:
    """The environment an agent with ``config`` was trained in."""
    return SwapRecomputeEnv(trace, memory_limit, profile, graph=config.graph,
                            infeasible_penalty=config.infeasible_penalty,
                            invalid_penalty=config.invalid_penalty,
                            recompute_chains=config.recompute_chains, max_chain=config.max_chain,
                            swap_slack=config.swap_slack, reward=config.reward, **kwargs)


@torch.no_grad()
def greedy_q(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv) -> np.ndarray:
    """Q of every node of ``env``'s current state (invalid nodes ``-inf``)."""
    key = batcher.register(env.graph)
    st = env.state()
    q, _, _ = q_values(net, batcher, [(key, st)])
    q = q.numpy().astype(np.float64)
    q[~st.valid] = -np.inf
    return q


#: How many ops past the decision point ``cover`` decoding looks (see :func:`cover_episode`).
COVER_AHEAD_OPS = 40


#: A decoding rule: from the Q-values of the current state and their order (decreasing Q, ties by
#: node), the action to take (an ``int``: :meth:`SwapRecomputeEnv.step`) or the batch of actions
#: (a ``list``: :meth:`SwapRecomputeEnv.step_many`, one simulation for the lot).
Rule = Callable[[np.ndarray, np.ndarray], "int | list[int]"]


@torch.no_grad()
def drive(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv, rule: Rule,
          q: np.ndarray | None = None) -> tuple[float, int]:
    """The episode driver of the decodings: from ``env``'s current state (Q-values ``q``, read if not
    given), take what ``rule`` picks, read Q again, until the episode ends.  Returns the episode's
    return and its steps (actions taken).  The lookaheads (:func:`search_episode`,
    :func:`search_cover_episode`) try several picks in the simulator before taking one, and finish
    by this driver where their time runs out."""
    ret, steps = 0.0, 0
    q = greedy_q(net, batcher, env) if q is None else q
    while True:
        picked = rule(q, np.argsort(-q, kind="stable"))
        if isinstance(picked, list):
            r, done = env.step_many(picked)
            steps += len(picked)
        else:
            _, r, term, trunc, _ = env.step(int(picked))
            done, steps = term or trunc, steps + 1
        ret += r
        if done:
            return ret, steps
        q = greedy_q(net, batcher, env)


def greedy_rule(q: np.ndarray, order: np.ndarray) -> int:
    """Greedy decoding's rule: the valid action of highest Q."""
    return int(order[0])


def cover_rule(env: SwapRecomputeEnv, ahead: int = COVER_AHEAD_OPS, one_kind: bool = True) -> Rule:
    """``cover`` decoding's rule (:func:`cover_episode`): "do nothing" where it is the best action,
    else the batch :func:`cover_batch` makes."""
    def rule(q: np.ndarray, order: np.ndarray) -> int | list[int]:
        best = int(order[0])
        if env.graph.kind[best] == 0:  # do nothing (the only valid action)
            return best
        return cover_batch(env, q, order, ahead=ahead, one_kind=one_kind)

    return rule


@torch.no_grad()
def greedy_episode(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv) -> dict[str, Any]:
    """Run one episode taking the argmax-Q valid action each step; returns its summary."""
    env.reset(seed=0)
    return episode_summary(env, *drive(net, batcher, env, greedy_rule))


@torch.no_grad()
def cover_episode(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv,
                  ahead: int = COVER_AHEAD_OPS, one_kind: bool = True) -> dict[str, Any]:
    """Greedy decoding that takes several actions per decision point.

    At each decision point Q is read once and the valid actions of the best
    one's kind (all swaps or all removals) are taken in decreasing Q until their
    bytes cover what is missing, and the simulator runs once for the lot
    (:func:`cover_batch` with ``one_kind``).  Same Q-values and order of
    preference as :func:`greedy_episode`; what it skips is re-reading Q (and
    re-simulating) between actions the coming ops call for anyway.

    One kind a batch (ours): an action of the other kind waits for the next read
    of Q, as in greedy decoding, where the Q of the actions left moves after each
    one taken.  Batches that mixed kinds took removals greedy decoding does not
    take: on the comparison grid's 100-step LSTM (6,863 ops) the shipped ensemble
    planned 0.078-0.50 of overhead at 90/70/50/30 % where greedy decoding and
    window scheduling plan 0-0.0056; with one kind a batch it plans 0-0.0053
    (docs/learning.md, "Decoding large graphs").  ``one_kind=False``: batches
    in Q order whatever the kind, which ``dqn-search`` keeps for the agent's
    plan it polishes (its lookahead and local search judge that plan in the
    simulator; its figures in docs/results.md were measured with such batches).
    """
    env.reset(seed=0)
    return episode_summary(env, *drive(net, batcher, env, cover_rule(env, ahead, one_kind)))


def cover_batch(env: SwapRecomputeEnv, q: np.ndarray, order: np.ndarray, first: int | None = None,
                ahead: int = COVER_AHEAD_OPS, one_kind: bool = False) -> list[int]:
    """The actions ``cover`` decoding takes at the current decision point: valid actions in the
    order ``order`` (decreasing Q), ``first`` first if given, until their bytes cover what is
    missing.  "What is missing" is the larger of the deficit at the decision point and the most
    any of the next ``ahead`` ops lacks under the simulator's instant-swap memory need; once the
    decision point itself is covered, actions whose tensor comes back within those ops are
    skipped (they do not help the ops ahead).  ``ahead=0`` covers the decision point only.
    ``one_kind``: only actions of the first one's kind (``cover`` decoding); the lookahead of
    :func:`search_cover_episode` mixes kinds, since its simulations judge each batch."""
    g = env.graph
    nbytes = env.trace.tensor_nbytes
    here = env.deficit_bytes
    need = max(here, env.deficit_ahead(ahead))
    horizon = env.decision_op + ahead
    freed, picked, tensors = 0.0, [], set()
    seq = order.tolist() if first is None else [int(first)] + [a for a in order.tolist() if a != first]
    for a in seq:
        if not np.isfinite(q[a]) or freed >= need and picked:
            break
        if one_kind and picked and g.kind[a] != g.kind[picked[0]]:
            continue
        t = int(g.tensor[a])
        if t in tensors or (freed >= here and picked and g.reuse_op[a] <= horizon):
            continue
        tensors.add(t)
        picked.append(a)
        freed += float(nbytes[t])
    return picked


def episode_summary(env: SwapRecomputeEnv, ret: float, steps: int) -> dict[str, Any]:
    res = env.result
    return {"return": float(ret), "overhead": float(res.overhead), "feasible": bool(res.feasible),
            "penalty": float(env._penalty), "peak_bytes": int(res.peak_bytes), "steps": steps,
            "n_swap": sum(a.kind == 0 for a in env.actions),
            "n_recompute": sum(a.kind == 1 for a in env.actions)}


@torch.no_grad()
def search_episode(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv, k: int,
                   reward_scale: float, on_step: Callable[[int], bool] | None = None) -> list[DemoStep]:
    """One episode with a top-``k`` one-step lookahead: at every decision point each of the ``k``
    valid actions of highest Q is tried in the simulator and scored by its reward (times
    ``reward_scale``, as the learner sees rewards) plus the best Q of the state it leads to; the
    best is taken.  Returns the episode's transitions (``dqn-search`` plans with it, and training
    with ``demo_improve="search"`` keeps it as a demonstration where it beats the current one).

    The state the best action leads to, and its Q-values, are the ones its trial computed: a
    decision point costs ``k`` simulations and ``k`` network passes, not ``k + 1`` of each.
    ``on_step(steps)``, called after every step, may return True to stop looking ahead: the rest of
    the episode is then decoded as :func:`cover_episode` does (a planner's time budget)."""
    env.reset(seed=0)
    state, steps, done = env.state(), [], False
    q = greedy_q(net, batcher, env)
    while not done:
        order = [int(i) for i in np.argsort(-q, kind="stable")[:k] if np.isfinite(q[i])]
        best, best_score, taken = order[0], -np.inf, None
        if len(order) > 1:
            for a in order:
                r, term, trunc, next_q, after = _peek(net, batcher, env, a)
                score = r * reward_scale + (0.0 if term or trunc else float(np.max(next_q)))
                if score > best_score:
                    best, best_score, taken = a, score, (r, term, trunc, next_q, after)
        if taken is None:
            _, r, term, trunc, _ = env.step(best)
            next_q = None if term or trunc else greedy_q(net, batcher, env)
        else:
            r, term, trunc, next_q, after = taken
            env.restore(after)
        next_state = env.state()
        steps.append(DemoStep(state, best, float(r), next_state, bool(term), bool(trunc)))
        state, done = next_state, term or trunc
        if not done:
            q = next_q
            if on_step is not None and on_step(len(steps)):
                _finish_by_cover(net, batcher, env, q)
                break
    return steps


def _peek(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv, a: int
          ) -> tuple[float, bool, bool, np.ndarray | None, tuple]:
    """Take ``a`` and come back: its simulated reward, whether it ends the episode (terminated,
    truncated), the Q-values after it (None when it ends) and the state it leads to
    (:meth:`SwapRecomputeEnv.snapshot`); ``env`` is left unchanged."""
    saved = env.snapshot()
    _, r, term, trunc, _ = env.step(a)
    next_q = None if (term or trunc) else greedy_q(net, batcher, env)
    after = env.snapshot()
    env.restore(saved)
    return r, term, trunc, next_q, after


def _finish_by_cover(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv, q: np.ndarray) -> None:
    """Decode the rest of ``env``'s episode as :func:`cover_episode` does (batches in Q order whatever
    their kind), from Q-values ``q`` of the current state."""
    drive(net, batcher, env, cover_rule(env, one_kind=False), q)


@torch.no_grad()
def search_cover_episode(net: QNetwork, batcher: GraphBatcher, env: SwapRecomputeEnv, k: int,
                         reward_scale: float, ahead: int = COVER_AHEAD_OPS,
                         on_step: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """The top-``k`` lookahead of :func:`search_episode` over :func:`cover_episode`'s batches: at
    every decision point each of the ``k`` valid actions of highest Q leads a batch, itself and then
    the actions ``cover`` decoding would add to cover what is missing (:func:`cover_batch`); each
    batch is simulated once and scored by its reward (times ``reward_scale``) plus the best Q of
    the state it leads to, and the best batch is taken.  A decision point costs ``k`` simulations
    and ``k`` network passes, and there are as many as ``cover`` decoding has (far fewer than
    actions on large graphs), so its cost grows with the events about as ``cover`` decoding's
    does, where the action-by-action lookahead does ``k + 1`` of each per action.  Ours (the DQN
    paper decodes one action at a time, section 4.9).  ``on_step`` as in :func:`search_episode`."""
    env.reset(seed=0)
    g = env.graph
    ret, steps, decisions, done = 0.0, 0, 0, False
    q = greedy_q(net, batcher, env)
    while not done:
        order = np.argsort(-q, kind="stable")
        best = int(order[0])
        if g.kind[best] == 0:  # do nothing (the only valid action)
            _, r, term, trunc, _ = env.step(best)
            ret, steps, done = ret + r, steps + 1, term or trunc
            continue
        cands = [int(a) for a in order[:k] if np.isfinite(q[a])]
        saved = env.snapshot()
        best_score, taken = -np.inf, None
        for a in cands:
            batch = cover_batch(env, q, order, first=a, ahead=ahead)
            r, ends = env.step_many(batch)
            next_q = None if ends else greedy_q(net, batcher, env)
            score = r * reward_scale + (0.0 if ends else float(np.max(next_q)))
            if score > best_score:
                best_score, taken = score, (r, ends, next_q, env.snapshot(), len(batch))
            env.restore(saved)
        r, done, next_q, after, n = taken
        env.restore(after)
        ret, steps, decisions = ret + r, steps + n, decisions + 1
        if not done:
            q = next_q
            if on_step is not None and on_step(steps):
                _finish_by_cover(net, batcher, env, q)
                break
    return episode_summary(env, ret, steps) | {"decisions": decisions}


class DQNPlanner:
    """``plan(trace, memory_limit, profile) -> Plan`` by greedy decoding of a trained agent."""

    name = "dqn"

    #: Whether :meth:`plan` improves the decoded plan by local search (:mod:`..local_search`).
    polish_default = False

    def __init__(self, agent_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None, *,
                 threads: int | None = None, recompute_chains: bool | None = None, decode: str = "auto",
                 polish: bool | None = None, polish_simulations: int | None = None,
                 polish_seconds: float | None = None, members: bool = False,
                 more_agents: Sequence[str | os.PathLike[str]] = ()) -> None:
        """``agent_path``: an agent file (default the shipped agent), or a list of two or more that
        plan in the same environment: their ensemble, decoded by the mean of their Q-values
        (:class:`~dqn_swap.agents.dqn.policy.QEnsemble`).

        ``members`` (an ensemble, or with ``more_agents``; ours): also decode with every member's own
        Q-values and keep the plan of least simulated overhead that fits (the mean's on a tie):
        ``K + 1`` greedy passes and as many simulations, no search over actions.  Members that
        differ only by their seed disagree most where memory is tight (the shipped ten on a test
        squeeze-excitation CNN at 30 %: overheads from 0.075 to 0.528, their mean 0.288), and the
        mean of their Q-values does not pick the best of them; the simulator does, as it is the
        ruler of every plan.
        ``more_agents`` (with ``members`` only): more agent or ensemble files, each decoded the same
        way in its own environment (agents of another ``max_chain``, say, which no ensemble can
        join), their plans in the running too.  Measured in docs/learning.md ("Ensembles")."""
        if decode not in DQN_DECODINGS:
            raise ValueError(f"unknown decoding {decode!r}; choose one of: {', '.join(DQN_DECODINGS)}")
        self.decode = decode
        if isinstance(agent_path, (list, tuple)):
            self.agent_path: Path | list[Path] = [Path(p) for p in agent_path]
            self.net, self.config, ckpts = load_ensemble(self.agent_path)
            ckpt = {"training": ensemble_training(ckpts, [str(p) for p in self.agent_path])}  # as an ensemble file's
        else:
            self.agent_path = Path(agent_path) if agent_path is not None else DEFAULT_AGENT
            self.net, self.config, ckpt = load_agent(self.agent_path)
        def own(config: DQNConfig) -> DQNConfig:  # recompute_chains: plan in another environment than the agent's
            return config if recompute_chains is None else config.replace(recompute_chains=bool(recompute_chains))

        self.config = own(self.config)
        self.training = ckpt.get("training", {})
        self.threads = threads
        self.polish = self.polish_default if polish is None else bool(polish)
        # the local search's budget: simulations (None: scaled to the trace), and an optional time cap
        self.polish_simulations = polish_simulations
        self.polish_seconds = polish_seconds
        self.members = bool(members)
        self.more_agents = [Path(p) for p in more_agents]
        if self.more_agents and not self.members:
            raise ValueError("more agent files are planned only when decoding by members (members=True, --members)")
        if self.members and not isinstance(self.net, QEnsemble) and not self.more_agents:
            raise ValueError(f"decoding by members needs an ensemble (an ensemble file such as "
                             f"checkpoints/ensemble.pt, or two or more agent files); {self.agent_path} is one agent")
        #: (label, network, config) of every agent file decoded by members: the first is agent_path
        first = "+".join(map(str, self.agent_path)) if isinstance(self.agent_path, list) else str(self.agent_path)
        self.portfolio: list[tuple[str, QNetwork | QEnsemble, DQNConfig]] = [(first, self.net, self.config)]
        for path in self.more_agents:
            net, config, _ = load_agent(path)
            self.portfolio.append((str(path), net, own(config)))

    def _settings(self, config: DQNConfig | None = None, **extra: Any) -> dict[str, Any]:
        agent = [str(p) for p in self.agent_path] if isinstance(self.agent_path, list) else str(self.agent_path)
        config = config or self.config
        return {"agent": agent, "graph": config.graph,
                "recompute_chains": config.recompute_chains,
                **({"max_chain": config.max_chain} if config.max_chain != 1 else {}),
                **({"more_agents": [str(p) for p in self.more_agents]} if self.more_agents else {}), **extra}

    #: Greedy decoding reads only observations, and those do not depend on how an
    #: unfinished plan is charged: the simulator may stop at the first excess (faster).
    decode_reward: str | None = "accrued"

    def _env(self, trace: Trace, memory_limit: int, profile: Any, config: DQNConfig | None = None) -> SwapRecomputeEnv:
        config = config or self.config
        if isinstance(profile, str) or profile is None or isinstance(profile, DeviceProfile):
            config = config.replace(reward=self.decode_reward) if self.decode_reward else config
            return make_env(trace, int(memory_limit), profile, config)
        raise TypeError(f"profile must be a name or a DeviceProfile, not {type(profile).__name__}")

    def plan(self, trace: Trace, memory_limit: int, profile: str | DeviceProfile | None = None) -> Plan:
        memory_limit = plan_bytes(memory_limit, f"planner {self.name!r}")
        t0 = time.perf_counter()
        with torch_threads(self.threads):
            if self.members:
                env, plan = self._best_of_members(trace, memory_limit, profile)
            else:
                env = self._env(trace, memory_limit, profile)
                decode, episode = self._decoding(env)
                summary = episode(self.net, GraphBatcher(), env)
                plan = env.plan(self.name, self._settings(steps=summary["steps"], decode=decode))
        plan = self._polished(env, plan)
        plan.settings["plan_seconds"] = round(time.perf_counter() - t0, 3)
        return plan

    def _decoding(self, env: SwapRecomputeEnv) -> tuple[str, Callable[..., dict[str, Any]]]:
        """The decoding for ``env`` (``auto`` resolved by the size of its graph) and its episode."""
        decode = self.decode
        if decode == "auto":
            decode = "cover" if len(env.graph.action_nodes) >= AUTO_COVER_NODES else "greedy"
        return decode, cover_episode if decode == "cover" else greedy_episode

    def _best_of_members(self, trace: Trace, memory_limit: int, profile: Any) -> tuple[SwapRecomputeEnv, Plan]:
        """Every agent file of :attr:`portfolio` decoded in its own environment, by its mean (an
        ensemble) and by each of its members; the plan that fits with the least simulated overhead,
        the earlier on a tie, and the environment that made it.  ``settings["decoded_by"]``: the
        agent file and ``"mean"`` or the member's index; ``settings["member_overheads"]``: per agent
        file, the overheads of the mean and of each member (None: did not fit)."""
        best: tuple[SwapRecomputeEnv, Plan] | None = None
        overheads: dict[str, list[float | None]] = {}
        by: dict[str, Any] = {}
        n_members = 0
        for label, net, config in self.portfolio:
            env = self._env(trace, memory_limit, profile, config)
            decode, episode = self._decoding(env)
            batcher = GraphBatcher()
            members = list(net.members) if isinstance(net, QEnsemble) else []
            nets: list[tuple[str | int, Any]] = [("mean" if members else "agent", net), *enumerate(members)]
            n_members += len(members) or 1
            overheads[label] = []
            for who, q in nets:
                summary = episode(q, batcher, env)
                plan = env.plan(self.name, self._settings(config, steps=summary["steps"], decode=decode))
                overheads[label].append(round(float(plan.figures["overhead"]), 6) if plan.figures.get("feasible")
                                        else None)
                if best is None or plan_cost(plan) < plan_cost(best[1]):
                    best, by = (env, plan), {"agent": label, "member": who}
        assert best is not None
        best[1].settings.update(members=n_members, decoded_by=by, member_overheads=overheads)
        return best

    def _polished(self, env: SwapRecomputeEnv, plan: Plan, show: Progress | None = None, label: str = "polishing",
                  deadline: Callable[[], bool] | None = None) -> Plan:
        """``plan`` improved by :func:`~dqn_swap.agents.local_search.polish` if this planner polishes
        and the plan fits (the simulator's figures and schedule are those of the polished plan)."""
        if not self.polish or not plan.figures.get("feasible"):
            return plan
        res = polish(env.sim, list(plan.actions), max_simulations=self.polish_simulations,
                     max_seconds=self.polish_seconds, progress=show, label=label, deadline=deadline)
        settings = dict(plan.settings, polish={"dropped": res.dropped, "flipped": res.flipped,
                                               "moved": res.moved, "simulations": res.simulations,
                                               "need_checks": res.need_checks, "rejected": res.rejected,
                                               "last_improvement": res.last_improvement, "stopped": res.stopped,
                                               "seconds": round(res.seconds, 3),
                                               "overhead_before": plan.figures.get("overhead")})
        return dataclasses.replace(plan, actions=Plan.sorted_actions(res.actions), settings=settings,
                                   figures=res.result.figures(), schedule=res.result.schedule)


#: ``dqn-search``'s default time budget (wall-clock seconds for one plan; :class:`DQNSearchPlanner`).
DEFAULT_TIME_LIMIT = 30.0


class DQNSearchPlanner(DQNPlanner):
    """Greedy decoding plus a top-``k`` one-step lookahead in the simulator (a separate planner).

    ``decode``: ``"greedy"`` looks ahead one action at a time (:func:`search_episode`) and polishes
    it and the agent's greedy plan; ``"cover"`` looks ahead over ``cover`` decoding's batches
    (:func:`search_cover_episode`) and polishes it and the agent's ``cover`` plan; ``"auto"`` (the
    default) takes ``cover`` on graphs of at least ``AUTO_COVER_NODES`` action nodes, where one
    action at a time costs ``k + 1`` simulations of the whole trace per action (minutes on
    ResNet-1001).

    ``time_limit``: wall-clock seconds for the whole plan (None: no limit; ``time_budget``, its
    former name, is still taken, with a ``DeprecationWarning``).  The budget of
    simulations stays the search's own stop, so a plan that is made within the time is the same
    on every machine; where the time runs out, the lookahead finishes its episode by ``cover``
    decoding, the first polish gets half of the time left and the second the rest, and the best
    plan found by then is returned (``settings["cut_by_time"]`` names the stages cut short:
    ``lookahead``, ``search`` and the decoding's name for the two polishes).
    """

    name = "dqn-search"
    decode_reward = None  # the lookahead adds rewards to Q-values: charge them as in training
    polish_default = True

    def __init__(self, agent_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None, *,
                 k: int = 4,
                 threads: int | None = None, recompute_chains: bool | None = None, polish: bool | None = None,
                 polish_simulations: int | None = None, polish_seconds: float | None = None,
                 decode: str = "auto", time_limit: float | None = DEFAULT_TIME_LIMIT,
                 time_budget: float | None = None) -> None:
        super().__init__(agent_path, threads=threads, recompute_chains=recompute_chains, polish=polish,
                         polish_simulations=polish_simulations, polish_seconds=polish_seconds, decode=decode)
        self.k = int(k)
        if time_budget is not None:
            time_limit = renamed_setting("time_budget", "time_limit", time_budget)
        self.time_limit = checked_seconds("dqn-search", "time_limit", time_limit)

    def plan(self, trace: Trace, memory_limit: int, profile: str | DeviceProfile | None = None) -> Plan:
        memory_limit = plan_bytes(memory_limit, f"planner {self.name!r}")
        t0 = time.perf_counter()
        end = t0 + self.time_limit if self.time_limit is not None else np.inf
        cut: list[str] = []  # the stages the time budget cut short

        def late() -> bool:
            return time.perf_counter() >= end

        batcher = GraphBatcher()
        env = self._env(trace, memory_limit, profile)
        decode, _ = self._decoding(env)
        with progress(self.name) as show, torch_threads(self.threads):
            def looked(steps: int) -> bool:
                show(lambda: f"lookahead, {steps:,} actions, decision op {env.decision_op:,} of {trace.n_ops:,}")
                if late():
                    cut.append("lookahead")
                    return True
                return False

            if decode == "cover":
                search_cover_episode(self.net, batcher, env, self.k, self.config.reward_scale, on_step=looked)
            else:
                search_episode(self.net, batcher, env, self.k, self.config.reward_scale, on_step=looked)
            search_plan = env.plan(self.name, self._settings(k=self.k, decode=decode, decoded="search"))
            show(f"{decode} decoding")
            if decode == "cover":
                cover_episode(self.net, batcher, env, one_kind=False)
            else:
                greedy_episode(self.net, batcher, env)
            greedy_plan = env.plan(self.name, self._settings(k=self.k, decode=decode, decoded=decode))
            # Both decoded plans are polished and the faster kept: on the grid the greedy plan polished is
            # sometimes the better one though the search plan was better before (ResNet-50 at 70 %:
            # 0.0093 against 0.0121, benchmarks/results/polish_grid.json).  The first may take half of
            # the time left, the second the rest.
            half = (time.perf_counter() + end) / 2
            candidates = [self._polished(env, search_plan, show, "polishing the lookahead's plan (1 of 2)",
                                         lambda: time.perf_counter() >= half),
                          self._polished(env, greedy_plan, show, f"polishing the {decode} plan (2 of 2)", late)]
            plan = min(candidates, key=plan_cost)
            show.close(lambda: f"done, overhead {plan.figures.get('overhead', np.nan):.4f}")
        cut += [p.settings["decoded"] for p in candidates if p.settings.get("polish", {}).get("stopped") == "time"]
        plan.settings.update(plan_seconds=round(time.perf_counter() - t0, 3), time_limit=self.time_limit,
                             cut_by_time=cut)
        return plan


def teacher_planner(spec: str) -> Any:
    """The planner ``demo_teacher`` names (:class:`~dqn_swap.agents.dqn.config.DQNConfig`): agent
    files, comma-separated, decoded by members (an ensemble's mean and each of its agents, every
    further file in its own environment; the simulator keeps the fastest plan); a single agent file
    alone is decoded greedily.  Raises :class:`~dqn_swap.agents.dqn.agent_file.AgentFileError`
    naming a file that does not load."""
    files = [s.strip() for s in spec.split(",") if s.strip()]
    if not files:
        raise ValueError(f"DQN setting demo_teacher names no agent file: {spec!r}")
    first = DQNPlanner(files[0])
    if len(files) == 1 and not isinstance(first.net, QEnsemble):
        return first
    return DQNPlanner(files[0], members=True, more_agents=files[1:])
