"""Demonstrations (DQfD): replaying a baseline's plan in the environment, the large-margin loss
against a dense reference, and a training run that learns from them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dqn_swap.agents import get_planner
from dqn_swap.agents.dqn import DQNConfig, load_agent, train
from dqn_swap.agents.dqn.fitting import imitation_loss, margin_loss
from dqn_swap.agents.dqn.demonstrations import action_nodes, best_demonstration, demonstration_episode
from dqn_swap.agents.dqn.planner import make_env
from dqn_swap.simulator import simulate

LIMIT = "30%"
#: A training run of a few seconds that learns from demonstrations.
TINY_RUN = dict(p=16, T=2, total_timesteps=300, learning_starts=100, eval_every=150, target_update=100,
                buffer_size=5000, batch_size=16, train_frequency=2, demonstrations="best-baseline")


def test_a_replayed_plan_takes_only_its_own_actions_and_fits(tiny_resnet_trace):
    env = make_env(tiny_resnet_trace, LIMIT, None, DQNConfig())
    plan = get_planner("window").plan(tiny_resnet_trace, env.memory_limit)
    assert plan.figures["feasible"]
    steps = demonstration_episode(env, plan)
    nodes = set(action_nodes(env, plan.actions).tolist())
    assert steps and {s.action for s in steps} <= nodes
    assert all(s.state.valid[s.action] for s in steps)  # every demonstrated action was offered there
    assert steps[-1].terminated and env.result.feasible
    # The replay's actions are a subset of the plan's and the simulator agrees with the environment.
    replayed = simulate(tiny_resnet_trace, env.actions, env.memory_limit, env.profile)
    assert replayed.feasible and abs(replayed.overhead - env.result.overhead) < 1e-12
    assert replayed.overhead <= plan.figures["overhead"] + 1e-12


def test_the_best_demonstration_is_the_best_replay(tiny_resnet_trace):
    env = make_env(tiny_resnet_trace, LIMIT, None, DQNConfig())
    steps, info = best_demonstration(env, ("window", "sqrt-n", "lru"))
    for name in ("window", "sqrt-n", "lru"):
        plan = get_planner(name).plan(tiny_resnet_trace, env.memory_limit)
        if plan.figures["feasible"]:
            demonstration_episode(env, plan)
            assert not env.result.feasible or info["replayed_overhead"] <= env.result.overhead + 1e-12
    assert info["replayed_feasible"] and info["steps"] == len(steps)


def test_margin_loss_matches_a_dense_reference():
    torch.manual_seed(0)
    sizes = [4, 6, 3]
    q = torch.randn(sum(sizes))
    valid = torch.rand(sum(sizes)) > 0.3
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    offsets = torch.tensor([0, 4, 10])
    actions = torch.tensor([1, 2, 0])
    for i, a in enumerate(actions.tolist()):
        valid[offsets[i] + a] = True  # the expert's action is valid where it was taken
    rows = torch.tensor([1, 2])
    got = margin_loss(q, valid, batch, offsets, actions, rows, margin=0.8)
    want = []
    for i in rows.tolist():
        qs, vs = q[offsets[i]:offsets[i] + sizes[i]], valid[offsets[i]:offsets[i] + sizes[i]]
        aug = [float(qs[j]) + (0.0 if j == actions[i] else 0.8) for j in range(sizes[i]) if vs[j]]
        want.append(max(aug) - float(qs[actions[i]]))
    assert abs(float(got) - np.mean(want)) < 1e-6
    assert float(got) >= 0  # the expert's own term bounds the max from below


def test_imitation_loss_matches_a_dense_reference():
    torch.manual_seed(1)
    sizes = [5, 3, 7]
    q = 4 * torch.randn(sum(sizes))
    valid = torch.rand(sum(sizes)) > 0.4
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    offsets = torch.tensor([0, 5, 8])
    actions = torch.tensor([4, 0, 6])
    for i, a in enumerate(actions.tolist()):
        valid[offsets[i] + a] = True
    rows = torch.tensor([0, 2])
    got = imitation_loss(q, valid, batch, offsets, actions, rows)
    want = []
    for i in rows.tolist():
        qs, vs = q[offsets[i]:offsets[i] + sizes[i]], valid[offsets[i]:offsets[i] + sizes[i]]
        want.append(-float(torch.log_softmax(qs[vs], 0)[int(vs[:actions[i]].sum())]))
    assert abs(float(got) - np.mean(want)) < 1e-5
    # its gradient raises the demonstrated action and lowers every other valid one; invalid ones get none
    qg = q.clone().requires_grad_(True)
    imitation_loss(qg, valid, batch, offsets, actions, rows).backward()
    for i in rows.tolist():
        for j in range(sizes[i]):
            g = float(qg.grad[offsets[i] + j])
            if not valid[offsets[i] + j]:
                assert g == 0
            else:
                assert (g < 0) if j == actions[i] else (g > 0)


@pytest.mark.parametrize("loss", ["margin", "cross_entropy"])
def test_training_with_demonstrations_records_them_and_learns(tiny_resnet_trace, tmp_path, loss):
    config = DQNConfig(**TINY_RUN, demo_pretrain_steps=200, demo_loss=loss)
    result = train(tiny_resnet_trace, LIMIT, tmp_path / "demo.pt", config, log_dir=None, progress=False)
    _, cfg, ckpt = load_agent(tmp_path / "demo.pt")
    assert cfg.demonstrations == "best-baseline"
    (demo,) = ckpt["training"]["demonstrations"]
    assert demo["planner"] and demo["replayed_feasible"] and demo["steps"] > 0
    # Pre-trained on the demonstrations alone, the first greedy evaluation is already feasible
    # and within the demonstration's overhead plus a margin.
    first = result.evaluations[0]
    assert first["feasible"] == 1.0 and first["overhead"] <= demo["replayed_overhead"] + 0.05


def test_search_episode_transitions_are_the_environments_and_the_simulator_agrees(tiny_resnet_trace):
    from dqn_swap.agents.dqn.planner import search_episode
    from dqn_swap.agents.dqn.policy import GraphBatcher, QNetwork

    torch.manual_seed(0)
    config = DQNConfig(p=16, T=2)
    env = make_env(tiny_resnet_trace, LIMIT, None, config)
    steps = search_episode(QNetwork(config), GraphBatcher(), env, k=3, reward_scale=config.reward_scale)
    assert steps and (steps[-1].terminated or steps[-1].truncated)
    assert all(s.state.valid[s.action] for s in steps)
    assert all(a.next_state is b.state for a, b in zip(steps, steps[1:]))  # one chain of states
    replayed = simulate(tiny_resnet_trace, env.actions, env.memory_limit, env.profile)
    assert replayed.feasible == env.result.feasible and abs(replayed.overhead - env.result.overhead) < 1e-12


def test_search_improves_the_demonstrations_during_training(tiny_resnet_trace, tmp_path):
    base = dict(TINY_RUN, demo_pretrain_steps=200)
    limits = ["50%", "40%"]
    demos = {}
    for improve in ("none", "search"):
        train(tiny_resnet_trace, limits, tmp_path / f"{improve}.pt", DQNConfig(**base, demo_improve=improve),
              log_dir=None, progress=False)
        demos[improve] = load_agent(tmp_path / f"{improve}.pt")[2]["training"]["demonstrations"]
    for before, after in zip(demos["none"], demos["search"]):
        assert after["replayed_overhead"] <= before["replayed_overhead"] + 1e-12  # never replaced by a worse one
    improved = [(b, a) for b, a in zip(demos["none"], demos["search"]) if a["planner"].startswith("dqn-search@")]
    assert improved  # at 40 % the search with the learned Q beats window's replay (0.0145 -> 0.0094 when written)
    assert all(a["replayed_overhead"] < b["replayed_overhead"] and a["replayed_feasible"] for b, a in improved)
    with pytest.raises(ValueError, match="demonstrations"):  # demo_improve without demonstrations
        DQNConfig(demo_improve="search")


def test_a_polished_episode_is_never_worse_than_its_plan_and_its_actions_replay(tiny_resnet_trace):
    from dqn_swap.agents.dqn.demonstrations import polished_episode, replay_nodes

    env = make_env(tiny_resnet_trace, "35%", None, DQNConfig())
    plan = get_planner("window").plan(tiny_resnet_trace, env.memory_limit)
    steps = demonstration_episode(env, plan)
    plain = env.result.overhead
    got = polished_episode(env, tuple(env.actions), simulations=500)
    assert got is not None
    p_steps, rank, actions = got
    assert not rank[0] and rank[1] <= plain + 1e-12
    # Replaying the episode's own nodes takes the same actions back (a demonstration as a plan).
    assert replay_nodes(env, [s.action for s in p_steps]) == actions
    assert replay_nodes(env, [s.action for s in steps]) != () and env.result.feasible
    # A plan that does not fit is not polished.
    assert polished_episode(env, (), simulations=10) is None


def test_expert_iteration_keeps_the_best_teacher_per_cell(tiny_resnet_trace, tmp_path):
    base = dict(TINY_RUN, demo_pretrain_steps=100, demo_polish_simulations=300)
    limits = ["50%", "40%"]
    demos = {}
    for improve in ("none", "polish"):
        extra = {"demo_dagger": True} if improve == "polish" else {}  # the student's states labelled too
        train(tiny_resnet_trace, limits, tmp_path / f"{improve}.pt", DQNConfig(**base, demo_improve=improve, **extra),
              log_dir=None, progress=False)
        demos[improve] = load_agent(tmp_path / f"{improve}.pt")[2]["training"]["demonstrations"]
    for before, after in zip(demos["none"], demos["polish"]):
        assert after["replayed_feasible"] and after["replayed_overhead"] <= before["replayed_overhead"] + 1e-12
    assert any("polished@" in a["planner"] and a["replayed_overhead"] < b["replayed_overhead"] - 1e-9
               for b, a in zip(demos["none"], demos["polish"]))
    with pytest.raises(ValueError, match="demo_improve_every"):  # a negative demo_improve_every
        DQNConfig(demonstrations="best-baseline", demo_improve="polish", demo_improve_every=-1)


def test_corrections_label_the_students_own_states_with_the_teachers_actions(tiny_resnet_trace):
    from dqn_swap.agents.dqn.demonstrations import corrections

    env = make_env(tiny_resnet_trace, "35%", None, DQNConfig())
    plan = get_planner("window").plan(tiny_resnet_trace, env.memory_limit)
    teacher = demonstration_episode(env, plan)
    teacher_nodes = {s.action for s in teacher}
    teacher_actions = tuple(env.actions)
    # A student that follows the teacher is never corrected.
    script = iter([s.action for s in teacher])
    assert corrections(env, teacher_actions, lambda e: next(script)) == []
    # A student that takes the last valid action each time strays; every correction is a teacher action
    # valid in the student's state, and its reward is the environment's for that action there.
    def last_valid(e):
        return int(np.flatnonzero(e.state().valid)[-1])

    fixed = corrections(env, teacher_actions, last_valid)
    assert fixed and all(s.action in teacher_nodes and s.state.valid[s.action] for s in fixed)
    for s in fixed[:3]:
        env.reset(seed=0)
        while not np.array_equal(env.state().chosen, s.state.chosen):
            env.step(last_valid(env))
        _, r, *_ = env.step(s.action)
        assert abs(r - s.reward) < 1e-12
    try:
        DQNConfig(demonstrations="best-baseline", demo_improve="search", demo_dagger=True)
    except ValueError as err:
        assert "demo_dagger" in str(err)
    else:
        raise AssertionError("demo_dagger without a polishing teacher was accepted")


def test_a_teacher_agents_plan_joins_the_demonstrations(tiny_resnet_trace, tmp_path):
    """``demo_teacher``: the named agents' plan, decoded by members, is one more candidate
    demonstration; the best replay is kept, and a training run records which one it was."""
    from dqn_swap.agents.dqn.planner import teacher_planner

    env = make_env(tiny_resnet_trace, LIMIT, None, DQNConfig())
    teacher = teacher_planner("ensemble, ensemble_groups")
    assert teacher.members and len(teacher.portfolio) == 2
    assert not teacher_planner("default").members  # one agent: its own greedy plan
    steps, info = best_demonstration(env, ("lru",), teacher)
    replays = {}
    for name, planner in (("lru", get_planner("lru")), ("teacher", teacher)):
        plan = planner.plan(tiny_resnet_trace, env.memory_limit)
        demonstration_episode(env, plan)
        replays[name] = (not env.result.feasible, env.result.overhead)
    assert info["planner"] == min(replays, key=replays.get)
    assert info["replayed_overhead"] == pytest.approx(min(replays.values())[1], abs=1e-12)
    assert replays["teacher"] < replays["lru"]  # here the teacher's plan is the better one
    config = DQNConfig(**{**TINY_RUN, "total_timesteps": 150}, demo_teacher="ensemble,ensemble_groups")
    train(tiny_resnet_trace, LIMIT, tmp_path / "t.pt", config, log_dir=None, progress=False)
    _, cfg, ckpt = load_agent(tmp_path / "t.pt")
    assert cfg.demo_teacher == "ensemble,ensemble_groups"
    assert ckpt["training"]["demonstrations"][0]["planner"] == "teacher"


def test_demo_teacher_is_refused_without_demonstrations_or_as_a_number():
    with pytest.raises(ValueError, match="demo_teacher needs demonstrations"):
        DQNConfig(demo_teacher="ensemble")
    with pytest.raises(ValueError, match="demo_teacher must be text"):
        DQNConfig(demonstrations="best-baseline", demo_teacher=3)


def test_own_search_is_the_first_demonstration_when_fine_tuning(tiny_resnet_trace, tmp_path):
    """``demonstrations="self"``: each cell's first demonstration is the lookahead's episode with the
    starting agent's network, planned before any update; no baseline is planned."""
    from dqn_swap.agents.dqn import finetune
    from dqn_swap.agents.dqn.planner import search_episode
    from dqn_swap.agents.dqn.policy import GraphBatcher

    start = {k: v for k, v in TINY_RUN.items() if k != "demonstrations"}
    train(tiny_resnet_trace, LIMIT, tmp_path / "a.pt", DQNConfig(**{**start, "total_timesteps": 150}), log_dir=None,
          progress=False)
    net, cfg, _ = load_agent(tmp_path / "a.pt")
    limits = ["50%", "40%"]
    finetune(tmp_path / "a.pt", tiny_resnet_trace, limits, tmp_path / "b.pt", total_timesteps=60, log_dir=None,
             progress=False, config_overrides={"demonstrations": "self"})
    demos = load_agent(tmp_path / "b.pt")[2]["training"]["demonstrations"]
    assert [d["planner"] for d in demos] == ["dqn-search@0"] * 2
    for limit, d in zip(limits, demos):
        env = make_env(tiny_resnet_trace, limit, None, cfg)
        steps = search_episode(net, GraphBatcher(), env, cfg.search_k, cfg.reward_scale)
        assert d["steps"] == len(steps) and d["replayed_overhead"] == pytest.approx(env.result.overhead, abs=1e-12)
    with pytest.raises(ValueError, match="demo_teacher needs demonstrations"):
        DQNConfig(demonstrations="self", demo_teacher="ensemble")
