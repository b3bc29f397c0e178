"""Fitted Q-iteration with experience replay (Eq. 4-5, Algorithm 1), CleanRL-style.

:func:`train` reads top to bottom like CleanRL's ``dqn.py``: make the
environments, the Q-network and its target, the replay buffer; then one loop
that explores epsilon-greedily, stores transitions, fits the network on
mini-batches and evaluates the greedy plan now and then.  :func:`finetune`
continues training an agent file's agent on other (larger) graphs (section 4.4.2).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from dqn_swap.cost import DeviceProfile
from dqn_swap.files import OutputBusy, is_plain_name, output_lock
from dqn_swap.trace import Trace
from dqn_swap.limits import LimitSpec

from .agent_file import load_agent, resume_path
from .config import DQNConfig
from .fitting import mismatch
from .planner import torch_threads


@dataclass
class TrainResult:
    path: Path
    steps: int
    wall_time: float
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(default_factory=dict)


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


#: Seconds a stopped or failed run waits for its TensorBoard writer to close (:func:`_close`).
CLOSE_WAIT = 10.0


def _close(writers: list[Any]) -> None:
    """Close the run's TensorBoard writers, each on a daemon thread given :data:`CLOSE_WAIT` seconds:
    a stopped run must end even if a writer's own thread does not (a signal can land inside a
    writer's call).  Its logs may then lack their last events."""
    import threading

    for w in writers:
        closing = threading.Thread(target=w.close, name="dqn-swap-close-logs", daemon=True)
        closing.start()
        closing.join(CLOSE_WAIT)
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
    """The run's phases in order (:mod:`.training`)."""
    from .training import Training

    run = Training(traces, memory_limits, out_path, config, profile=profile, init_from=init_from,
                   reference=reference, command=command)
    run.setup()
    if resume:
        run.resume()
    run.open_logs(log_dir, run_name, progress, writers)
    run.baselines()
    run.demonstrate()
    run.learn()
    run.save(overwrite=bool(overwrite or resume))
    run.close()
    return TrainResult(out_path, config.total_timesteps, run.wall, run.evaluations, run.best)


def reference_mismatch(reference: str | os.PathLike[str], config: DQNConfig) -> str | None:
    """Why the agent file ``reference`` cannot be the agent a run with ``config`` must beat (None: it can):
    an ensemble, another environment, or another network."""
    return mismatch(*load_agent(reference)[:2], config)


#: Evaluations a run makes over its steps by default (:func:`eval_cadence`).
EVALUATIONS = 20


def eval_cadence(steps: int) -> int:
    """Steps between two evaluations by default: ``steps / EVALUATIONS``, at least 50 (20,000 steps:
    every 1,000; 1,000 steps: every 50)."""
    return max(50, int(steps) // EVALUATIONS)


def finetune(agent_file: str | os.PathLike[str], traces: Trace | Sequence[Trace],
             memory_limits: LimitSpec | Sequence[LimitSpec], out_path: str | os.PathLike[str], *,
             total_timesteps: int | None = None, start_e: float = 0.2, learning_starts: int | None = None,
             lr_factor: float = 0.3, train_frequency: int = 1, lr_warmup: float = 0.1, lr_decay: bool = True,
             **kwargs: Any) -> TrainResult:
    """Continue training ``agent_file`` on ``traces`` (section 4.4.2: train on a small
    graph, fine-tune on a large one).

    The agent file's configuration is kept, with less exploration (``start_e``,
    decaying over the first 30% of the steps), a learning rate scaled by
    ``lr_factor`` and scheduled (``lr_warmup``, ``lr_decay``), a short warm-up
    (``learning_starts``: a twentieth of the steps, at least a mini-batch, at most 200), and
    one update per step (``train_frequency``);
    ``config_overrides`` (a dict) changes any other field (the evaluations come every
    :func:`eval_cadence` steps unless it sets ``eval_every``).  The starting agent is
    evaluated first, so the result is never worse than it on these traces.  Other keyword
    arguments go to :func:`train`.

    One update per step (ours; training from scratch makes one every four, the paper's and
    CleanRL's replay ratio): a fine-tuned agent starts from a Q that already ranks the large
    graph's actions nearly right, so what its few steps on that graph are short of is updates,
    not exploration.  Measured on ``gen:se_cnn:2`` -> ``gen:se_cnn:1``, three seeds (docs/results.md,
    "Fine-tuning against training from scratch"): 4,000 steps of fine-tuning (20 % of training
    from scratch) reached best scores of 0.0204 / 0.0199 / 0.0237 with an update every four steps,
    and 0.0136 / 0.0174 / 0.0222 with one per step, against the scratch runs' 0.0185 / 0.0148 / 0.0164
    in 20,000 steps.  Each step costs about three and a half times the CPU time.

    The learning rate rises linearly over the first tenth of the updates and falls linearly to
    zero at the last (ours for this learner; the warm-up and linear decay with which pre-trained
    networks are commonly fine-tuned, e.g. Devlin et al., BERT, 2019).  Adam's first updates from
    fresh moments move every weight by about the learning rate whatever its gradient, a jolt to a
    network that already plans well; the decay lets the last evaluations see a network that has
    settled.  The warm-up without updates was 200 steps, a quarter of an 800-step run.  Measured
    on six runs of three small-to-large pairs against the earlier constant rate and 200-step
    warm-up, from the same sources (``bench_dqn.py transfer``, best greedy score over scratch's):
    better in four (e.g. ``gen:se_cnn:2`` -> ``gen:se_cnn:1`` 0.0182 -> 0.0128, scratch 0.0182), equal
    in one, worse in one (Llama 8 -> 32 layers, 0.0220 -> 0.0611, scratch 0.0213); the geometric mean
    of fine-tuned over scratch 1.100 -> 1.081, and the same three of the six reached scratch.  A tenth
    of this rate, tried on pilots, did not move ResNet-50 -> 152 from its start; docs/learning.md
    ("Generalisation and transfer") has the runs.

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
    if learning_starts is None:  # a twentieth of the steps, 200 at most: 800 steps wait 40, not a quarter
        learning_starts = min(200, max(config.batch_size, steps // 20))
    config = config.replace(start_e=start_e, learning_starts=learning_starts, exploration_fraction=0.3,
                            learning_rate=config.learning_rate * lr_factor, total_timesteps=steps,
                            eval_every=eval_cadence(steps), train_frequency=train_frequency,
                            lr_warmup=lr_warmup, lr_decay=lr_decay)
    overrides = kwargs.pop("config_overrides", None) or {}
    if overrides:
        config = config.replace(**overrides)
    return train(traces, memory_limits, out_path, config, init_from=agent_file, **kwargs)
