"""Fitted Q-iteration with experience replay (Eq. 4-5, Algorithm 1), CleanRL-style.

:func:`train` reads top to bottom like CleanRL's ``dqn.py``: make the
environments, the Q-network and its target, the replay buffer; then one loop
that explores epsilon-greedily, stores transitions, fits the network on
mini-batches and evaluates the greedy plan now and then.  :func:`finetune`
continues training an agent file's agent on other (larger) graphs (section 4.4.2).
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dqn_swap.cost import DeviceProfile
from dqn_swap.files import OutputBusy, is_plain_name, output_lock
from dqn_swap.trace import Trace
from dqn_swap.limits import LimitSpec, MemoryLimit
from dqn_swap.env.swap_recompute import SwapRecomputeEnv

from .buffer import NStepAccumulator, ReplayBuffer
from .agent_file import (ENVIRONMENT_FIELDS, AgentFileError, environment_difference, load_agent, load_resume,
                         resume_path, save_agent, save_resume, save_trained_ensemble)
from .config import DQNConfig
from .planner import episode_summary, greedy_episode, make_env, torch_threads
from .policy import GraphBatcher, QEnsemble, QNetwork, masked_argmax, q_values
from torch_geometric.utils import scatter


@dataclass
class TrainResult:
    path: Path
    steps: int
    wall_time: float
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(default_factory=dict)


def linear_schedule(start: float, end: float, duration: float, t: int) -> float:
    slope = (end - start) / max(duration, 1.0)
    return max(slope * t + start, end)


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


def train(traces: Trace | Sequence[Trace], memory_limits: LimitSpec | Sequence[LimitSpec],
          out_path: str | os.PathLike[str], config: DQNConfig | None = None, *,
          profile: str | DeviceProfile | None = None, log_dir: str | os.PathLike[str] | None = "runs",
          run_name: str | None = None, progress: bool | None = None, resume: bool = False,
          overwrite: bool = False, init_from: str | os.PathLike[str] | None = None,
          command: str | None = None, threads: int | None = None,
          reference: str | os.PathLike[str] | None = None) -> TrainResult:
    """Train an agent on ``traces`` at ``memory_limits`` and save it to ``out_path``.

    ``memory_limits``: one limit or a list, any form of :mod:`dqn_swap.limits`
    (``"70%"``, ``"0.5x"``, ``"3GiB"``, bytes, a ``MemoryLimit``); every trace is
    paired with every limit and episodes cycle through the pairs.  Seeded by
    ``config.seed``: the same call gives the same agent.  TensorBoard logs go to
    ``log_dir/run_name`` (None: no logs); a tqdm bar shows on a terminal
    (``progress``).  ``resume=True`` continues from ``out_path``'s resume file
    (weights, optimiser, step, random state; the replay buffer refills).
    ``init_from``: start from an agent file's weights (fine-tuning).  The saved
    agent holds the weights of the best greedy evaluation.

    ``reference``: an agent file to beat (``dqn-swap train`` passes the shipped agent).  It is
    evaluated first on the same cells, as step 0 of the run (phase ``"reference"``), and counts
    among the evaluations: where training does not beat it, the file saved holds the reference's
    weights, and ``TrainResult.best["phase"]`` says so.  A reference whose network or environment
    is not this configuration's is not comparable and raises ``AgentFileError``.

    Progress: a tqdm bar on a terminal; elsewhere (a log file, a pipe) one plain line on standard
    error at every evaluation; ``progress=False``: nothing.
    """
    config = config or DQNConfig()
    out_path = Path(out_path)
    if out_path.exists() and not overwrite and not resume:
        raise FileExistsError(f"{out_path}: already exists (pass overwrite=True / --force to replace it)")
    run_dir = None
    if run_name is not None and not is_plain_name(run_name):
        raise ValueError(f"run name {run_name!r} must be a plain name (no '/', not '..'): the run's logs go in a "
                         "folder of that name inside the log folder")
    if log_dir is not None:
        if Path(log_dir).exists() and not Path(log_dir).is_dir():
            raise NotADirectoryError(f"{log_dir}: is a file; the log folder (--log-dir) must be a folder")
        run_name = run_name or f"{out_path.stem}__s{config.seed}__{int(time.time())}"
        run_dir = Path(log_dir) / run_name
    new_folders = [p for p in (Path(log_dir) if log_dir is not None else None, run_dir) if p is not None
                   and not p.exists()]
    started = time.time()
    writers: list[Any] = []  # the TensorBoard writer: closed before a stopped run's logs are removed,
    # or its thread would write into a folder that is being removed
    try:
        with output_lock(out_path), torch_threads(threads):
            if out_path.exists() and not overwrite and not resume:  # another run wrote it before we locked it
                raise FileExistsError(f"{out_path}: already exists (pass overwrite=True / --force to replace it)")
            return _train(traces, memory_limits, out_path, config, profile=profile, log_dir=log_dir,
                          run_name=run_name, progress=progress, resume=resume, overwrite=overwrite,
                          init_from=init_from, command=command, writers=writers, reference=reference)
    except OutputBusy:  # another run holds the output: nothing of this one was made
        raise
    except KeyboardInterrupt as e:
        _close(writers)
        raise _stopped_training(e, out_path, started, new_folders, command) from None
    except BaseException as e:
        _close(writers)
        if not _resumable(out_path, started):  # a run that failed leaves nothing: not even its log folder
            _remove(new_folders)
            raise
        if isinstance(e, (MemoryError, OSError, RuntimeError)):  # it can go on where it stopped
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RuntimeError(f"{first} ({_continue_with(out_path, command)})") from None
        raise


def _close(writers: list[Any]) -> None:
    for w in writers:
        w.close()
    writers.clear()


def _continue_with(out_path: Path, command: str | None) -> str:
    again = f"{command} --resume" if command and "--resume" not in command else (command or "train(..., resume=True)")
    return f"{resume_path(out_path)} holds the run so far: continue it with {again}"


def _resumable(out_path: Path, started: float) -> bool:
    """Whether this run (begun at ``started``) wrote a resume file, at an evaluation."""
    rpath = resume_path(out_path)
    try:
        return rpath.exists() and rpath.stat().st_mtime >= started
    except OSError:
        return False


def _remove(folders: list[Path]) -> None:
    """The run's own folder (its last) removed with what is in it; the log folder it made (its first)
    only if nothing else is in it by then: another run may have started its own logs there."""
    import shutil

    if not folders:
        return
    *made, own = folders
    shutil.rmtree(own, ignore_errors=True)
    for folder in reversed(made):
        try:
            folder.rmdir()  # empty folders only
        except OSError:
            pass


def _stopped_training(e: KeyboardInterrupt, out_path: Path, started: float, new_folders: list[Path],
                      command: str | None) -> KeyboardInterrupt:
    """What a stopped run keeps: its resume file, if an evaluation wrote one (and then its logs too,
    which the resumed run continues); otherwise nothing, not even the log folders it made."""
    from dqn_swap.stop import Stopped, as_stopped

    stopped = as_stopped(e)
    if _resumable(out_path, started):
        return Stopped(stopped.signum, _continue_with(out_path, command))
    _remove(new_folders)
    return Stopped(stopped.signum, "stopped before its first evaluation: nothing was kept")


def _train(traces: Trace | Sequence[Trace], memory_limits: LimitSpec | Sequence[LimitSpec],
           out_path: Path, config: DQNConfig, *, profile: str | DeviceProfile | None,
           log_dir: str | os.PathLike[str] | None, run_name: str | None, progress: bool | None,
           resume: bool, overwrite: bool, init_from: str | os.PathLike[str] | None,
           command: str | None, writers: list[Any] | None = None,
           reference: str | os.PathLike[str] | None = None) -> TrainResult:
    t_start = time.perf_counter()

    # ---- seeding
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)

    # ---- environments: one per (trace, limit)
    envs = make_envs(traces, memory_limits, profile, config)
    eval_envs = [make_env(e.trace, e.memory_limit, e.profile, config, simulator=e.sim, action_graph=e.graph)
                 for e in envs]  # same simulator and graph; their own episode state
    for e, ev_env in zip(envs, eval_envs):
        ev_env.name = e.name
    fingerprints = sorted({e.trace.fingerprint for e in envs})
    batcher = GraphBatcher()
    keys = [batcher.register(e.graph) for e in envs]

    # ---- Q-network, target network, optimiser, replay buffer
    q_net: QNetwork | QEnsemble = QNetwork(config)
    ensemble_obj = None  # an ensemble's file dict, when its mean is what is trained
    if init_from is not None:
        src, src_config, src_obj = load_agent(init_from)
        if isinstance(src, QEnsemble):
            # ours: the mean of the members' Q-values is the network fitted, so the plan trained
            # is the one the ensemble's one-pass decoding makes (docs/learning.md, "Fine-tuning an ensemble")
            differ = environment_difference(src_config, config, (*ENVIRONMENT_FIELDS, "swap_slack"))
            if differ:
                raise AgentFileError(f"{init_from}: its agents plan in another environment than this configuration "
                                     f"({differ})")
            q_net, ensemble_obj = src.train(), src_obj
        else:
            try:
                q_net.load_state_dict(src.state_dict())
            except RuntimeError:
                raise AgentFileError(f"{init_from}: its network does not match this configuration") from None
    target_net = copy.deepcopy(q_net)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=config.learning_rate)
    rb = ReplayBuffer(config.buffer_size, rng, config.prioritized, config.per_alpha)
    nstep = NStepAccumulator(config.n_step, config.gamma)
    start_step, evaluations, best = 0, [], {"score": np.inf}
    best_state = copy.deepcopy(q_net.state_dict())

    rpath = resume_path(out_path)
    if resume:
        if not rpath.exists():
            raise AgentFileError(f"{rpath}: no resume file to continue from")
        r = load_resume(rpath)
        if r.get("config") != config.to_dict() or r.get("trace_fingerprints") != fingerprints:
            raise AgentFileError(f"{rpath}: was made with another configuration or other traces")
        q_net.load_state_dict(r["q"]); target_net.load_state_dict(r["target"])
        optimizer.load_state_dict(r["optimizer"])
        best_state, best, evaluations = r["best_state"], dict(r["best"]), list(r["evaluations"])
        start_step = int(r["global_step"])
        torch.set_rng_state(r["torch_rng"])
        rng.bit_generator.state = r["np_rng"]

    # ---- logging
    writer = None
    if log_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        run_name = run_name or f"{out_path.stem}__s{config.seed}__{int(time.time())}"
        writer = SummaryWriter(str(Path(log_dir) / run_name))
        if writers is not None:
            writers.append(writer)
        writer.add_text("config", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in config.to_dict().items()))
    from tqdm import tqdm

    live = sys.stderr.isatty()
    bar = tqdm(total=config.total_timesteps, initial=start_step, disable=not (live and progress is not False),
               desc="train", unit="step")
    plain = not live and progress is not False  # a log file or a pipe: a line per evaluation

    def say(ev: dict[str, Any], step: int) -> None:
        if plain:
            what = f"{ev['phase']} agent" if ev.get("phase") else f"step {step:,} of {config.total_timesteps:,}"
            print(f"train: {what}, score {ev['score']:.4f} (overhead {ev['overhead']:.4f}, feasible "
                  f"{ev['feasible']:.0%}), best {best['score']:.4f} at step {best.get('step', step):,}, "
                  f"{time.perf_counter() - t_start:.0f} s", file=sys.stderr, flush=True)

    def log(tag: str, value: float, step: int) -> None:
        if writer is not None:
            writer.add_scalar(tag, value, step)

    def evaluate_and_keep(step: int, phase: str | None = None) -> None:
        nonlocal best, best_state
        ev = evaluate(q_net, batcher, eval_envs)
        ev["step"] = step
        if phase:
            ev["phase"] = phase
        evaluations.append({k: v for k, v in ev.items() if k != "per_env"} |
                           {"per_env": {n: {k: v for k, v in d.items()} for n, d in ev["per_env"].items()}})
        for tag in ("overhead", "peak_bytes", "feasible", "n_swap", "n_recompute"):
            log(f"plan/{tag}", ev[tag], step)
        log("plan/score", ev["score"], step)
        if ev["score"] < best["score"] - 1e-12:
            best = {"score": ev["score"], "step": step, "overhead": ev["overhead"], "feasible": ev["feasible"],
                    **({"phase": phase} if phase else {})}
            best_state = copy.deepcopy(q_net.state_dict())
        save_resume(rpath, {"global_step": step, "q": q_net.state_dict(), "target": target_net.state_dict(),
                            "optimizer": optimizer.state_dict(), "best_state": best_state, "best": best,
                            "evaluations": evaluations, "torch_rng": torch.get_rng_state(),
                            "np_rng": rng.bit_generator.state, "config": config.to_dict(),
                            "trace_fingerprints": fingerprints})
        bar.set_postfix(score=f"{ev['score']:.4f}", best=f"{best['score']:.4f}")
        say(ev, step)

    def better(rank: tuple[bool, float], than: tuple[bool, float]) -> bool:
        return rank[0] < than[0] or (rank[0] == than[0] and rank[1] < than[1] - 1e-9)

    def improve_demonstrations(step: int, *, search: bool = True) -> None:
        """Search with the current Q on every cell; keep its episode where it beats the demonstration
        (``polish``: the lookahead's plan and the demonstration itself, each polished by local search)."""
        nonlocal demo_rb
        if demo_rb is None or config.demo_improve == "none":
            return
        from .demonstrations import polished_episode
        from .planner import search_episode

        improved = 0
        for i, ev_env in enumerate(eval_envs):
            found: list[tuple[list[Any], tuple[bool, float], tuple[Any, ...] | None, str]] = []
            if search:
                steps = search_episode(q_net, batcher, ev_env, config.search_k, config.reward_scale)
                res = ev_env.result
                found.append((steps, (not res.feasible, float(res.overhead)), tuple(ev_env.actions),
                              f"dqn-search@{step}"))
            if config.demo_improve == "polish":
                teachers = [(demo_actions[i], f"{str(demo_info[i].get('planner')).split(' ')[0]} polished@{step}")]
                if found and not found[0][1][0]:
                    teachers.append((found[0][2], f"dqn-search polished@{step}"))
                for actions, label in teachers:
                    got = polished_episode(ev_env, actions, config.demo_polish_simulations)
                    if got is not None:
                        found.append((got[0], got[1], got[2], label))
            for steps, rank, actions, label in found:
                if steps and better(rank, demo_rank[i]):
                    demo_episodes[i], demo_rank[i], demo_actions[i] = steps, rank, actions
                    improved += 1
                    demo_info[i] = {**demo_info[i], "planner": label, "steps": len(steps),
                                    "replayed_overhead": rank[1], "replayed_feasible": not rank[0]}
        n_corrections = 0
        if config.demo_dagger and search:
            from .demonstrations import corrections
            from .planner import greedy_q

            def student(env: SwapRecomputeEnv) -> int:
                with torch.no_grad():
                    return int(np.argmax(greedy_q(q_net, batcher, env)))

            for i, ev_env in enumerate(eval_envs):
                new = corrections(ev_env, demo_actions[i], student)
                dagger[i] = (dagger[i] + new)[-config.demo_dagger_keep:]
                n_corrections += len(new)
        if improved or n_corrections:
            demo_rb = _demo_buffer(demo_episodes + [[st] for steps in dagger for st in steps],
                                   list(keys) + [k for k, steps in zip(keys, dagger) for _ in steps], config, rng)
        log("demos/corrections", n_corrections, step)
        log("demos/improved_cells", improved, step)
        log("demos/mean_overhead", float(np.mean([r[1] for r in demo_rank])), step)

    if reference is not None and start_step == 0:
        # the agent to beat counts as step 0: a run that does not beat it returns it
        ref, ref_config, _ = load_agent(reference)
        why = _mismatch(ref, ref_config, config)
        if why is not None or isinstance(q_net, QEnsemble):
            raise AgentFileError(f"{reference}: the reference agent cannot be compared: {why or 'an ensemble is trained'}")
        own = copy.deepcopy(q_net.state_dict())
        q_net.load_state_dict(ref.state_dict())
        evaluate_and_keep(0, "reference")
        q_net.load_state_dict(own)
        target_net.load_state_dict(own)
    if init_from is not None and start_step == 0:
        evaluate_and_keep(0, "start")  # the starting point counts: fine-tuning never returns a worse agent

    # ---- demonstrations (DQfD): the best baseline's replayed plan of every cell, kept for the whole run
    demo_rb, demo_info = None, []
    if config.demonstrations == "best-baseline":
        from .demonstrations import demonstrations, replay_nodes
        from .planner import teacher_planner

        teacher = teacher_planner(config.demo_teacher) if config.demo_teacher else None
        demo_episodes, demo_info = demonstrations(envs, teacher=teacher)
        demo_rank = [(not d.get("replayed_feasible", False), d.get("replayed_overhead", np.inf)) for d in demo_info]
        demo_rb = _demo_buffer(demo_episodes, keys, config, rng)
        # each cell's demonstration as the actions its replay took (the plan local search polishes)
        demo_actions = [replay_nodes(ev, [s.action for s in steps]) for ev, steps in zip(eval_envs, demo_episodes)]
        dagger: list[list[Any]] = [[] for _ in envs]  # the student's states labelled by the teacher
        if config.demo_improve == "polish" and start_step == 0:
            improve_demonstrations(0, search=False)  # the best baseline's plans polished: the first teacher
        if writer is not None:
            writer.add_text("demonstrations", "|cell|planner|replayed overhead|steps|\n|-|-|-|-|\n" + "\n".join(
                f"|{d['env']}|{d['planner']}|{d.get('replayed_overhead')}|{d['steps']}|" for d in demo_info))
        if start_step == 0 and len(demo_rb):
            for pre in range(config.demo_pretrain_steps):  # DQfD's pre-training: demonstrations alone
                loss, qmean, margin = td_update(q_net, target_net, batcher, rb, optimizer, config, 1.0, demo_rb)
                if config.target_network and (pre + 1) % config.target_update == 0:
                    target_net.load_state_dict(q_net.state_dict())
                if pre % 100 == 0:
                    log("losses/pretrain_td_loss", loss, pre)
                    log("losses/pretrain_margin_loss", margin, pre)
            target_net.load_state_dict(q_net.state_dict())
            if init_from is not None and config.demo_pretrain_steps:
                evaluate_and_keep(0, "pretrained")

    # ---- the loop (Algorithm 1)
    order = rng.permutation(len(envs))
    episode = 0

    def start_episode() -> tuple[SwapRecomputeEnv, int]:
        i = int(order[episode % len(envs)])
        envs[i].reset(seed=int(rng.integers(2**31)))
        return envs[i], keys[i]

    env, key = start_episode()
    state = env.state()
    ep_return, ep_len, sps_t, sps_step = 0.0, 0, time.perf_counter(), start_step
    duration = config.exploration_fraction * config.total_timesteps
    for global_step in range(start_step, config.total_timesteps):
        epsilon = linear_schedule(config.start_e, config.end_e, duration, global_step)
        valid_idx = np.flatnonzero(state.valid)
        if rng.random() < epsilon:
            action = int(rng.choice(valid_idx))
        else:
            with torch.no_grad():
                q, _, _ = q_values(q_net, batcher, [(key, state)])
            qv = q.numpy()
            action = int(valid_idx[np.argmax(qv[valid_idx])])
        _, reward, terminated, truncated, info = env.step(action)
        next_state = env.state()
        for tr in nstep.push(key, state, action, reward * config.reward_scale, key, next_state,
                             terminated, truncated):
            rb.add(tr)
        ep_return += reward
        ep_len += 1
        state = next_state
        if terminated or truncated:
            summary = episode_summary(env, ep_return, ep_len)
            log("charts/episodic_return", ep_return, global_step)
            log("charts/episodic_length", ep_len, global_step)
            log("charts/episodic_overhead", summary["overhead"], global_step)
            episode += 1
            env, key = start_episode()
            state = env.state()
            ep_return, ep_len = 0.0, 0
            nstep.clear()

        if global_step >= config.learning_starts and global_step % config.train_frequency == 0 and len(rb):
            beta = config.per_beta + (1.0 - config.per_beta) * global_step / config.total_timesteps
            loss, qmean, margin = td_update(q_net, target_net, batcher, rb, optimizer, config, beta, demo_rb)
            if global_step % 100 == 0:
                log("losses/td_loss", loss, global_step)
                if demo_rb is not None:
                    log("losses/margin_loss", margin, global_step)
                log("losses/q_values", qmean, global_step)
                log("charts/epsilon", epsilon, global_step)
                now = time.perf_counter()
                log("charts/SPS", (global_step - sps_step) / max(now - sps_t, 1e-9), global_step)
                sps_t, sps_step = now, global_step
        if config.target_network and global_step % config.target_update == 0:
            target_net.load_state_dict(q_net.state_dict())
        if (global_step + 1) % config.eval_every == 0:
            evaluate_and_keep(global_step + 1)
            if not config.demo_improve_every:
                improve_demonstrations(global_step + 1)
        if config.demo_improve_every and (global_step + 1) % config.demo_improve_every == 0:
            improve_demonstrations(global_step + 1)
        bar.update(1)
    if not evaluations or evaluations[-1]["step"] != config.total_timesteps:
        evaluate_and_keep(config.total_timesteps)
    bar.close()

    # ---- save the best greedy agent
    q_net.load_state_dict(best_state)
    wall = time.perf_counter() - t_start
    training = {"steps": config.total_timesteps, "wall_time_s": round(wall, 1), "best": best,
                "reference": str(reference) if reference is not None else None,
                "environments": [e.name for e in envs],
                "memory_limits": [int(e.memory_limit) for e in envs], "command": command or "",
                "init_from": str(init_from) if init_from else None, "demonstrations": demo_info,
                "evaluations": [{k: v for k, v in e.items() if k != "per_env"} for e in evaluations]}
    if ensemble_obj is not None:
        save_trained_ensemble(out_path, q_net, ensemble_obj, trace_fingerprints=fingerprints, training=training,
                              overwrite=bool(overwrite or resume))
    else:
        save_agent(out_path, q_net, config, trace_fingerprints=fingerprints, training=training,
                   overwrite=bool(overwrite or resume))
    if writer is not None:
        writer.close()
    return TrainResult(out_path, config.total_timesteps, wall, evaluations, best)


#: The settings that make the Q-network what it is (a reference agent must share them).
NETWORK_FIELDS = ("p", "T", "readout", "head", "head_features", "swap_slack", "aggr", "bias")


def reference_mismatch(reference: str | os.PathLike[str], config: DQNConfig) -> str | None:
    """Why the agent file ``reference`` cannot be the agent a run with ``config`` must beat (None: it can):
    an ensemble, another environment, or another network."""
    return _mismatch(*load_agent(reference)[:2], config)


def _mismatch(ref: QNetwork | QEnsemble, ref_config: DQNConfig, config: DQNConfig) -> str | None:
    if isinstance(ref, QEnsemble):
        return "it is an ensemble"
    differ = environment_difference(ref_config, config, ENVIRONMENT_FIELDS)
    if differ:
        return f"it plans in another environment ({differ})"
    differ = environment_difference(ref_config, config, NETWORK_FIELDS)
    if differ:
        return f"its network is another ({differ})"
    return None


#: Evaluations a run makes over its steps by default (:func:`eval_cadence`).
EVALUATIONS = 20


def eval_cadence(steps: int) -> int:
    """Steps between two evaluations by default: ``steps / EVALUATIONS``, at least 50 (20,000 steps:
    every 1,000; 1,000 steps: every 50)."""
    return max(50, int(steps) // EVALUATIONS)


def finetune(agent_file: str | os.PathLike[str], traces: Trace | Sequence[Trace],
             memory_limits: LimitSpec | Sequence[LimitSpec], out_path: str | os.PathLike[str], *,
             total_timesteps: int | None = None, start_e: float = 0.2, learning_starts: int = 200,
             lr_factor: float = 0.3, **kwargs: Any) -> TrainResult:
    """Continue training ``agent_file`` on ``traces`` (section 4.4.2: train on a small
    graph, fine-tune on a large one).

    The agent file's configuration is kept, with less exploration (``start_e``,
    decaying over the first 30% of the steps), a learning rate scaled by
    ``lr_factor`` and a short warm-up; ``config_overrides`` (a dict) changes any
    other field (the evaluations come every :func:`eval_cadence` steps unless it sets
    ``eval_every``).  The starting agent is evaluated first, so the result is never
    worse than it on these traces.  Other keyword arguments go to :func:`train`.

    ``agent_file`` may be an ensemble file: the network trained is then the mean of its
    members' Q-values (:class:`~.policy.QEnsemble`; ours), every member's weights move with the
    loss on the mean, the first member's configuration sets the training, and the result is an
    ensemble file again (:func:`~.agent_file.save_trained_ensemble`). Distilling into each member
    apart makes the members agree and their mean lose what their disagreement gave it
    (docs/learning.md, "Distilling the members"); trained as a whole, the plan the one-pass
    decoding makes is the one the loss sees.
    """
    _, config, _ = load_agent(agent_file)
    steps = total_timesteps or max(config.total_timesteps // 4, 1000)
    config = config.replace(start_e=start_e, learning_starts=learning_starts, exploration_fraction=0.3,
                            learning_rate=config.learning_rate * lr_factor, total_timesteps=steps,
                            eval_every=eval_cadence(steps))
    overrides = kwargs.pop("config_overrides", None) or {}
    if overrides:
        config = config.replace(**overrides)
    return train(traces, memory_limits, out_path, config, init_from=agent_file, **kwargs)
