"""Agent files: round trip, no silent overwrite, clear errors for bad files; the shipped agents load."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from dqn_swap.agents.dqn import AgentFileError, DQNConfig, DQNPlanner, QNetwork, load_agent, save_agent


@pytest.fixture()
def saved(tmp_path):
    torch.manual_seed(0)
    cfg = DQNConfig(p=8, T=2, total_timesteps=10)
    net = QNetwork(cfg)
    path = save_agent(tmp_path / "a.pt", net, cfg, trace_fingerprints=["abc"], training={"steps": 10})
    return path, net, cfg


def test_round_trip(saved):
    path, net, cfg = saved
    raw = torch.load(path, weights_only=True)  # plain data only
    assert raw["format"] == "dqn-swap-agent" and raw["version"] == 1 and raw["trace_fingerprints"] == ["abc"]
    net2, cfg2, obj = load_agent(path)
    assert cfg2 == cfg and obj["training"]["steps"] == 10
    for k, v in net.state_dict().items():
        assert torch.equal(v, net2.state_dict()[k])


def test_never_overwrites_unless_asked(saved):
    path, net, cfg = saved
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        save_agent(path, QNetwork(cfg), cfg, trace_fingerprints=[])
    assert path.read_bytes() == before
    save_agent(path, QNetwork(cfg), cfg, trace_fingerprints=[], overwrite=True)
    assert path.read_bytes() != before


def one_line_error(path) -> str:
    with pytest.raises(AgentFileError) as err:
        load_agent(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_bad_agent_files(tmp_path, saved):
    path, net, cfg = saved
    assert "no such file" in one_line_error(tmp_path / "missing.pt")
    assert "directory" in one_line_error(tmp_path)
    (tmp_path / "text.pt").write_text("hello")
    one_line_error(tmp_path / "text.pt")
    (tmp_path / "trunc.pt").write_bytes(path.read_bytes()[:200])
    one_line_error(tmp_path / "trunc.pt")
    torch.save({"format": "something-else"}, tmp_path / "other.pt")
    assert "not a dqn-swap agent" in one_line_error(tmp_path / "other.pt")
    raw = torch.load(path, weights_only=True)
    torch.save({**raw, "version": 99}, tmp_path / "v99.pt")
    assert "version 99" in one_line_error(tmp_path / "v99.pt")
    torch.save({**raw, "state_dict": {"bogus": torch.zeros(1)}}, tmp_path / "weights.pt")
    assert "corrupt" in one_line_error(tmp_path / "weights.pt")
    torch.save({**raw, "config": {**raw["config"], "nope": 1}}, tmp_path / "cfg.pt")
    one_line_error(tmp_path / "cfg.pt")


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickled_code_is_refused(tmp_path):
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"format": "dqn-swap-agent", "x": Evil()}, f)
    one_line_error(tmp_path / "evil.pt")


def test_planner_reports_a_bad_agent_file(tmp_path):
    with pytest.raises(AgentFileError):
        DQNPlanner(tmp_path / "nothing.pt")
    assert issubclass(AgentFileError, ValueError)


def test_shipped_agents_load_and_stay_small():
    """Every shipped agent (checkpoints/) loads with weights_only and is a few MB at most."""
    from pathlib import Path

    from dqn_swap.agents.dqn.planner import DEFAULT_AGENT

    shipped = sorted(DEFAULT_AGENT.parent.rglob("*.pt"))
    assert DEFAULT_AGENT in shipped
    for path in shipped:
        net, config, ckpt = load_agent(path)
        assert Path(path).stat().st_size < 4 * 2**20, path
        records = ckpt["training"]["members"] if ckpt["format"] == "dqn-swap-ensemble" else [ckpt["training"]]
        for training in records:  # the training curve travels with the agent (with each of an ensemble's)
            assert training["evaluations"], path


def test_a_shipped_agent_is_found_by_name_from_any_folder(tmp_path, monkeypatch, saved):
    """``ensemble``, ``ensemble.pt`` and ``checkpoints/ensemble.pt`` reach the installed file from a
    folder without one; a file that exists under the name given wins; a name neither a file nor a
    shipped agent gets one line that lists the shipped agents."""
    from dqn_swap import checkpoints
    from dqn_swap.agents.dqn.agent_file import agent_location
    from dqn_swap.agents.dqn.policy import QEnsemble

    monkeypatch.chdir(tmp_path)
    assert {"default", "ensemble", "ensemble_groups"} <= set(checkpoints.names())
    for spec in ("ensemble", "ensemble.pt", "checkpoints/ensemble.pt", "./checkpoints/ensemble.pt"):
        assert agent_location(spec) == checkpoints.path("ensemble.pt"), spec
    net, _, _ = load_agent("ensemble")
    assert isinstance(net, QEnsemble)
    assert agent_location("grid/resnet50") == checkpoints.path("grid/resnet50.pt")
    path, _, cfg = saved  # a user's own file named like a shipped agent is the one read
    (tmp_path / "checkpoints").mkdir()
    mine = tmp_path / "checkpoints" / "ensemble.pt"
    mine.write_bytes(path.read_bytes())
    assert agent_location("checkpoints/ensemble.pt").resolve() == mine
    assert load_agent("checkpoints/ensemble.pt")[1] == cfg
    with pytest.raises(AgentFileError, match=r"^nothing\.pt: no such file \(shipped agents: default, .*ensemble"):
        load_agent("nothing.pt")
    assert DQNPlanner("ensemble").agent_path == Path("ensemble")
