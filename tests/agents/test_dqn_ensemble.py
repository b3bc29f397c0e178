"""Ensembles of agents: the mean of their Q-values, one environment, clear errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from dqn_swap.agents.dqn import AgentFileError, DQNConfig, DQNPlanner, QNetwork, save_agent
from dqn_swap.agents.dqn.agent_file import load_ensemble
from dqn_swap.agents.dqn.planner import greedy_q, make_env
from dqn_swap.agents.dqn.policy import GraphBatcher, QEnsemble, q_values


def agent(tmp_path, name: str, seed: int, **config) -> str:
    torch.manual_seed(seed)
    cfg = DQNConfig(**{"p": 8, "T": 2, "total_timesteps": 10, **config})
    return str(save_agent(tmp_path / name, QNetwork(cfg), cfg, trace_fingerprints=[], training={"steps": 10}))


def test_the_ensemble_reads_the_mean_of_its_agents_q(tmp_path, tiny_resnet_trace):
    paths = [agent(tmp_path, f"a{i}.pt", i) for i in range(3)]
    net, config, objs = load_ensemble(paths)
    assert isinstance(net, QEnsemble) and len(objs) == 3 and config.p == 8
    env = make_env(tiny_resnet_trace, "50%", None, config)
    env.reset(seed=0)
    batcher = GraphBatcher()
    key = batcher.register(env.graph)
    with torch.no_grad():
        members = [q_values(m, batcher, [(key, env.state())])[0] for m in net.members]
        mean = q_values(net, batcher, [(key, env.state())])[0]
    assert torch.allclose(mean, torch.stack(members).mean(0), rtol=0, atol=1e-6)
    # and greedy decoding follows the mean, not any one member, where they disagree
    q = greedy_q(net, batcher, env)
    assert int(np.argmax(q)) == int(torch.where(torch.from_numpy(np.isfinite(q)), mean, -torch.inf).argmax())


def test_an_ensemble_of_one_agent_twice_plans_as_the_agent(tmp_path, tiny_resnet_trace):
    path = agent(tmp_path, "a.pt", 0)
    from dqn_swap.limits import resolve_limit

    limit = resolve_limit(tiny_resnet_trace, "40%")
    alone = DQNPlanner(path, threads=1).plan(tiny_resnet_trace, limit)
    twice = DQNPlanner([path, path], threads=1)
    plan = twice.plan(tiny_resnet_trace, limit)
    assert plan.actions == alone.actions and plan.figures == alone.figures
    assert plan.settings["agent"] == [path, path]


def test_agents_of_another_environment_are_refused_in_one_line(tmp_path):
    a = agent(tmp_path, "a.pt", 0)
    b = agent(tmp_path, "b.pt", 1, recompute_chains=True)
    with pytest.raises(AgentFileError) as e:
        load_ensemble([a, b])
    msg = str(e.value)
    assert "\n" not in msg and "b.pt" in msg and "recompute_chains" in msg
    with pytest.raises(AgentFileError, match="at least two"):
        load_ensemble([a])
    with pytest.raises(ValueError, match="at least two"):
        QEnsemble([QNetwork(DQNConfig(p=8, T=2))])


def test_an_ensemble_file_plans_as_its_agents_named_one_by_one(tmp_path, tiny_resnet_trace):
    """save_ensemble writes one file (plain data, weights_only) that plans as the list of its agents,
    goes wherever an agent file does, and is refused where an agent is trained further."""
    from dqn_swap.agents.dqn import load_agent, save_ensemble
    from dqn_swap.limits import resolve_limit

    paths = [agent(tmp_path, f"a{i}.pt", i) for i in range(2)]
    out = save_ensemble(tmp_path / "e.pt", paths)
    raw = torch.load(out, weights_only=True)
    assert raw["format"] == "dqn-swap-ensemble" and len(raw["members"]) == 2 and raw["sources"] == ["a0.pt", "a1.pt"]
    net, config, obj = load_agent(out)
    assert isinstance(net, QEnsemble) and config.p == 8 and len(obj["training"]["members"]) == 2
    limit = resolve_limit(tiny_resnet_trace, "40%")
    one = DQNPlanner(str(out), threads=1).plan(tiny_resnet_trace, limit)
    listed = DQNPlanner(paths, threads=1).plan(tiny_resnet_trace, limit)
    assert one.actions == listed.actions and one.figures == listed.figures
    with pytest.raises(FileExistsError):
        save_ensemble(out, paths)  # nothing a user saved is overwritten
    with pytest.raises(AgentFileError, match="ensemble already"):
        save_ensemble(tmp_path / "e2.pt", [str(out), paths[0]])


def test_fine_tuning_an_ensemble_trains_the_mean_and_writes_an_ensemble(tmp_path, tiny_resnet_trace):
    """finetune on an ensemble file fits the mean of the members' Q-values: every member's weights
    move, each keeps its own configuration, the result is an ensemble file again whose record
    names the fine-tuning traces, and the starting ensemble is never replaced or made worse."""
    from dqn_swap.agents.dqn import finetune, load_agent, save_ensemble

    paths = [agent(tmp_path, "a0.pt", 0), agent(tmp_path, "a1.pt", 1, swap_slack=True)]
    src = save_ensemble(tmp_path / "e.pt", paths)
    before = src.read_bytes()
    res = finetune(str(src), [tiny_resnet_trace], ["50%"], tmp_path / "f.pt", total_timesteps=60, log_dir=None,
                   config_overrides={"learning_starts": 8, "train_frequency": 1, "eval_every": 30, "batch_size": 4,
                                     "learning_rate": 0.05})
    assert src.read_bytes() == before
    raw = torch.load(res.path, weights_only=True)
    old = torch.load(src, weights_only=True)
    assert raw["format"] == "dqn-swap-ensemble" and raw["sources"] == ["a0.pt", "a1.pt"]
    assert [m["config"] for m in raw["members"]] == [m["config"] for m in old["members"]]
    assert raw["training"]["trace_fingerprints"] == [tiny_resnet_trace.fingerprint]
    assert raw["training"]["init_from"] == str(src)
    net, config, obj = load_agent(res.path)
    assert isinstance(net, QEnsemble) and config.swap_slack
    assert obj["training"]["finetuned"]["steps"] == 60
    assert any(e.startswith(str(tiny_resnet_trace.meta.get("model", ""))) for e in obj["training"]["environments"])
    evals = obj["training"]["finetuned"]["evaluations"]
    assert evals[0]["step"] == 0 and obj["training"]["finetuned"]["best"]["score"] <= evals[0]["score"] + 1e-12
    # the last weights trained (the resume file's): every member of the mean moved
    last = torch.load(tmp_path / "f.pt.resume", weights_only=True)["q"]
    for i, m in enumerate(old["members"]):
        assert any(not torch.equal(last[f"members.{i}.{k}"], v) for k, v in m["state_dict"].items())
    assert len({e["score"] for e in evals}) > 1  # and the mean's greedy plan changed with them
    # fine-tuned again, the record before it is kept under "previous"
    again = finetune(str(res.path), [tiny_resnet_trace], ["50%"], tmp_path / "g.pt", total_timesteps=20,
                     log_dir=None, config_overrides={"learning_starts": 8, "eval_every": 20, "batch_size": 4})
    rec = torch.load(again.path, weights_only=True)["training"]
    assert rec["init_from"] == str(res.path) and rec["previous"]["steps"] == 60
    # trained in another environment than its agents plan in: one line naming the file and the field
    from dqn_swap.agents.dqn import train

    with pytest.raises(AgentFileError) as e:
        train([tiny_resnet_trace], ["50%"], tmp_path / "h.pt", DQNConfig(p=8, T=2, total_timesteps=10,
              graph="dataflow"), init_from=str(src), log_dir=None)
    assert "\n" not in str(e.value) and "e.pt" in str(e.value) and "graph" in str(e.value)
    assert not (tmp_path / "h.pt").exists()


def test_the_ensemble_command(tmp_path, capsys):
    from dqn_swap.cli import main

    a, b = agent(tmp_path, "a.pt", 0), agent(tmp_path, "b.pt", 1)
    out = tmp_path / "e.pt"
    assert main(["ensemble", a, b, "-o", str(out), "--json"]) == 0
    assert '"bytes"' in capsys.readouterr().out and out.is_file()
    before = out.read_bytes()
    assert main(["ensemble", a, b, "-o", str(out)]) == 2  # never replaced without --force
    assert out.read_bytes() == before
    c = agent(tmp_path, "c.pt", 2, graph="dataflow")
    assert main(["ensemble", a, c, "-o", str(tmp_path / "f.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "c.pt" in err[-1] and "graph" in err[-1] and not (tmp_path / "f.pt").exists()
    copy = tmp_path / "a_copy.pt"
    copy.write_bytes(Path(a).read_bytes())
    for twice in ([a, a], [a, b, str(copy)]):  # a file named twice, or a copy under another name
        assert main(["ensemble", *twice, "-o", str(tmp_path / "g.pt")]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "the same agent as" in line and "a.pt" in line and not (tmp_path / "g.pt").exists()


@pytest.mark.parametrize("config", [{}, {"readout": "sum", "aggr": "sum"}, {"bias": False},
                                    {"head_features": False}, {"T": 1}, {"T": 3}])
def test_members_run_side_by_side_give_their_own_q(tmp_path, tiny_resnet_trace, config):  # noqa: ANN001
    """The fused forward (members' states side by side, one sparse sum for all) against each member
    run alone, on a batch of two states of different graphs' sizes, for every shape it accepts."""
    paths = [agent(tmp_path, f"a{i}.pt", i, **config) for i in range(3)]
    net, cfg, _ = load_ensemble(paths)
    assert net.fusable
    batcher = GraphBatcher()
    items = []
    for limit in ("50%", "30%"):
        env = make_env(tiny_resnet_trace, limit, None, cfg)
        env.reset(seed=0)
        env.step(int(np.flatnonzero(env.state().valid)[0]))
        items.append((batcher.register(env.graph), env.state()))
    with torch.no_grad():
        fused = q_values(net, batcher, items)[0]
        alone = torch.stack([q_values(m, batcher, items)[0] for m in net.members]).mean(0)
    assert fused.shape == alone.shape and torch.allclose(fused, alone, rtol=1e-5, atol=1e-6)


def test_members_of_other_shapes_run_one_by_one(tmp_path, tiny_resnet_trace):  # noqa: ANN001
    nets = [QNetwork(DQNConfig(p=8, T=2)), QNetwork(DQNConfig(p=16, T=2)), QNetwork(DQNConfig(p=8, T=2, head="mlp"))]
    for members in (nets[:2], [nets[0], nets[2]]):
        ens = QEnsemble(members)
        assert not ens.fusable
        env = make_env(tiny_resnet_trace, "50%", None, DQNConfig(p=8, T=2))
        env.reset(seed=0)
        batcher = GraphBatcher()
        items = [(batcher.register(env.graph), env.state())]
        with torch.no_grad():
            q = q_values(ens, batcher, items)[0]
            assert torch.equal(q, torch.stack([q_values(m, batcher, items)[0] for m in members]).mean(0))
    assert QEnsemble(nets[:1] * 2).fusable


def test_agents_with_and_without_swap_slack_read_their_own_columns(tmp_path, tiny_resnet_trace):
    """An agent without ``swap_slack`` (as every agent trained before it) reads columns 0-10 only:
    its Q does not move when column 11 does; one with it does; an ensemble of both is the mean
    of the two; with two of each, each pair runs side by side and the mean is the members'."""
    old, new = agent(tmp_path, "old.pt", 0), agent(tmp_path, "new.pt", 1, swap_slack=True)
    net, config, _ = load_ensemble([old, new])
    assert not net.fusable and net.groups == [[0], [1]]
    env = make_env(tiny_resnet_trace, "5%", None, config)
    env.reset(seed=0)
    st = env.state()
    assert (st.swap_slack != 0).any()
    flat = dataclasses.replace(st, swap_slack=np.zeros_like(st.swap_slack))
    batcher = GraphBatcher()
    key = batcher.register(env.graph)
    with torch.no_grad():
        q = {name: [q_values(m, batcher, [(key, s)])[0] for s in (st, flat)]
             for name, m in zip(("old", "new"), net.members)}
        both = q_values(net, batcher, [(key, st)])[0]
    assert net.members[0].in_features == 11 and net.members[1].in_features == 12
    assert torch.equal(q["old"][0], q["old"][1])
    assert not torch.equal(q["new"][0], q["new"][1])
    assert torch.allclose(both, (q["old"][0] + q["new"][0]) / 2, rtol=0, atol=1e-6)
    four, _, _ = load_ensemble([old, new, agent(tmp_path, "old2.pt", 2), agent(tmp_path, "new2.pt", 3, swap_slack=True)])
    assert four.groups == [[0, 2], [1, 3]]
    with torch.no_grad():
        mean = q_values(four, batcher, [(key, st)])[0]
        alone = torch.stack([q_values(m, batcher, [(key, st)])[0] for m in four.members]).mean(0)
    assert torch.allclose(mean, alone, rtol=1e-5, atol=1e-6)


def test_members_decoding_keeps_the_best_simulated_plan_of_the_mean_and_every_member(tmp_path, tiny_resnet_trace):
    """``members=True``: the mean's plan and each member's own (each as that agent plans alone), and
    the one of least simulated overhead that fits is returned; ties keep the mean's."""
    from dqn_swap.limits import resolve_limit
    from dqn_swap.simulator import simulate

    paths = [agent(tmp_path, f"a{i}.pt", i) for i in range(3)]
    limit = resolve_limit(tiny_resnet_trace, "40%")
    mean = DQNPlanner(paths, threads=1).plan(tiny_resnet_trace, limit)
    alone = [DQNPlanner(p, threads=1).plan(tiny_resnet_trace, limit) for p in paths]
    plan = DQNPlanner(paths, threads=1, members=True).plan(tiny_resnet_trace, limit)
    candidates = [mean, *alone]
    costs = [(not p.figures["feasible"], p.figures["overhead"] if p.figures["feasible"] else np.inf)
             for p in candidates]
    best = min(range(len(candidates)), key=lambda i: costs[i])  # the first of the least
    assert plan.actions == candidates[best].actions and plan.figures == candidates[best].figures
    label = "+".join(paths)
    assert plan.settings["decoded_by"] == {"agent": label, "member": "mean" if best == 0 else best - 1}
    assert plan.settings["members"] == 3
    assert plan.settings["member_overheads"] == {label: [round(p.figures["overhead"], 6) if p.figures["feasible"]
                                                         else None for p in candidates]}
    assert simulate(tiny_resnet_trace, plan).makespan == pytest.approx(plan.figures["makespan"])
    assert best != 0  # (with these seeds a member's plan beats the mean's: the choice is exercised)
    with pytest.raises(ValueError, match="ensemble"):
        DQNPlanner(paths[0], members=True)


def test_more_agents_are_decoded_in_their_own_environments(tmp_path, tiny_resnet_trace):
    """``more_agents``: agents no ensemble can join (another ``max_chain``) plan in their own
    environment, and their plans are in the running: the result is the best of every agent's own
    plan, with the environment's settings of the agent that made it."""
    from dqn_swap.limits import resolve_limit

    singles = [agent(tmp_path, "a0.pt", 0), agent(tmp_path, "a1.pt", 1)]
    groups = agent(tmp_path, "g.pt", 2, max_chain=3)
    limit = resolve_limit(tiny_resnet_trace, "40%")
    own = [DQNPlanner(p, threads=1).plan(tiny_resnet_trace, limit) for p in (*singles, groups)]
    mean = DQNPlanner(singles, threads=1).plan(tiny_resnet_trace, limit)
    plan = DQNPlanner(singles, threads=1, members=True, more_agents=[groups]).plan(tiny_resnet_trace, limit)
    candidates = [mean, *own]
    cost = [(not p.figures["feasible"], p.figures["overhead"] if p.figures["feasible"] else np.inf) for p in candidates]
    best = min(range(len(candidates)), key=lambda i: cost[i])
    assert plan.actions == candidates[best].actions and plan.figures == candidates[best].figures
    assert plan.settings.get("max_chain", 1) == candidates[best].settings.get("max_chain", 1)
    assert list(plan.settings["member_overheads"]) == ["+".join(singles), groups]
    assert plan.settings["member_overheads"][groups] == [round(own[2].figures["overhead"], 6)
                                                         if own[2].figures["feasible"] else None]
    assert plan.settings["more_agents"] == [groups] and plan.settings["members"] == 3
    with pytest.raises(ValueError, match="decoding by members"):
        DQNPlanner(singles[0], more_agents=[groups])
