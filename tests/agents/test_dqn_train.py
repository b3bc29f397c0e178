"""End-to-end: a short training run learns, is reproducible, resumes and fine-tunes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dqn_swap.agents.dqn import DQNConfig, DQNPlanner, DQNSearchPlanner, finetune, load_agent, train
from dqn_swap.simulator import simulate
from dqn_swap.env import SwapRecomputeEnv

LIMIT = "30%"
TINY = DQNConfig(p=16, T=2, total_timesteps=600, learning_starts=100, eval_every=150, target_update=100,
                 buffer_size=5000, batch_size=16, train_frequency=2, exploration_fraction=0.5)


def random_returns(trace, limit, episodes=12):
    e = SwapRecomputeEnv(trace, limit)
    rng = np.random.default_rng(0)
    out = []
    for i in range(episodes):
        e.reset(seed=i)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = e.step(int(rng.choice(np.flatnonzero(e.action_masks()))))
            total, done = total + r, term or trunc
        out.append(total)
    return np.array(out)


@pytest.fixture(scope="module")
def trained(tiny_resnet_trace, tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "tiny.pt"
    result = train(tiny_resnet_trace, LIMIT, path, TINY, log_dir=None, progress=False)
    return path, result


def test_training_beats_random_actions(tiny_resnet_trace, trained):
    path, result = trained
    plan = DQNPlanner(path).plan(tiny_resnet_trace, SwapRecomputeEnv(tiny_resnet_trace, LIMIT).memory_limit,
                                 "v100-pcie3")
    res = simulate(tiny_resnet_trace, plan)
    assert res.feasible
    rand = random_returns(tiny_resnet_trace, LIMIT)
    assert -res.overhead > rand.mean()
    assert plan.planner == "dqn" and plan.trace_fingerprint == tiny_resnet_trace.fingerprint
    assert plan.figures  # simulated figures travel with the plan
    assert result.best["score"] <= result.evaluations[0]["score"] + 1e-12


def test_search_planner_is_no_worse_than_greedy(tiny_resnet_trace, trained):
    path, _ = trained
    limit = SwapRecomputeEnv(tiny_resnet_trace, LIMIT).memory_limit
    greedy = simulate(tiny_resnet_trace, DQNPlanner(path).plan(tiny_resnet_trace, limit, "v100-pcie3"))
    plan = DQNSearchPlanner(path, k=3).plan(tiny_resnet_trace, limit, "v100-pcie3")
    search = simulate(tiny_resnet_trace, plan)
    assert search.feasible and search.overhead <= greedy.overhead + 1e-12
    # polished by local search: the plan's figures are those of its own actions, never worse than before
    assert plan.settings["polish"]["overhead_before"] >= search.overhead - 1e-12
    assert plan.figures["overhead"] == pytest.approx(search.overhead)
    unpolished = simulate(tiny_resnet_trace, DQNSearchPlanner(path, k=3, polish=False).plan(
        tiny_resnet_trace, limit, "v100-pcie3"))
    assert search.overhead <= unpolished.overhead + 1e-12  # the better of two polished plans


def test_same_seed_same_agent(tiny_resnet_trace, tmp_path):
    cfg = TINY.replace(total_timesteps=100, learning_starts=50, eval_every=1000)
    a = train(tiny_resnet_trace, LIMIT, tmp_path / "a.pt", cfg, log_dir=None, progress=False)
    b = train(tiny_resnet_trace, LIMIT, tmp_path / "b.pt", cfg, log_dir=None, progress=False)
    wa, wb = load_agent(a.path)[0].state_dict(), load_agent(b.path)[0].state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_refuses_to_overwrite_and_resumes(tiny_resnet_trace, tmp_path):
    cfg = TINY.replace(total_timesteps=80, learning_starts=40, eval_every=40)
    out = tmp_path / "r.pt"
    train(tiny_resnet_trace, LIMIT, out, cfg, log_dir=None, progress=False)
    with pytest.raises(FileExistsError):
        train(tiny_resnet_trace, LIMIT, out, cfg, log_dir=None, progress=False)
    longer = cfg.replace(total_timesteps=120)
    with pytest.raises(ValueError):  # a resume file made with another configuration
        train(tiny_resnet_trace, LIMIT, out, longer, log_dir=None, progress=False, resume=True)
    res = train(tiny_resnet_trace, LIMIT, out, cfg, log_dir=None, progress=False, resume=True)
    assert res.evaluations[-1]["step"] == 80


def test_finetune_starts_from_checkpoint(tiny_resnet_trace, trained, tmp_path):
    from dqn_swap import record_trace
    from dqn_swap.models import build_workload

    w = build_workload("resnet_tiny", 8, "meta")
    bigger = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta")
    path, _ = trained
    res = finetune(path, bigger, ["30%", "60%"], tmp_path / "ft.pt", total_timesteps=60, log_dir=str(tmp_path / "runs"),
                   progress=False)
    _, cfg, obj = load_agent(res.path)
    assert obj["training"]["init_from"] == str(path) and cfg.start_e == 0.2
    # a warm-up of a twentieth of the steps (at least a mini-batch), the rate raised then lowered
    assert cfg.learning_starts == cfg.batch_size and cfg.lr_warmup == 0.1 and cfg.lr_decay
    assert obj["trace_fingerprints"] == [bigger.fingerprint]
    assert any(p.name.startswith("ft") for p in (tmp_path / "runs").iterdir())


def test_greedy_plan_does_not_depend_on_how_rewards_are_charged(tiny_resnet_trace, trained):
    """Observations are the same under both reward modes, so greedy decoding gives the same plan."""
    from dqn_swap.agents.dqn.planner import DQNPlanner, GraphBatcher, greedy_episode, make_env

    planner = DQNPlanner(trained[0])
    for limit in ("30%", "60%"):
        plans = []
        for reward in ("whole", "accrued"):
            env = make_env(tiny_resnet_trace, limit, None, planner.config.replace(reward=reward))
            greedy_episode(planner.net, GraphBatcher(), env)
            plans.append(env.plan().actions)
        assert plans[0] == plans[1]


def test_cover_decoding_plans_feasibly_with_fewer_q_passes(tiny_resnet_trace, trained, monkeypatch):
    import dqn_swap.agents.dqn.planner as planner_mod

    passes = {"n": 0}
    real = planner_mod.greedy_q

    def counting(*args):
        passes["n"] += 1
        return real(*args)

    monkeypatch.setattr(planner_mod, "greedy_q", counting)
    limit = SwapRecomputeEnv(tiny_resnet_trace, "30%").memory_limit
    plans, n_passes = {}, {}
    for decode in ("greedy", "cover"):
        passes["n"] = 0
        plans[decode] = DQNPlanner(trained[0], decode=decode).plan(tiny_resnet_trace, limit, "v100-pcie3")
        n_passes[decode] = passes["n"]
        assert plans[decode].settings["decode"] == decode
    res = simulate(tiny_resnet_trace, plans["cover"])
    assert res.feasible
    assert n_passes["cover"] <= n_passes["greedy"]
    # the first action is the same: the highest-Q valid one
    assert plans["cover"].actions and plans["greedy"].actions
    with pytest.raises(ValueError, match="unknown decoding"):
        DQNPlanner(trained[0], decode="beam")


def test_cover_batches_keep_to_the_best_actions_kind(tiny_resnet_trace):
    """``one_kind``: a batch holds only actions of its first one's kind, the others waiting for the
    next read of Q; without it, the batch takes actions in Q order whatever their kind."""
    from dqn_swap.agents.dqn.planner import cover_batch
    from dqn_swap.env.candidates import RECOMPUTE, SWAP

    env = SwapRecomputeEnv(tiny_resnet_trace, "5%", recompute_chains=False)
    env.reset(seed=0)
    g, valid = env.graph, env.action_masks()
    swaps = np.flatnonzero(valid & (g.kind == SWAP))
    removals = np.flatnonzero(valid & (g.kind == RECOMPUTE))
    assert len(swaps) > 1 and len(removals) > 1
    q = np.full(g.n_nodes, -np.inf)
    q[swaps], q[removals] = -1.0 - np.arange(len(swaps)), -1.5 - np.arange(len(removals))  # interleaved
    order = np.argsort(-q, kind="stable")
    mixed = cover_batch(env, q, order, ahead=10**6)
    assert {int(g.kind[a]) for a in mixed} == {SWAP, RECOMPUTE}
    for first in (int(swaps[0]), int(removals[0])):
        batch = cover_batch(env, q, order, first=first, ahead=10**6, one_kind=True)
        assert batch[0] == first and {int(g.kind[a]) for a in batch} == {int(g.kind[first])}
        same = order[g.kind[order] == g.kind[first]]  # the kind's actions alone, in Q order
        assert batch == cover_batch(env, q, same, first=first, ahead=10**6)


def _same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_run_that_does_not_beat_its_reference_returns_the_reference(tiny_resnet_trace, trained, tmp_path, capsys):
    from dqn_swap.agents.dqn.algorithm import reference_mismatch

    path, first = trained
    assert reference_mismatch(path, TINY) is None
    assert "its network is another (p 16, not 32)" in reference_mismatch(path, DQNConfig())
    # Untrained (no learning step) against the trained agent: step 0 is the reference's evaluation,
    # and the file keeps whichever scored best -- here the reference, which the run cannot beat.
    cfg = TINY.replace(total_timesteps=20, learning_starts=10_000, eval_every=10, seed=3)
    r = train(tiny_resnet_trace, LIMIT, tmp_path / "b.pt", cfg, log_dir=None, progress=None, reference=path)
    ref_ev = r.evaluations[0]
    assert ref_ev["phase"] == "reference" and ref_ev["step"] == 0
    assert ref_ev["score"] == pytest.approx(first.best["score"])  # the reference evaluated as its own run did
    saved, _, ckpt = load_agent(tmp_path / "b.pt")
    reference, _, _ = load_agent(path)
    best_ev = min(r.evaluations, key=lambda e: e["score"])
    assert r.best["score"] == best_ev["score"]
    assert ckpt["training"]["reference"] == str(path)
    if r.best.get("phase") == "reference":
        assert _same_weights(saved, reference)
    else:
        assert r.best["score"] < ref_ev["score"] and not _same_weights(saved, reference)
    # off a terminal (pytest captures stderr), a plain line per evaluation
    err = capsys.readouterr().err
    assert err.count("train: ") == len(r.evaluations) and "train: reference agent, score" in err


def test_evaluations_scale_with_the_steps() -> None:
    from dqn_swap.agents.dqn.algorithm import eval_cadence

    assert eval_cadence(20_000) == 1_000 and eval_cadence(1_000) == 50 and eval_cadence(10) == 50


def test_a_stopped_run_removes_only_its_own_logs(tmp_path) -> None:
    """Two runs started their logs in one new folder; the one stopped before its first evaluation removes
    its own run folder, and the log folder only if nothing else is in it."""
    from dqn_swap.agents.dqn.algorithm import _remove

    logs = tmp_path / "runs"
    (logs / "mine").mkdir(parents=True)
    (logs / "theirs").mkdir()
    (logs / "theirs" / "events.out").write_text("x")
    (logs / "mine" / "events.out").write_text("y")
    _remove([logs, logs / "mine"])
    assert not (logs / "mine").exists() and (logs / "theirs" / "events.out").read_text() == "x"
    _remove([logs, logs / "theirs"])  # the last one out takes the folder it made
    assert not logs.exists()


@pytest.mark.subprocess
def test_a_second_run_on_the_same_output_is_refused_while_the_first_runs(tiny_resnet_trace, tmp_path) -> None:
    """A resume (or a second run) started while a run writes the same agent file is refused at once, and
    leaves the running one's files alone; a lock a killed run left behind locks nothing."""
    import subprocess
    import sys

    from dqn_swap.files import OutputBusy, output_lock

    out = tmp_path / "a.pt"
    cfg = TINY.replace(total_timesteps=20, learning_starts=10, eval_every=10)
    with output_lock(out):  # the first run, still going
        with pytest.raises(OutputBusy, match="a.pt: another run is writing it now"):
            train(tiny_resnet_trace, LIMIT, out, cfg, log_dir=None, progress=False, resume=True)
        with pytest.raises(OutputBusy):
            train(tiny_resnet_trace, LIMIT, out, cfg, log_dir=None, progress=False, overwrite=True)
    assert not out.exists() and not any(tmp_path.iterdir())  # and the lock is gone with its run
    # kill -9 while holding the lock: the kernel releases it, and the next run takes it over
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from dqn_swap.files import output_lock\n"
                               f"with output_lock({str(out)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(OutputBusy):
        with output_lock(out):
            pass
    holder.kill()
    holder.wait()
    train(tiny_resnet_trace, LIMIT, out, cfg, log_dir=None, progress=False)
    assert out.exists() and not (tmp_path / ".a.pt.lock").exists()


@pytest.mark.parametrize("schedule", [{}, {"lr_warmup": 0.25, "lr_decay": True}], ids=["constant", "warmup-decay"])
def test_the_one_page_loop_trains_the_network_the_full_run_trains(tiny_resnet_trace, tmp_path, schedule) -> None:
    """The reference loop (Algorithm 1 on one page, CleanRL's way) and the run's phases take the same
    steps: their networks, targets and optimiser states are equal bit for bit at the end (after 45
    updates), the run's evaluations and resume files in between changing nothing; with the
    fine-tuning's learning-rate schedule too."""
    from dqn_swap.agents.dqn.reference_loop import train_reference
    from dqn_swap.agents.dqn.training import Training

    config = TINY.replace(total_timesteps=120, eval_every=60, learning_starts=30, seed=7, **schedule)
    run = Training(tiny_resnet_trace, [LIMIT, "60%"], tmp_path / "a.pt", config, profile=None, init_from=None,
                   reference=None, command=None)
    run.setup()
    run.learn()
    q_net, target_net, optimizer = train_reference(tiny_resnet_trace, [LIMIT, "60%"], config)
    for full, one_page in ((run.q_net.state_dict(), q_net.state_dict()),
                           (run.target_net.state_dict(), target_net.state_dict())):
        assert list(full) == list(one_page)
        assert all(torch.equal(full[k], one_page[k]) for k in full)
    full, one_page = run.optimizer.state_dict(), optimizer.state_dict()  # Adam's step and moments
    assert full["param_groups"] == one_page["param_groups"] and full["state"].keys() == one_page["state"].keys()
    assert all(torch.equal(a[k], one_page["state"][i][k]) for i, a in full["state"].items() for k in a)
    assert [e["step"] for e in run.evaluations] == [60, 120]


def test_learning_rate_schedule_by_hand() -> None:
    """``lr_warmup`` raises the rate linearly over its fraction of the steps after ``learning_starts``,
    ``lr_decay`` lowers it linearly to zero at the last step; neither: the constant rate."""
    from dqn_swap.agents.dqn.fitting import learning_rate_at

    c = DQNConfig(total_timesteps=1_100, learning_starts=100, learning_rate=1e-3)
    assert [learning_rate_at(c, s) for s in (100, 600, 1_099)] == [1e-3] * 3
    w = c.replace(lr_warmup=0.1)  # 100 of the 1,000 learning steps
    assert learning_rate_at(w, 100) == pytest.approx(1e-5) and learning_rate_at(w, 149) == pytest.approx(5e-4)
    assert learning_rate_at(w, 199) == pytest.approx(1e-3) and learning_rate_at(w, 800) == pytest.approx(1e-3)
    d = c.replace(lr_warmup=0.1, lr_decay=True)
    assert learning_rate_at(d, 149) == pytest.approx(5e-4 * 0.951)
    assert learning_rate_at(d, 600) == pytest.approx(5e-4) and learning_rate_at(d, 1_100) == 0.0

