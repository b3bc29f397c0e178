"""The command line: happy paths and one-line errors with a non-zero exit."""

import json
import subprocess
import sys

import pytest

from dqn_swap.cli import main


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_record_then_inspect(tmp_path, capsys):
    trace = tmp_path / "mlp.trace"
    code, out, err = run(["record", "--model", "mlp_tiny", "--batch-size", "4", "-o", str(trace), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["model"] == "mlp_tiny" and summary["events"] > 0
    code, out, err = run(["inspect", str(trace), "--json"], capsys)
    assert code == 0, err
    info = json.loads(out)
    assert info["peak_bytes"] == summary["peak_bytes"]
    assert (tmp_path / "mlp-memory.png").stat().st_size > 1000
    # Our own plot may be replaced on the next inspect; the trace may not be re-recorded over.
    assert run(["inspect", str(trace)], capsys)[0] == 0
    code, _, err = run(["record", "--model", "mlp_tiny", "-o", str(trace)], capsys)
    assert code == 2 and "already exists" in err


@pytest.mark.parametrize("args,message", [
    (["record", "--model", "resnet9000"], "unknown model 'resnet9000'"),
    (["record", "--model", "gen:mixer:3"], "unknown network family 'mixer'"),
    (["record", "--model", "mlp_tiny", "--batch-size", "0"], "batch size must be a whole number"),
    (["record", "--model", "mlp_tiny", "--profile", "tpu"], "unknown device profile 'tpu'"),
    (["record", "--model", "mlp_tiny", "-o", "/nonexistent-dir/x.trace"], "does not exist"),
    (["record", "--model", "tests.cli.test_cli:broken_workload"], "failed"),
    (["record", "--model", "tests.cli.test_cli:nothing_here"], "cannot load model"),
    (["inspect", "/nonexistent.trace"], "no such file"),
])
def test_bad_input_one_line_nonzero(args, message, capsys):
    code, _, err = run(args, capsys)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


def test_user_plot_is_not_overwritten(tmp_path, capsys):
    trace = tmp_path / "t.trace"
    assert run(["record", "--model", "mlp_tiny", "-o", str(trace)], capsys)[0] == 0
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"user data")
    code, _, err = run(["inspect", str(trace), "--plot", str(mine)], capsys)
    assert code == 2 and "already exists" in err
    assert mine.read_bytes() == b"user data"


def test_unwritable_output(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run(["record", "--model", "mlp_tiny", "-o", str(blocker / "t.trace")], capsys)
    assert code == 2 and "t.trace" in err


@pytest.mark.subprocess
def test_python_dash_m_and_help():
    out = subprocess.run([sys.executable, "-m", "dqn_swap", "--help"], capture_output=True, text=True, check=True)
    assert "record" in out.stdout and "inspect" in out.stdout


def broken_workload(batch_size, device):
    import torch

    from dqn_swap.models import Workload

    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("this model always fails")

    return Workload("broken", Broken(), (torch.randn(batch_size, 2, device=device),), lambda y: y.sum(), None)


def test_an_infeasible_plan_says_where_and_why_the_method_stops(tmp_path, capsys):
    """A planner whose method cannot reach the trace's minimum memory says so in one line; the plan
    file keeps it, and a planner that can reach it says nothing of the kind."""
    trace = tmp_path / "r.trace"
    assert run(["record", "--model", "resnet_tiny", "--batch-size", "8", "-o", str(trace)], capsys)[0] == 0
    code, out, _ = run(["plan", str(trace), "-m", "0%", "--planner", "sqrt-n", "-o", str(tmp_path / "c.json")],
                       capsys)
    assert code == 1
    lines = [ln for ln in out.splitlines() if ln.startswith(("infeasible:", "sqrt-n cannot"))]
    assert lines[0].startswith("infeasible: #") and "recompute only: it never swaps" in lines[1]
    assert "never swaps" in json.loads((tmp_path / "c.json").read_text())["settings"]["limitation"]
    code, out, _ = run(["simulate", str(trace), "-m", "0%", "--planner", "window"], capsys)
    assert code == 0 and "cannot plan down" not in out
