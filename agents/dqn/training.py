"""One training run of :func:`~.algorithm.train`, in named phases.

:class:`Training` holds what the phases share (the environments, the Q-network and its target,
the optimiser, the replay buffer, the evaluations) and runs them in order:

1. :meth:`~Training.setup`: seeding, one environment per (trace, limit), the networks (from
   ``init_from`` when fine-tuning), the replay memory;
2. :meth:`~Training.resume`: the state of an earlier run, from its resume file;
3. :meth:`~Training.baselines`: the agents to beat evaluated as step 0 (``reference``, and the
   starting agent of a fine-tuning run);
4. :meth:`~Training.demonstrate`: DQfD's demonstrations and their pre-training, where configured;
5. :meth:`~Training.learn`: Algorithm 1, the loop (explore, store, fit, evaluate);
6. :meth:`~Training.save`: the best greedy agent to the output file.

The side concerns (TensorBoard, the progress bar, plain lines) are callbacks
(:mod:`.callbacks`), called at the same points whatever the run.  The whole loop on one page, as
CleanRL writes it, is :mod:`.reference_loop`; a test checks that both train the same agent.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dqn_swap.stop import check as check_stop
from dqn_swap.cost import DeviceProfile
from dqn_swap.env.swap_recompute import SwapRecomputeEnv
from dqn_swap.limits import LimitSpec
from dqn_swap.trace import Trace

from .agent_file import (ENVIRONMENT_FIELDS, AgentFileError, environment_difference, load_agent, load_resume,
                         resume_path, save_agent, save_resume, save_trained_ensemble)
from .buffer import NStepAccumulator, ReplayBuffer
from .callbacks import TensorBoardLog, TrainingCallback, progress_callbacks
from .config import DQNConfig
from .fitting import evaluate, learning_rate_at, linear_schedule, make_envs, mismatch, td_update
from .planner import episode_summary, make_env
from .policy import GraphBatcher, QEnsemble, QNetwork, q_values


class Training:
    """One run: its state and its phases (module docstring); :meth:`run` calls them in order."""

    def __init__(self, traces: Trace | Sequence[Trace], memory_limits: LimitSpec | Sequence[LimitSpec],
                 out_path: Path, config: DQNConfig, *, profile: str | DeviceProfile | None,
                 init_from: str | os.PathLike[str] | None, reference: str | os.PathLike[str] | None,
                 command: str | None) -> None:
        self.traces, self.memory_limits, self.profile = traces, memory_limits, profile
        self.out_path, self.config, self.init_from, self.reference = out_path, config, init_from, reference
        self.command = command
        self.callbacks: list[TrainingCallback] = []
        self.demos: _Demonstrations | None = None

    # ------------------------------------------------------------------ side concerns
    def log(self, tag: str, value: float, step: int) -> None:
        for c in self.callbacks:
            c.on_scalar(tag, value, step)

    def open_logs(self, log_dir: str | os.PathLike[str] | None, run_name: str | None, progress: bool | None,
                  writers: list[Any] | None) -> None:
        """TensorBoard under ``log_dir/run_name`` (None: none) and the progress display; ``writers``
        collects what must be closed if the run fails."""
        if log_dir is not None:
            run_name = run_name or f"{self.out_path.stem}__s{self.config.seed}__{int(time.time())}"
            board = TensorBoardLog(log_dir, run_name)
            self.callbacks.append(board)
            if writers is not None:
                writers.append(board)
            board.on_text("config", "|param|value|\n|-|-|\n" + "\n".join(
                f"|{k}|{v}|" for k, v in self.config.to_dict().items()))
        self.callbacks += progress_callbacks(progress, self.config.total_timesteps, self.start_step, self.t_start)

    # ------------------------------------------------------------------ phases
    def setup(self) -> None:
        """Seeding, the environments (one per trace and limit), the networks and the replay memory."""
        config = self.config
        self.t_start = time.perf_counter()
        self.rng = np.random.default_rng(config.seed)
        torch.manual_seed(config.seed)
        self.envs = make_envs(self.traces, self.memory_limits, self.profile, config)
        self.eval_envs = [make_env(e.trace, e.memory_limit, e.profile, config, simulator=e.sim, action_graph=e.graph)
                          for e in self.envs]  # same simulator and graph; their own episode state
        for e, ev_env in zip(self.envs, self.eval_envs):
            ev_env.name = e.name
        self.fingerprints = sorted({e.trace.fingerprint for e in self.envs})
        self.batcher = GraphBatcher()
        self.keys = [self.batcher.register(e.graph) for e in self.envs]
        self.q_net, self.ensemble_obj = self._network()
        self.target_net = copy.deepcopy(self.q_net)
        self.optimizer = torch.optim.Adam(self.q_net.parameters(), lr=config.learning_rate)
        self.rb = ReplayBuffer(config.buffer_size, self.rng, config.prioritized, config.per_alpha)
        self.nstep = NStepAccumulator(config.n_step, config.gamma)
        self.start_step, self.evaluations, self.best = 0, [], {"score": np.inf}
        self.best_state = copy.deepcopy(self.q_net.state_dict())
        self.rpath = resume_path(self.out_path)

    def _network(self) -> tuple[QNetwork | QEnsemble, Any]:
        """A new Q-network, or ``init_from``'s (an ensemble's mean is what is trained: its file dict too)."""
        q_net: QNetwork | QEnsemble = QNetwork(self.config)
        if self.init_from is None:
            return q_net, None
        src, src_config, src_obj = load_agent(self.init_from)
        if isinstance(src, QEnsemble):
            # ours: the mean of the members' Q-values is the network fitted, so the plan trained
            # is the one the ensemble's one-pass decoding makes (docs/learning.md, "Fine-tuning an ensemble")
            differ = environment_difference(src_config, self.config, (*ENVIRONMENT_FIELDS, "swap_slack"))
            if differ:
                raise AgentFileError(f"{self.init_from}: its agents plan in another environment than this "
                                     f"configuration ({differ})")
            return src.train(), src_obj
        try:
            q_net.load_state_dict(src.state_dict())
        except RuntimeError:
            raise AgentFileError(f"{self.init_from}: its network does not match this configuration") from None
        return q_net, None

    def resume(self) -> None:
        """Continue the run its resume file holds (weights, optimiser, step, random state)."""
        if not self.rpath.exists():
            raise AgentFileError(f"{self.rpath}: no resume file to continue from")
        r = load_resume(self.rpath)
        if r.get("config") != self.config.to_dict() or r.get("trace_fingerprints") != self.fingerprints:
            raise AgentFileError(f"{self.rpath}: was made with another configuration or other traces")
        self.q_net.load_state_dict(r["q"])
        self.target_net.load_state_dict(r["target"])
        self.optimizer.load_state_dict(r["optimizer"])
        self.best_state, self.best, self.evaluations = r["best_state"], dict(r["best"]), list(r["evaluations"])
        self.start_step = int(r["global_step"])
        torch.set_rng_state(r["torch_rng"])
        self.rng.bit_generator.state = r["np_rng"]

    def evaluate_and_keep(self, step: int, phase: str | None = None) -> None:
        """Evaluate the greedy agent on every cell, keep its weights if it is the best so far, and
        write the resume file."""
        ev = evaluate(self.q_net, self.batcher, self.eval_envs)
        ev["step"] = step
        if phase:
            ev["phase"] = phase
        self.evaluations.append({k: v for k, v in ev.items() if k != "per_env"} |
                                {"per_env": {n: dict(d) for n, d in ev["per_env"].items()}})
        for tag in ("overhead", "peak_bytes", "feasible", "n_swap", "n_recompute"):
            self.log(f"plan/{tag}", ev[tag], step)
        self.log("plan/score", ev["score"], step)
        if ev["score"] < self.best["score"] - 1e-12:
            self.best = {"score": ev["score"], "step": step, "overhead": ev["overhead"], "feasible": ev["feasible"],
                         **({"phase": phase} if phase else {})}
            self.best_state = copy.deepcopy(self.q_net.state_dict())
        save_resume(self.rpath, {"global_step": step, "q": self.q_net.state_dict(), "target": self.target_net.state_dict(),
                                 "optimizer": self.optimizer.state_dict(), "best_state": self.best_state,
                                 "best": self.best, "evaluations": self.evaluations,
                                 "torch_rng": torch.get_rng_state(), "np_rng": self.rng.bit_generator.state,
                                 "config": self.config.to_dict(), "trace_fingerprints": self.fingerprints})
        for c in self.callbacks:
            c.on_evaluation(ev, self.best, step)

    def baselines(self) -> None:
        """The agents to beat, evaluated as step 0: ``reference`` (a run that does not beat it returns
        it) and, when fine-tuning, the starting agent (fine-tuning never returns a worse one)."""
        if self.reference is not None and self.start_step == 0:
            ref, ref_config, _ = load_agent(self.reference)
            why = mismatch(ref, ref_config, self.config)
            if why is not None or isinstance(self.q_net, QEnsemble):
                raise AgentFileError(f"{self.reference}: the reference agent cannot be compared: "
                                     f"{why or 'an ensemble is trained'}")
            own = copy.deepcopy(self.q_net.state_dict())
            self.q_net.load_state_dict(ref.state_dict())
            self.evaluate_and_keep(0, "reference")
            self.q_net.load_state_dict(own)
            self.target_net.load_state_dict(own)
        if self.init_from is not None and self.start_step == 0:
            self.evaluate_and_keep(0, "start")

    def demonstrate(self) -> None:
        """DQfD: the best baseline's replayed plan of every cell (``demonstrations="best-baseline"``) or
        the starting network's lookahead episode (``"self"``), kept for the whole run, and the
        pre-training on them alone; nothing with ``"none"``."""
        if self.config.demonstrations == "none":
            return
        self.demos = _Demonstrations(self)
        self.demos.pretrain()

    def learn(self) -> None:
        """Algorithm 1: explore epsilon-greedily, store n-step transitions, fit the Q-network on
        mini-batches, refresh the target, evaluate every ``eval_every`` steps."""
        config, rng, envs = self.config, self.rng, self.envs
        order = rng.permutation(len(envs))
        episode = 0

        def start_episode() -> tuple[SwapRecomputeEnv, int]:
            i = int(order[episode % len(envs)])
            envs[i].reset(seed=int(rng.integers(2**31)))
            return envs[i], self.keys[i]

        env, key = start_episode()
        state = env.state()
        ep_return, ep_len, sps_t, sps_step = 0.0, 0, time.perf_counter(), self.start_step
        duration = config.exploration_fraction * config.total_timesteps
        demo_rb = None
        for global_step in range(self.start_step, config.total_timesteps):
            # A signal whose exception was lost stops the run here, at its next step, not at its next
            # evaluation (dqn_swap.stop): one under a loaded test suite ran on 60 s after SIGTERM.
            check_stop()
            epsilon = linear_schedule(config.start_e, config.end_e, duration, global_step)
            valid_idx = np.flatnonzero(state.valid)
            if rng.random() < epsilon:
                action = int(rng.choice(valid_idx))
            else:
                with torch.no_grad():
                    q, _, _ = q_values(self.q_net, self.batcher, [(key, state)])
                qv = q.numpy()
                action = int(valid_idx[np.argmax(qv[valid_idx])])
            _, reward, terminated, truncated, _ = env.step(action)
            next_state = env.state()
            for tr in self.nstep.push(key, state, action, reward * config.reward_scale, key, next_state,
                                      terminated, truncated):
                self.rb.add(tr)
            ep_return += reward
            ep_len += 1
            state = next_state
            if terminated or truncated:
                summary = episode_summary(env, ep_return, ep_len)
                self.log("charts/episodic_return", ep_return, global_step)
                self.log("charts/episodic_length", ep_len, global_step)
                self.log("charts/episodic_overhead", summary["overhead"], global_step)
                episode += 1
                env, key = start_episode()
                state = env.state()
                ep_return, ep_len = 0.0, 0
                self.nstep.clear()

            demo_rb = self.demos.buffer if self.demos is not None else None
            if global_step >= config.learning_starts and global_step % config.train_frequency == 0 and len(self.rb):
                beta = config.per_beta + (1.0 - config.per_beta) * global_step / config.total_timesteps
                for group in self.optimizer.param_groups:  # constant unless lr_warmup or lr_decay
                    group["lr"] = learning_rate_at(config, global_step)
                loss, qmean, margin = td_update(self.q_net, self.target_net, self.batcher, self.rb, self.optimizer,
                                                config, beta, demo_rb)
                if global_step % 100 == 0:
                    self.log("losses/td_loss", loss, global_step)
                    if demo_rb is not None:
                        self.log("losses/margin_loss", margin, global_step)
                    self.log("losses/q_values", qmean, global_step)
                    self.log("charts/epsilon", epsilon, global_step)
                    now = time.perf_counter()
                    self.log("charts/SPS", (global_step - sps_step) / max(now - sps_t, 1e-9), global_step)
                    sps_t, sps_step = now, global_step
            if config.target_network and global_step % config.target_update == 0:
                self.target_net.load_state_dict(self.q_net.state_dict())
            if (global_step + 1) % config.eval_every == 0:
                self.evaluate_and_keep(global_step + 1)
                if not config.demo_improve_every and self.demos is not None:
                    self.demos.improve(global_step + 1)
            if config.demo_improve_every and (global_step + 1) % config.demo_improve_every == 0 \
                    and self.demos is not None:
                self.demos.improve(global_step + 1)
            for c in self.callbacks:
                c.on_step()
        if not self.evaluations or self.evaluations[-1]["step"] != config.total_timesteps:
            self.evaluate_and_keep(config.total_timesteps)

    def save(self, overwrite: bool) -> dict[str, Any]:
        """The best greedy agent (or ensemble) to the output file; returns what the file records of
        the run."""
        config = self.config
        self.q_net.load_state_dict(self.best_state)
        self.wall = time.perf_counter() - self.t_start
        training = {"steps": config.total_timesteps, "wall_time_s": round(self.wall, 1), "best": self.best,
                    "reference": str(self.reference) if self.reference is not None else None,
                    "environments": [e.name for e in self.envs],
                    "memory_limits": [int(e.memory_limit) for e in self.envs], "command": self.command or "",
                    "init_from": str(self.init_from) if self.init_from else None,
                    "demonstrations": self.demos.info if self.demos is not None else [],
                    "evaluations": [{k: v for k, v in e.items() if k != "per_env"} for e in self.evaluations]}
        if self.ensemble_obj is not None:
            save_trained_ensemble(self.out_path, self.q_net, self.ensemble_obj, trace_fingerprints=self.fingerprints,
                                  training=training, overwrite=overwrite)
        else:
            save_agent(self.out_path, self.q_net, config, trace_fingerprints=self.fingerprints, training=training,
                       overwrite=overwrite)
        return training

    def close(self) -> None:
        for c in self.callbacks:
            c.close()
        self.callbacks.clear()


class _Demonstrations:
    """DQfD's demonstrations of one run (Hester et al. 2018; :mod:`.demonstrations`): every cell's
    best plan as an episode, the replay memory holding them, and their improvement by search."""

    def __init__(self, run: Training) -> None:
        from .demonstrations import demonstrations, replay_nodes
        from .planner import teacher_planner

        self.run = run
        config = run.config
        if config.demonstrations == "self":
            self.episodes, self.info = self._own_search()
        else:
            teacher = teacher_planner(config.demo_teacher) if config.demo_teacher else None
            self.episodes, self.info = demonstrations(run.envs, teacher=teacher)
        self.rank = [(not d.get("replayed_feasible", False), d.get("replayed_overhead", np.inf)) for d in self.info]
        self.buffer = _demo_buffer(self.episodes, run.keys, config, run.rng)
        # each cell's demonstration as the actions its replay took (the plan local search polishes)
        self.actions = [replay_nodes(ev, [s.action for s in steps]) for ev, steps in zip(run.eval_envs, self.episodes)]
        self.dagger: list[list[Any]] = [[] for _ in run.envs]  # the student's states labelled by the teacher
        if config.demo_improve == "polish" and run.start_step == 0:
            self.improve(0, search=False)  # the best baseline's plans polished: the first teacher
        for c in run.callbacks:
            c.on_text("demonstrations", "|cell|planner|replayed overhead|steps|\n|-|-|-|-|\n" + "\n".join(
                f"|{d['env']}|{d['planner']}|{d.get('replayed_overhead')}|{d['steps']}|" for d in self.info))

    def _own_search(self) -> tuple[list[list[Any]], list[dict[str, Any]]]:
        """``demonstrations="self"``: every cell's first demonstration is the lookahead's episode with
        the network the run starts from (when fine-tuning, the starting agent's Q: what it knows of
        these graphs already decides what it is taught first).  A resumed run searches with the
        network it resumes, as its demonstrations improved by search are not kept either."""
        episodes, info = [], []
        for ev_env in self.run.eval_envs:
            steps, rank = self._search(ev_env)
            episodes.append(steps)
            info.append({"env": ev_env.name, "planner": "dqn-search@0", "steps": len(steps),
                         "replayed_overhead": rank[1], "replayed_feasible": not rank[0]})
        return episodes, info

    def _search(self, ev_env: SwapRecomputeEnv) -> tuple[list[Any], tuple[bool, float]]:
        """The lookahead's episode on ``ev_env`` with the current Q, and its rank (infeasible, overhead)."""
        from .planner import search_episode

        run = self.run
        steps = search_episode(run.q_net, run.batcher, ev_env, run.config.search_k, run.config.reward_scale)
        res = ev_env.result
        return steps, (not res.feasible, float(res.overhead))

    def pretrain(self) -> None:
        """DQfD's pre-training: the demonstrations alone, ``demo_pretrain_steps`` updates."""
        run, config = self.run, self.run.config
        if run.start_step != 0 or not len(self.buffer):
            return
        for pre in range(config.demo_pretrain_steps):
            loss, _, margin = td_update(run.q_net, run.target_net, run.batcher, run.rb, run.optimizer, config, 1.0,
                                        self.buffer)
            if config.target_network and (pre + 1) % config.target_update == 0:
                run.target_net.load_state_dict(run.q_net.state_dict())
            if pre % 100 == 0:
                run.log("losses/pretrain_td_loss", loss, pre)
                run.log("losses/pretrain_margin_loss", margin, pre)
        run.target_net.load_state_dict(run.q_net.state_dict())
        if run.init_from is not None and config.demo_pretrain_steps:
            run.evaluate_and_keep(0, "pretrained")

    def improve(self, step: int, *, search: bool = True) -> None:
        """Search with the current Q on every cell; keep its episode where it beats the demonstration
        (``polish``: the lookahead's plan and the demonstration itself, each polished by local search)."""
        run, config = self.run, self.run.config
        if config.demo_improve == "none":
            return
        from .demonstrations import polished_episode

        improved = 0
        for i, ev_env in enumerate(run.eval_envs):
            found: list[tuple[list[Any], tuple[bool, float], tuple[Any, ...] | None, str]] = []
            if search:
                steps, rank = self._search(ev_env)
                found.append((steps, rank, tuple(ev_env.actions), f"dqn-search@{step}"))
            if config.demo_improve == "polish":
                teachers = [(self.actions[i], f"{str(self.info[i].get('planner')).split(' ')[0]} polished@{step}")]
                if found and not found[0][1][0]:
                    teachers.append((found[0][2], f"dqn-search polished@{step}"))
                for actions, label in teachers:
                    got = polished_episode(ev_env, actions, config.demo_polish_simulations)
                    if got is not None:
                        found.append((got[0], got[1], got[2], label))
            for steps, rank, actions, label in found:
                if steps and _better(rank, self.rank[i]):
                    self.episodes[i], self.rank[i], self.actions[i] = steps, rank, actions
                    improved += 1
                    self.info[i] = {**self.info[i], "planner": label, "steps": len(steps),
                                    "replayed_overhead": rank[1], "replayed_feasible": not rank[0]}
        n_corrections = self._corrections() if config.demo_dagger and search else 0
        if improved or n_corrections:
            self.buffer = _demo_buffer(self.episodes + [[st] for steps in self.dagger for st in steps],
                                       list(run.keys) + [k for k, steps in zip(run.keys, self.dagger) for _ in steps],
                                       config, run.rng)
        run.log("demos/corrections", n_corrections, step)
        run.log("demos/improved_cells", improved, step)
        run.log("demos/mean_overhead", float(np.mean([r[1] for r in self.rank])), step)

    def _corrections(self) -> int:
        """DAgger: the student's states along its own episode, labelled with the teacher's action."""
        from .demonstrations import corrections
        from .planner import greedy_q

        run = self.run

        def student(env: SwapRecomputeEnv) -> int:
            with torch.no_grad():
                return int(np.argmax(greedy_q(run.q_net, run.batcher, env)))

        n = 0
        for i, ev_env in enumerate(run.eval_envs):
            new = corrections(ev_env, self.actions[i], student)
            self.dagger[i] = (self.dagger[i] + new)[-run.config.demo_dagger_keep:]
            n += len(new)
        return n


def _better(rank: tuple[bool, float], than: tuple[bool, float]) -> bool:
    return rank[0] < than[0] or (rank[0] == than[0] and rank[1] < than[1] - 1e-9)


def _demo_buffer(episodes: Sequence[Sequence[Any]], keys: Sequence[int], config: DQNConfig,
                 rng: np.random.Generator) -> ReplayBuffer:
    """A replay memory holding every cell's demonstration as n-step transitions."""
    transitions = []
    for steps, k in zip(episodes, keys):
        acc = NStepAccumulator(config.n_step, config.gamma)
        for st in steps:
            transitions += acc.push(k, st.state, st.action, st.reward * config.reward_scale, k,
                                    st.next_state, st.terminated, st.truncated or st is steps[-1])
    demo_rb = ReplayBuffer(max(1, len(transitions)), rng)
    for tr in transitions:
        demo_rb.add(tr)
    return demo_rb


__all__ = ["Training"]
