"""Writers racing for one output, in threads of one process and in processes: of several runs of a
command into one new name, exactly one wins and the others refuse in one line; with ``--force``
every run ends whole and the name holds one of them, whole.  Nothing a run wrote is half-written,
and no temporary file is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import pytest

from dqn_swap.cli import main
from dqn_swap.plan import Plan
from dqn_swap.trace import Trace

RUNS = 4


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("race") / "t.trace"
    assert main(["record", "--model", "resnet_tiny", "--batch-size", "2", "--device", "meta", "-o", str(path)]) == 0
    return path


def _race(args: Callable[[int], list[str]], n: int = RUNS) -> list[int]:
    """Run ``main(args(i))`` in ``n`` threads released together; their exit statuses."""
    barrier = threading.Barrier(n)
    codes: list[int] = [-1] * n

    def one(i: int) -> None:
        barrier.wait()
        try:
            codes[i] = main(args(i))
        except SystemExit as e:  # argparse's own refusals
            codes[i] = int(e.code or 0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return codes


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line or "Traceback" in line]


def _only(folder: Path, *names: str) -> None:
    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted(names), left  # no temporary file beside the output


@pytest.mark.parametrize("planner", ["lru", "greedy", "sqrt-n"])
def test_plans_racing_into_one_new_name_one_wins_the_others_refuse(trace_file: Path, tmp_path: Path, capsys,
                                                                   planner: str) -> None:
    out = tmp_path / "p.json"
    codes = _race(lambda i: ["plan", str(trace_file), "-m", "50%", "--planner", planner, "-o", str(out)])
    err = capsys.readouterr().err
    assert sorted(codes) == [0] + [2] * (RUNS - 1), (codes, err)
    lines = _errors(err)
    assert len(lines) == RUNS - 1 and all("exists" in line and "p.json" in line for line in lines), lines
    Plan.load(out, Trace.load(trace_file))  # whole, and the trace's
    _only(tmp_path, "p.json")


def test_plans_racing_with_force_all_end_whole_and_the_name_holds_one(trace_file: Path, tmp_path: Path,
                                                                       capsys) -> None:
    out = tmp_path / "p.json"
    planners = ["lru", "greedy", "sqrt-n", "vdnn"]
    codes = _race(lambda i: ["plan", str(trace_file), "-m", "50%", "--planner", planners[i], "-o", str(out),
                             "--force"])
    err = capsys.readouterr().err
    assert codes == [0] * RUNS, err
    assert not _errors(err)
    assert json.loads(out.read_text())["planner"] in planners  # one of them, whole
    Plan.load(out, Trace.load(trace_file))
    _only(tmp_path, "p.json")


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_recordings_racing_into_one_name(tmp_path: Path, capsys, force: bool) -> None:
    out = tmp_path / "r.trace"
    codes = _race(lambda i: ["record", "--model", "mlp_tiny", "--batch-size", str(2 + i), "--device", "meta",
                             "-o", str(out)] + (["--force"] if force else []), n=3)
    err = capsys.readouterr().err
    if force:
        assert codes == [0, 0, 0], err
    else:
        assert sorted(codes) == [0, 2, 2], (codes, err)
        assert len(_errors(err)) == 2
    assert Trace.load(out).meta["batch_size"] in (2, 3, 4)  # one recording, whole
    _only(tmp_path, "r.trace")


@pytest.mark.subprocess
def test_two_processes_planning_into_one_name(trace_file: Path, tmp_path: Path) -> None:
    """The same race between two ``dqn-swap plan`` processes: one exits 0, the other 2 with one
    line, and the plan loads."""
    out = tmp_path / "p.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "dqn_swap", "plan", str(trace_file), "-m", "50%", "--planner", "lru", "-o", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert sorted(r for r, _ in results) == [0, 2], results
    loser = next(e for r, e in results if r == 2)
    assert len(loser.strip().splitlines()) == 1 and "exists" in loser
    Plan.load(out, Trace.load(trace_file))
    _only(tmp_path, "p.json")
