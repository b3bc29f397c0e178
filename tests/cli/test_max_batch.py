"""``dqn-swap max-batch``: the largest batch (or sequence) that fits, on a zoo network, a Hugging
Face model and a user's own module; the edges checked against the traces themselves."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dqn_swap.capacity import largest_sizes, sizes_between
from dqn_swap.cli import main
from dqn_swap.models import build_workload
from dqn_swap.recorder import record_trace


def _mlp_record(n: int):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    return record_trace(model, (torch.randn(n, 64),), lambda y: y.pow(2).mean(), lambda p: torch.optim.Adam(p),
                        device="meta")


def test_the_edges_are_the_last_sizes_that_fit(tmp_path):
    record = _mlp_record
    memory = 4 * 2**20
    found = largest_sizes(record, memory)
    u, a = found["unplanned"], found["any_plan"]
    assert u is not None and a is not None and u < a
    traces = found["traces"]
    # what the search says is what the traces say, one size on either side of each edge
    assert traces[u].peak_bytes <= memory < record(u + 1).peak_bytes
    assert traces[a].minimum_memory <= memory < record(a + 1).minimum_memory
    assert found["probes"] == len(traces) < 50 and not found["capped"]
    assert largest_sizes(record, 1024)["unplanned"] is None  # nothing fits: said, not 0
    assert sizes_between(10, 80, 4) == [10, 20, 40, 80] and sizes_between(None, 5, 3)[0] == 1


def test_max_batch_of_a_zoo_network_answers_with_speeds_and_a_plot(tmp_path, monkeypatch, capsys):
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    assert main(["max-batch", "resnet_tiny", "--memory", "8MiB", "--planner", "lru", "--points", "3", "--cap", "64",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["largest_unplanned"] < answer["largest_planned"] <= answer["largest_any_plan"]
    speeds = answer["speeds"]
    assert [r["size"] for r in speeds][0] == answer["largest_unplanned"] and speeds[0]["fits"] == "unplanned"
    for r in speeds[1:]:
        assert r["fits"] in ("planned", "no plan found")
        if r["fits"] == "planned":
            assert r["peak_bytes"] <= answer["memory_bytes"] and r["planned_time_s"] >= r["unplanned_time_s"]
            assert r["items_per_s"] == pytest.approx(r["size"] / r["planned_time_s"])
    with Image.open(answer["plot"]) as im:
        assert im.size[0] > 500 and len(im.convert("RGB").getcolors(maxcolors=1 << 20)) > 20


def test_max_batch_of_a_hugging_face_model_searches_its_sequence_length(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    assert main(["max-batch", "hf:gpt2", "--memory", "10MiB", "--seq-len", "--batch-size", "4", "--planner", "lru",
                 "--points", "2", "--cap", "32", "--no-plot", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["searched"] == "sequence length" and answer["batch_size"] == 4
    assert 1 <= answer["largest_unplanned"] <= answer["largest_any_plan"] <= 32  # --cap (gpt2 has 128 positions)
    r = answer["speeds"][0]
    assert r["items_per_s"] == pytest.approx(4 * r["size"] / r["planned_time_s"])  # tokens per second
    assert main(["max-batch", "resnet_tiny", "--memory", "20MiB", "--seq-len", "--no-plot"]) == 2
    assert "not a Hugging Face language model" in capsys.readouterr().err


def test_max_batch_of_a_users_own_module(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    Path("own_net.py").write_text(textwrap.dedent('''
        import torch
        from dqn_swap.models import Workload

        def build(batch_size, device):
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).to(device)
            x = torch.randn(batch_size, 64, device=device)
            return Workload("own", model, (x,), lambda y: y.pow(2).mean(), lambda p: torch.optim.Adam(p))
    '''))
    assert main(["max-batch", "own_net:build", "--memory", "4MiB", "--planner", "lru", "--points", "2"]) == 0
    out = capsys.readouterr().out
    assert "largest batch size, unplanned" in out and "samples/s" in out
    assert Path("own_net_build-max-batch.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["--memory", "50%"], "size with a unit"),
    (["--memory", "8GiB", "--batch-size", "4"], "--batch-size goes with --seq-len"),
    (["--memory", "8GiB", "--planner", "lru", "--search-seconds", "2"], "--time-limit is read by"),
])
def test_max_batch_refuses_in_one_line(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["max-batch", "resnet_tiny", "--no-plot", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_sequence_length_is_for_hugging_face_language_models_only():
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="only Hugging Face language models"):
        build_workload("resnet_tiny", 2, seq_len=8)
    with pytest.raises(ValueError, match="longer than the 128 positions"):
        build_workload("hf:gpt2", 2, seq_len=129)
    with pytest.raises(ValueError, match="takes no sequence length"):
        build_workload("hf:vit", 2, seq_len=8)
    w = build_workload("hf:gpt2", 2, seq_len=40)
    assert tuple(w.example_inputs[0].shape) == (2, 40)
