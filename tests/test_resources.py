"""Host memory, address-space caps and file-size caps: refused or reported with one line, before
anything is allocated or left behind."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from dqn_swap.cli import main

# Caps its own address space at what it uses now plus 3 GiB, then runs the command.
_CAPPED = """
import resource, sys
from dqn_swap.cli import main
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + 3 * 2**30, resource.RLIM_INFINITY))
sys.exit(main(sys.argv[1:]))
"""


def test_a_cpu_recording_larger_than_the_host_is_refused_with_both_figures(tmp_path: Path, capsys,
                                                                             monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["record", "--model", "resnet_tiny", "--batch-size", "1000000", "--device", "cpu", "-o", "x.trace"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "resnet_tiny at batch size 1000000 needs about" in err and "GiB is available here" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
@pytest.mark.parametrize("command", [
    ["record", "--model", "mlp_tiny", "--batch-size", "16777216", "--device", "cpu", "-o", "x.trace"],
    ["run", "--model", "mlp_tiny", "--batch-size", "16777216", "-m", "50%", "--device", "cpu", "-o", "r.json"],
])
@pytest.mark.subprocess
def test_an_address_space_cap_counts_as_the_memory_available(tmp_path: Path, command: list[str]) -> None:
    """Under ``ulimit -v`` the command does not start an iteration the cap cannot hold (mlp_tiny at
    16 million samples needs 4.25 GiB; the cap leaves less than 3 GiB)."""
    out = subprocess.run([sys.executable, "-c", _CAPPED, *command], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    err = out.stderr.strip()
    assert out.returncode == 2 and "\n" not in err, err
    assert "at batch size 16777216 needs about 4" in err and "GiB is available here" in err, err
    assert list(tmp_path.iterdir()) == []


_FSIZE = """
import resource, signal, sys
from dqn_swap.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="no file-size limit here")
@pytest.mark.parametrize("command,output", [
    (["record", "--model", "resnet_tiny", "--batch-size", "2", "--device", "meta", "-o", "t.trace"], "t.trace"),
    (["simulate", "TRACE", "-m", "50%", "--planner", "lru", "--json"], None),
    (["plan", "TRACE", "-m", "50%", "--planner", "vdnn", "-o", "p.json"], "p.json"),
    (["compare", "TRACE", "--memory-limits", "50%", "--planners", "lru,vdnn", "-o", "cmp"], "cmp"),
    (["run", "--model", "mlp_tiny", "--batch-size", "4", "-m", "50%", "--device", "cpu", "--steps", "1",
      "--planner", "lru", "-o", "r.json"], "r.json"),
])
@pytest.mark.subprocess
def test_a_full_disk_leaves_no_partial_output(tmp_path: Path, command: list[str], output: str | None) -> None:
    """A file-size cap (what a full disk looks like to a writer): the command fails with one line
    naming the file, and no partial file or folder is left (outputs print to stdout still work)."""
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    w = build_workload("resnet_tiny", 2, "meta")
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta")
    src = trace.save(tmp_path / "src.trace")
    command = [str(src) if a == "TRACE" else a for a in command]
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run([sys.executable, "-c", _FSIZE, *command], cwd=work, capture_output=True, text=True,
                         timeout=300)
    if output is None:
        assert out.returncode == 0, out.stderr
        return
    err = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "cannot be written (File too large)" in err and output in err, err
    assert [p.name for p in work.rglob("*") if p.is_file()] == [], sorted(p.name for p in work.rglob("*"))


def test_running_out_of_host_memory_midway_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """A MemoryError the check could not foresee (another process took the memory) is one line."""
    import dqn_swap.cli.inspect_cmd as inspect_cmd

    def exhausted(*args, **kwargs):
        raise MemoryError

    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    w = build_workload("resnet_tiny", 2, "meta")
    record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta").save(tmp_path / "t.trace")
    monkeypatch.setattr(inspect_cmd, "load_trace", exhausted)
    code = main(["inspect", str(tmp_path / "t.trace")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == "dqn-swap inspect: error: out of host memory (a smaller batch, or --device meta)"
