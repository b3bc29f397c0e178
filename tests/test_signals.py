"""SIGINT and SIGTERM stop a command with one line and exit 130 or 143, leaving no partial file:
commands run in a subprocess, and the signal is sent once the command is under way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dqn_swap.stop import Stopped, outputs_together

# Imports first, then says "ready" and runs the command: the signal is sent only after that, so that
# it reaches the command, not the interpreter's start-up.  SIGINT is set to Python's default first: a
# test run started in the background by a shell hands its children SIGINT ignored (and the commands
# keep what their caller ignores, as the last test checks).
_CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "from dqn_swap.cli import main; print('ready', flush=True); sys.exit(main(sys.argv[1:]))")


@pytest.fixture
def sigint_default() -> "Iterator[None]":
    """SIGINT raises KeyboardInterrupt in this test, whatever the test run was started with."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    w = build_workload("resnet_tiny", 8, "meta")
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta").save(
        tmp_path_factory.mktemp("signals") / "t.trace")


def _run_and_signal(args: list[str], cwd: Path, signum: int, when: "float | Path") -> tuple[int, str]:
    """Start ``dqn-swap ARGS``; once it is ready, wait ``when`` seconds (or for the file ``when`` to
    appear), send ``signum``; return the exit status and stderr."""
    p = subprocess.Popen([sys.executable, "-c", _CHILD, *args], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 120
    if isinstance(when, Path):
        while not when.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        time.sleep(when)
    assert p.poll() is None, "the command ended before the signal: make it longer"
    p.send_signal(signum)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the command did not stop within 60 s of the signal")
    return p.returncode, err


@pytest.mark.subprocess
@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_plan_stopped_midway_writes_nothing(trace: Path, tmp_path: Path, signum: int, status: int) -> None:
    code, err = _run_and_signal(["plan", str(trace), "-m", "40%", "--planner", "optimal", "-o", "p.json"],
                                tmp_path, signum, 1.0)
    line = err.strip()
    assert code == status, err
    assert line == f"dqn-swap plan: stopped by {signal.Signals(signum).name}; nothing more was written"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_train_stopped_before_its_first_evaluation_leaves_nothing(trace: Path, tmp_path: Path, signum: int,
                                                                  status: int) -> None:
    code, err = _run_and_signal(["train", str(trace), "-m", "50%", "--steps", "100000", "--set",
                                 "eval_every=50000", "-o", "a.pt"], tmp_path, signum, tmp_path / "runs")
    assert code == status, err
    assert err.strip().endswith("stopped before its first evaluation: nothing was kept"), err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no agent, no resume file, no log folder


@pytest.mark.subprocess
def test_train_stopped_after_an_evaluation_says_how_to_resume(trace: Path, tmp_path: Path) -> None:
    code, err = _run_and_signal(["train", str(trace), "-m", "50%", "--steps", "100000", "--set", "eval_every=200",
                                 "--set", "learning_starts=100", "-o", "a.pt"], tmp_path, signal.SIGTERM,
                                tmp_path / "a.pt.resume")
    assert code == 143, err
    line = err.strip().splitlines()[-1]
    assert "a.pt.resume holds the run so far: continue it with dqn-swap train" in line and "--resume" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt.resume", "runs"]
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


class _SignalsInFinaliser:
    """Sends SIGINT to this process from ``__del__``: the handler runs inside the finaliser, where
    Python drops the exception it raises ("Exception ignored in ...")."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_whose_exception_was_lost_stops_at_the_next_report_and_writes_nothing(
        tmp_path: Path, sigint_default: None) -> None:
    """A signal's exception dropped on its way (here inside a finaliser; in CI once inside a planning
    run, which then went on for a minute) still stops the command: at its next progress report, or
    before its next file, whichever comes first."""
    from dqn_swap import stop
    from dqn_swap.files import write_text
    from dqn_swap.progress import progress

    with stop.installed():
        _SignalsInFinaliser()  # collected at once
        time.sleep(0.05)  # still running: the exception was lost
        with pytest.raises(Stopped) as info:
            progress("plan", enabled=False)("round 2")
        assert info.value.signum == signal.SIGINT
        with pytest.raises(Stopped):
            write_text(tmp_path / "p.json", "{}")
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after the command
    stop.check()  # and forgotten


def test_outputs_written_together_finish_before_the_signal_stops_them(tmp_path: Path, sigint_default: None) -> None:
    """``compare`` writes its table, CSV and plots inside ``outputs_together``: a signal midway waits
    for the last of them, then stops the command with a line saying they are whole."""
    from dqn_swap.files import write_text

    with pytest.raises(Stopped) as info:
        with outputs_together("the table and the CSV"):
            write_text(tmp_path / "a.md", "table\n")
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            write_text(tmp_path / "b.csv", "x\n")
    assert info.value.exit_status == 130 and "the table and the CSV were written whole" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.csv"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.subprocess
def test_an_output_folder_removed_midway_is_made_again_and_the_run_ends_whole(trace: Path, tmp_path: Path) -> None:
    """``train -o out/a.pt`` whose folder is removed while it trains: the next evaluation makes the
    folder again (the agent is the user's asked-for output), and the run ends with a whole agent
    that loads, and no temporary file."""
    import shutil

    from dqn_swap.agents.dqn import load_agent

    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([sys.executable, "-c", _CHILD, "train", str(trace), "-m", "50%", "--steps", "400",
                          "--set", "eval_every=100", "--set", "learning_starts=50", "-o", "out/a.pt"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "a.pt.resume").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(out)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0 and "Traceback" not in err, err
    load_agent(out / "a.pt")
    assert not any(x.name.endswith(".tmp") for x in tmp_path.rglob("*"))


def test_a_signal_ignored_by_the_caller_stays_ignored(tmp_path: Path) -> None:
    """A command started with SIGINT ignored (as a shell starts a background job) is not stopped by
    it, even inside a block that notes signals, and the ignoring is left in place after."""
    from dqn_swap.files import write_text

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with outputs_together("the table"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            write_text(tmp_path / "a.md", "table\n")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert (tmp_path / "a.md").read_text() == "table\n"


def test_a_stopped_train_does_not_wait_forever_for_its_log_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer whose close never returns (its thread stuck) holds a stopped run up only for
    ``CLOSE_WAIT`` seconds; the writer list is emptied."""
    import threading

    from dqn_swap.agents.dqn import algorithm

    class Stuck:
        def __init__(self) -> None:
            self.never = threading.Event()

        def close(self) -> None:
            self.never.wait()

    monkeypatch.setattr(algorithm, "CLOSE_WAIT", 0.2)
    writers = [Stuck(), Stuck()]
    start = time.monotonic()
    algorithm._close(writers)
    assert time.monotonic() - start < 2.0 and writers == []
