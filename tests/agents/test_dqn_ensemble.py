"""Ensembles of agents: the mean of their Q-values, one environment, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dqn_swap.agents.dqn import AgentFileError, DQNConfig, DQNPlanner, QNetwork, save_agent
from dqn_swap.agents.dqn.agent_file import load_ensemble
from dqn_swap.agents.dqn.planner import greedy_q, make_env
from dqn_swap.agents.dqn.policy import GraphBatcher, QEnsemble, q_values


def agent(tmp_path, name: str, seed: int, **config) -> str:
    torch.manual_seed(seed)
    cfg = DQNConfig(p=8, T=2, total_timesteps=10, **config)
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
