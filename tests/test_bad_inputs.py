"""Every bad input is a clear one-line error: a table of them across the commands and the Python API.

Each command-line case runs ``dqn-swap`` and asserts a non-zero exit status, one line on stderr
that names the file or argument at fault (no traceback), and nothing left behind in the working
folder (no new file, no ``*.tmp``).  Each Python case asserts the exception type and message.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dqn_swap.cli import main
from dqn_swap.trace import Trace

TRACE, PLAN, AGENT = "t.trace", "p.json", "agent.pt"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a good trace, a plan made for it, an agent, and bad versions of each."""
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace
    from dqn_swap.planners import manual_plan, saved_activations

    d = tmp_path_factory.mktemp("bad")
    w = build_workload("resnet_tiny", 2, "meta")
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta",
                         meta={"model": "resnet_tiny", "batch_size": 2})
    trace.save(d / TRACE)
    plan = manual_plan(trace, swap=saved_activations(trace)[:3])
    plan.save(d / PLAN)
    shutil.copy(Path(__file__).resolve().parents[1] / "checkpoints" / "default.pt", d / AGENT)

    def trace_variant(name: str, change: Callable[[dict[str, Any]], None]) -> None:
        with np.load(d / TRACE, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        change(arrays)
        with open(d / name, "wb") as f:
            np.savez_compressed(f, **arrays)

    def set_col(col: str, index: int, value: Any) -> Callable[[dict[str, Any]], None]:
        def change(a: dict[str, Any]) -> None:
            a[col] = a[col].copy()
            a[col][index] = value
        return change

    def no_ops(a: dict[str, Any]) -> None:
        for k in list(a):
            if k.startswith("op_"):
                a[k] = a[k][:0]
        for k in ("event_kind", "event_op", "event_tensor"):
            a[k] = a[k][:0]

    trace_variant("nan.trace", set_col("op_duration", 3, np.nan))
    trace_variant("inf.trace", set_col("op_duration", 3, np.inf))
    trace_variant("kind.trace", set_col("event_kind", 5, 7))
    trace_variant("role.trace", set_col("tensor_role", 2, 9))
    trace_variant("phase.trace", set_col("op_phase", 4, 5))
    trace_variant("huge.trace", set_col("tensor_nbytes", 7, 2**62))
    trace_variant("noops.trace", no_ops)
    trace_variant("nanflops.trace", set_col("op_flops", 0, np.nan))
    (d / "text.trace").write_text("not a trace\n")
    with zipfile.ZipFile(d / "half.trace", "w") as z:
        z.writestr("meta.npy", b"\x93NUMPY")
    (d / "adir.trace").mkdir()

    data = json.loads((d / PLAN).read_text())
    for name, change in {
        "negative.json": lambda p: p.update(memory_limit=-5),
        "zero.json": lambda p: p.update(memory_limit=0),
        "bool.json": lambda p: p.update(memory_limit=True),
        "limit2_64.json": lambda p: p.update(memory_limit=2**64),
        "limit1e30.json": lambda p: p.update(memory_limit=10**30),
        "limitfloat.json": lambda p: p.update(memory_limit=1e30),
        "dup.json": lambda p: p.update(actions=[p["actions"][0], p["actions"][0]]),
        "outside.json": lambda p: p.update(actions=[[10**9, 1, "swap"]]),
        "badkind.json": lambda p: p.update(actions=[[p["actions"][0][0], p["actions"][0][1], "teleport"]]),
        "otherfp.json": lambda p: p.update(trace_fingerprint="0" * 16),
        "v9.json": lambda p: p.update(version=9),
    }.items():
        p = json.loads(json.dumps(data))
        change(p)
        (d / name).write_text(json.dumps(p))
    (d / "corrupt.json").write_text("{not json")

    agent = torch.load(d / AGENT, weights_only=True)
    for name, change in {
        "nan.pt": lambda a: a["state_dict"].__setitem__(next(iter(a["state_dict"])),
                                                        torch.full_like(next(iter(a["state_dict"].values())),
                                                                        float("nan"))),
        "t0.pt": lambda a: a["config"].__setitem__("T", 0),
        "thuge.pt": lambda a: a["config"].__setitem__("T", 10**7),
        "pbool.pt": lambda a: a["config"].__setitem__("p", True),
        "v99.pt": lambda a: a.__setitem__("version", 99),
    }.items():
        a = torch.load(d / AGENT, weights_only=True)
        change(a)
        torch.save(a, d / name)
    (d / "text.pt").write_text("nope")
    os.mkfifo(d / "fifo.trace")
    os.mkfifo(d / "fifo.png")
    (d / "user.png").write_bytes(b"a file of the user's, not a plot of ours")
    os.symlink("nowhere.json", d / "dangling.json")
    os.symlink("nowhere.png", d / "dangling.png")
    (d / "dir.trace").mkdir()
    os.symlink("dir.trace", d / "dirlink")
    for name in ("sock.json", "sock.png"):  # a socket's file, as a server leaves one
        os.mknod(d / name, stat.S_IFSOCK | 0o600)
    del agent
    return d


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    return code, capsys.readouterr().err


# (arguments, words the one line must hold); {d} is the folder of the files above.
CLI_CASES: list[tuple[list[str], str]] = [
    # traces whose contents are wrong
    (["inspect", "nan.trace"], "nan.trace: corrupt trace, op_duration is not finite"),
    (["inspect", "inf.trace"], "inf.trace: corrupt trace, op_duration is not finite"),
    (["simulate", "nan.trace", "-m", "50%", "--planner", "lru"], "nan.trace"),
    (["inspect", "kind.trace"], "kind.trace: corrupt trace, unknown kind 7"),
    (["inspect", "role.trace"], "role.trace: corrupt trace, unknown role 9"),
    (["inspect", "phase.trace"], "phase.trace: corrupt trace, unknown phase 5"),
    (["inspect", "huge.trace"], "huge.trace: corrupt trace, tensor 7 claims"),
    (["inspect", "noops.trace"], "noops.trace: corrupt trace, no ops"),
    (["inspect", "nanflops.trace"], "nanflops.trace: corrupt trace, op_flops is not finite"),
    (["inspect", "text.trace"], "text.trace: not a dqn-swap trace file"),
    (["inspect", "half.trace"], "half.trace"),
    (["inspect", "adir.trace"], "adir.trace: is a directory"),
    (["inspect", "missing.trace"], "missing.trace: no such file"),
    (["simulate", "missing.trace", "-m", "50%"], "missing.trace: no such file"),
    # record
    (["record", "--model", "nosuch", "-o", "x.trace"], "unknown model 'nosuch'"),
    (["record", "--model", "json:dumps", "-o", "x.trace"], "model 'json:dumps'"),
    (["record", "--model", "nosuchmodule:fn", "-o", "x.trace"], "cannot load model 'nosuchmodule:fn'"),
    (["record", "--model", "resnet_tiny", "--device", "cuda", "-o", "x.trace"], "--device cuda"),
    (["record", "--model", "resnet_tiny", "--batch-size", "0", "-o", "x.trace"], "batch size"),
    (["record", "--model", "resnet_tiny", "--batch-size", str(10**20), "-o", "x.trace"], "batch size"),
    (["record", "--model", "resnet_tiny", "-o", TRACE], "t.trace: already exists"),
    (["record", "--model", "resnet_tiny", "-o", "nodir/x.trace"], "directory nodir does not exist"),
    (["record", "--model", "resnet_tiny", "--profile", "nosuch", "-o", "x.trace"], "unknown device profile 'nosuch'"),
    (["record", "--model", "hf:nosuch", "-o", "x.trace"], "hf:nosuch"),
    (["record", "--model", "resnet_tiny", "--device", "tpu", "-o", "x.trace"], "--device"),
    # limits
    (["simulate", TRACE, "-m", "0.5"], "memory limit 0.5 is ambiguous"),
    (["simulate", TRACE, "-m", "-5%"], "a percentage limit must be between 0%"),  # not "expected one argument"
    (["simulate", TRACE, "--memory-limit", "-1GiB"], "a memory limit must be positive, not -1GiB"),
    (["simulate", TRACE, "-m", "150%"], "between 0%"),
    (["simulate", TRACE, "-m", "1"], "memory limit 1 is ambiguous"),
    (["simulate", TRACE, "-m", "16B"], "below the minimum"),
    (["simulate", TRACE, "-m", "infx"], "not a finite number"),
    (["simulate", TRACE, "-m", "abc"], "not a memory limit: 'abc'"),
    (["simulate", TRACE, "--memory-limit=-3GiB"], "must be positive"),
    # planners and plan files
    (["simulate", TRACE, "-m", "50%", "--planner", "nosuch"], "unknown planner 'nosuch'"),
    (["simulate", TRACE, "--plan", "missing.json"], "missing.json: no such file"),
    (["simulate", TRACE, "--plan", "corrupt.json"], "corrupt.json: corrupt plan file"),
    (["simulate", TRACE, "--plan", "negative.json"], "negative.json: memory_limit must be a positive"),
    (["simulate", TRACE, "--plan", "zero.json"], "zero.json: memory_limit must be a positive"),
    (["simulate", TRACE, "--plan", "bool.json"], "bool.json: memory_limit must be a positive"),
    (["simulate", TRACE, "--plan", "dup.json"], "dup.json: more than one action on tensor"),
    (["simulate", TRACE, "--plan", "outside.json"], "outside.json: action"),
    (["simulate", TRACE, "--plan", "badkind.json"], "badkind.json: corrupt plan"),
    (["simulate", TRACE, "--plan", "otherfp.json"], "otherfp.json: made for trace"),
    (["simulate", TRACE, "--plan", "v9.json"], "v9.json: plan format version 9"),
    (["plan", TRACE, "-m", "50%", "-o", PLAN], "p.json: already exists"),
    (["plan", TRACE, "-m", "50%", "-o", "nodir/p.json"], "directory nodir does not exist"),
    (["plan", TRACE, "-m", "50%", "-o", "adir.trace"], "adir.trace: is a directory"),
    (["plan", TRACE, "-m", "50%", "--decode", "nosuch", "-o", "q.json"], "--decode"),
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--agent", "missing.pt", "-o", "q.json"], "missing.pt"),
    # agents
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--agent", "nan.pt", "-o", "q.json"], "nan.pt: corrupt agent file"),
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--agent", "t0.pt", "-o", "q.json"], "t0.pt: corrupt agent file"),
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--agent", "thuge.pt", "-o", "q.json"], "thuge.pt"),
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--agent", "pbool.pt", "-o", "q.json"], "pbool.pt"),
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--agent", "v99.pt", "-o", "q.json"], "v99.pt"),
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--agent", "text.pt", "-o", "q.json"], "text.pt"),
    # compare
    (["compare", TRACE, "--memory-limits", "", "-o", "cmp"], "--memory-limits is empty"),
    (["compare", TRACE, "--planners", "", "-o", "cmp"], "--planners is empty"),
    (["compare", TRACE, "--planners", "lru,nosuch", "-o", "cmp"], "unknown planner 'nosuch'"),
    # an option no chosen planner reads is refused, not ignored
    (["compare", TRACE, "--planners", "lru,greedy", "--agent", AGENT, "-o", "cmp"],
     "--agent is read by auto, dqn, dqn-search, optimal only, and none of the planners chosen (lru, greedy) reads it"),
    (["compare", TRACE, "--planners", "lru,dqn", "--time-limit", "5", "-o", "cmp"],
     "--time-limit is read by auto, dqn-search, optimal only"),
    (["simulate", TRACE, "-m", "50%", "--planner", "greedy", "--agent", AGENT],
     "--agent is read by auto, dqn, dqn-search, optimal only, and --planner greedy does not read it"),
    (["simulate", TRACE, "-m", "50%", "--planner", "lru", "--members"], "--members is read by dqn only"),
    (["simulate", TRACE, "--plan", PLAN, "--planner", "lru"], "--planner does not go with --plan"),
    (["simulate", TRACE, "--plan", PLAN, "--agent", AGENT], "--agent does not go with --plan"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "--decode", "cover", "-o", "q.json"], "--decode is read by dqn"),
    (["plan", TRACE, "-m", "50%", "--planner", "dqn", "--search-seconds", "5", "-o", "q.json"],
     "--time-limit is read by auto, dqn-search, optimal only"),
    (["compare", TRACE, "--memory-limits", "50%,0.5", "-o", "cmp"], "ambiguous"),
    (["compare", TRACE, "-o", TRACE], "t.trace: is a file"),
    # train and finetune
    (["train", TRACE, "-m", "0.5", "-o", "a.pt"], "ambiguous"),
    (["train", TRACE, "-m", "-5%,50%", "-o", "a.pt"], "a percentage limit must be between 0%"),
    (["train", TRACE, "-m", "50%", "-o", "a.pt", "--run-name", "../out"], "run name '../out' must be a plain name"),
    (["train", TRACE, "-m", "50%", "-o", "a.pt", "--log-dir", TRACE], "is a file; the log folder"),
    (["train", TRACE, "-m", "50%", "--set", "learning_rate=abc", "-o", "a.pt"], "learning_rate"),
    (["train", TRACE, "-m", "50%", "--set", "T=0", "-o", "a.pt"], "DQN setting T"),
    (["train", TRACE, "-m", "50%", "--set", "nosuch=1", "-o", "a.pt"], "nosuch"),
    (["train", TRACE, "-m", "50%", "--steps", "0", "-o", "a.pt"], "--steps"),
    (["train", TRACE, "-m", "50%", "-o", "nodir/a.pt"], "directory nodir does not exist"),
    (["train", TRACE, "-m", "50%", "-o", AGENT], "agent.pt: already exists"),
    (["train", "missing.trace", "-m", "50%", "-o", "a.pt"], "missing.trace"),
    (["finetune", TRACE, "--from", "missing.pt", "-o", "a.pt"], "missing.pt"),
    (["finetune", TRACE, "--from", "nan.pt", "-o", "a.pt"], "nan.pt: corrupt agent file"),
    # one of dqn-swap's files given where another kind is meant: the line names what it is
    (["finetune", TRACE, "--from", TRACE, "-o", "a.pt"], "t.trace: a trace file (dqn-swap record), not an agent file"),
    (["inspect", AGENT], "agent.pt: an agent file (dqn-swap train), not a trace file"),
    (["inspect", PLAN], "p.json: a plan file (dqn-swap plan), not a trace file"),
    (["simulate", TRACE, "--plan", TRACE], "t.trace: a trace file (dqn-swap record), not a plan file"),
    (["simulate", TRACE, "--plan", AGENT], "agent.pt: an agent file (dqn-swap train), not a plan file"),
    (["plan", TRACE, "-m", "50%", "--agent", PLAN, "-o", "q.json"], "p.json: a plan file (dqn-swap plan), not an agent file"),
    (["finetune", TRACE, "--from", "text.pt", "-o", "a.pt"], "text.pt"),
    # run
    (["run", "--model", "mlp_tiny", "-m", "infx", "--device", "cpu"], "not a finite number"),
    (["run", "--model", "mlp_tiny", "--batch-size", str(10**20), "-m", "50%", "--device", "cpu"], "batch size"),
    (["run", "--model", "nosuch", "-m", "50%", "--device", "cpu"], "unknown model 'nosuch'"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--methods", "nosuch", "--device", "cpu"], "unknown method"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--steps", "0", "--device", "cpu"], "--steps"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--planner", "lru", "--agent", AGENT, "--device", "cpu"],
     "--agent is read by auto, dqn, dqn-search, optimal only"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--max-batch", ",", "--device", "cpu"], "--max-batch is empty"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--budget", "50%", "--device", "cpu"],
     "--budget is the memory budget of --max-batch"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--device", "cuda"], "--device cuda"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--device", "cpu", "-o", PLAN], "p.json: already exists"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--device", "cpu", "--planner", "nosuch"], "nosuch"),
    # one set of bounds for limits, counts and sizes
    (["simulate", TRACE, "--plan", "limit2_64.json"], "limit2_64.json: memory_limit must be a positive number"),
    (["simulate", TRACE, "--plan", "limit1e30.json"], "limit1e30.json: memory_limit must be a positive number"),
    (["simulate", TRACE, "--plan", "limitfloat.json"], "limitfloat.json: memory_limit must be a positive"),
    (["simulate", TRACE, "-m", "1e30", "--planner", "lru"], "beyond any device"),
    (["simulate", TRACE, "-m", "2000TiB", "--planner", "lru"], "beyond any device"),
    (["train", TRACE, "-m", "50%", "--threads", "0", "-o", "a.pt"], "--threads: must be a whole number of threads"),
    (["train", TRACE, "-m", "50%", "--threads", "-3", "-o", "a.pt"], "--threads: must be a whole number"),
    (["train", TRACE, "-m", "50%", "--threads", "1e9", "-o", "a.pt"], "--threads: must be a whole number"),
    (["train", TRACE, "-m", "50%", "--steps", "0", "-o", "a.pt"], "--steps: must be a whole number of steps"),
    (["train", TRACE, "-m", "50%", "--steps", "-5", "-o", "a.pt"], "--steps: must be a whole number"),
    (["train", TRACE, "-m", "50%", "--seed", "-1", "-o", "a.pt"], "--seed: must be a whole number of seed"),
    (["finetune", TRACE, "--from", AGENT, "--steps", "0", "-o", "b.pt"], "--steps: must be a whole number"),
    (["record", "--model", "mlp_tiny", "--seed", "x", "-o", "x.trace"], "--seed: must be a whole number"),
    (["run", "--model", "mlp_tiny", "-m", "50%", "--device", "cpu", "--steps", "0"], "--steps: must be a whole"),
    # odd inputs and outputs: devices, a FIFO, a folder, empty and overlong names, a name with a tab
    (["inspect", "/dev/null"], "/dev/null: is a device, not a regular file"),
    (["inspect", "/dev/zero"], "/dev/zero: is a device, not a regular file"),
    (["inspect", "fifo.trace"], "fifo.trace: is a FIFO (named pipe), not a regular file"),
    (["inspect", "dir.trace"], "dir.trace: is a directory, not a trace file"),
    (["inspect", "-"], "-: no such file"),
    (["simulate", TRACE, "--plan", "/dev/null"], "/dev/null: is a device"),
    (["simulate", TRACE, "--plan", "fifo.trace"], "fifo.trace: is a FIFO"),
    (["simulate", TRACE, "--plan", "dir.trace"], "dir.trace: is a directory, not a plan file"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "-o", ""], "the output's name is empty"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "-o", "."], ".: is a directory, not a file to write"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "-o", ".."], "..: is a directory, not a file to write"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "-o", "/"], "/: ends with a separator"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "-o", "x" * 256], "File name too long"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "-o", "/dev/full", "--force"], "is not a regular file"),
    (["plan", TRACE, "-m", "50%", "--planner", "lru", "-o", "fifo.trace", "--force"], "is not a regular file"),
    (["plan", TRACE, "-m", "", "--planner", "lru", "-o", "e.json"], "empty memory limit"),
    (["plan", TRACE, "-m", "50%%", "--planner", "lru", "-o", "e.json"], "not a memory limit: '50%%'"),
    (["plan", TRACE, "-m", "nan%", "--planner", "lru", "-o", "e.json"], "is not a finite number"),
    (["plan", TRACE, "-m", "inf", "--planner", "lru", "-o", "e.json"], "is not a finite number"),
    (["plan", TRACE, "-m", "-5GiB", "--planner", "lru", "-o", "e.json"], "must be positive, not -5GiB"),
    (["record", "--model", "", "-o", "r.trace"], "unknown model ''"),
    (["record", "--model", ":", "-o", "r.trace"], "cannot load model ':'"),
    (["record", "--model", "json:loads", "-o", "r.trace"], "loads(batch_size, device) raised TypeError"),
    (["compare", TRACE, "--memory-limits", ",,,", "-o", "c"], "--memory-limits is empty"),
    (["compare", TRACE, "--planners", ",", "-o", "c"], "--planners is empty"),
    (["train", TRACE, "-m", "50%", "--reference", "nosuch.pt", "--steps", "5", "-o", "a.pt"],
     "nosuch.pt: no such agent file (--reference)"),
    (["train", TRACE, "-m", "50%", "--reference", TRACE, "--steps", "5", "-o", "a.pt"], "not an agent file"),
    # the command itself
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["simulate"], "the following arguments are required"),
]


@pytest.mark.parametrize("args,words", CLI_CASES, ids=[" ".join(a)[:60] for a, _ in CLI_CASES])
def test_command_line(files: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                      args: list[str], words: str) -> None:
    monkeypatch.chdir(files)
    before = sorted(p.name for p in files.rglob("*"))
    code, err = cli(args, capsys)
    line = err.strip()
    assert code != 0, f"exit status {code} for a bad input"
    assert "Traceback" not in err and "\n" not in line, err
    assert words in line, line
    assert sorted(p.name for p in files.rglob("*")) == before, "something was left behind"


# Every command that writes, against every kind of output a user can get wrong: refused in one line
# before any work, with nothing left behind and nothing of the user's touched.
WRITERS: dict[str, tuple[list[str], str, bool]] = {  # command -> (arguments before the output, option, a plot)
    "record": (["record", "--model", "mlp_tiny", "--batch-size", "2"], "-o", False),
    "plan": (["plan", TRACE, "-m", "50%", "--planner", "lru"], "-o", False),
    "run": (["run", "--model", "mlp_tiny", "-m", "50%", "--device", "cpu", "--planner", "lru"], "-o", False),
    "train": (["train", TRACE, "-m", "50%", "--steps", "5"], "-o", False),
    "finetune": (["finetune", TRACE, "--from", AGENT, "--steps", "5"], "-o", False),
    "inspect": (["inspect", TRACE], "--plot", True),
    "explain": (["explain", PLAN, "--trace", TRACE], "--plot", True),
    "max-batch": (["max-batch", "mlp_tiny", "--memory", "1MiB", "--planner", "lru"], "--plot", True),
}
ODD_OUTPUTS: list[tuple[str, str, bool, str]] = [  # (output, for a plot, --force, words)
    ("", "", False, "the output's name is empty"),
    (".", ".", False, "is a directory"),
    ("sub/", "sub/", False, "ends with a separator"),
    ("/dev/null", "/dev/null", True, "is not a regular file"),
    ("fifo.trace", "fifo.png", True, "is not a regular file"),
    (PLAN, "user.png", False, "already exists"),
    ("dangling.json", "dangling.png", False, "is a link"),
    ("nodir/out.json", "nodir/out.png", False, "does not exist"),
    (f"{PLAN}/out.json", "user.png/out.png", False, "is a file, not a folder"),
    ("dirlink", "dirlink", False, "is a directory"),
    ("sock.json", "sock.png", True, "is not a regular file"),
    ("y" * 300 + ".json", "y" * 300 + ".png", False, "File name too long"),
]
WRITE_CASES = [(cmd, out, plot_out, force, words) for cmd in WRITERS for out, plot_out, force, words in ODD_OUTPUTS]


COMPARE_OUTPUTS = [("", "the folder's name is empty"), ("/dev/null", "is not a regular file (a device"),
                   ("fifo.trace", "is not a regular file (a device"), (PLAN, "p.json: is a file"),
                   ("dangling.json", "is a link to nothing"), ("nodir/sub", "directory nodir does not exist"),
                   (f"{PLAN}/sub", "p.json is a file, not a folder"), ("sock.json", "is not a regular file"),
                   ("y" * 300, "File name too long")]
WRITE_CASES += [("compare", out, out, False, words) for out, words in COMPARE_OUTPUTS]
WRITERS["compare"] = (["compare", TRACE, "--planners", "lru", "--memory-limits", "50%"], "-o", False)


@pytest.mark.parametrize("cmd,out,plot_out,force,words", WRITE_CASES,
                         ids=[f"{c} {o or repr(o)}{' --force' if f else ''}" for c, o, _, f, _ in WRITE_CASES])
def test_every_writer_refuses_every_odd_output(files: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, cmd: str, out: str, plot_out: str,
                                               force: bool, words: str) -> None:
    monkeypatch.chdir(files)
    args, option, plot = WRITERS[cmd]
    before = {p.name: (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
              for p in files.iterdir()}
    code, err = cli([*args, option, plot_out if plot else out, *(["--force"] if force else [])], capsys)
    line = err.strip()
    assert code != 0 and "Traceback" not in err and "\n" not in line, err
    assert words in line, line
    after = {p.name: (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
             for p in files.iterdir()}
    assert after == before, "something was left behind or changed"


# Every command that takes a memory limit, against every malformed one: (command, how the limit is
# given, arguments after it); and (limit, words). A syntax error is refused before any recording.
LIMIT_TAKERS = {
    "simulate": ["simulate", TRACE, "--planner", "lru", "-m"],
    "plan": ["plan", TRACE, "--planner", "lru", "-o", "q.json", "-m"],
    "train": ["train", TRACE, "--steps", "5", "-o", "a.pt", "-m"],
    "compare": ["compare", TRACE, "--planners", "lru", "-o", "cmp", "--memory-limits"],
    "run": ["run", "--model", "mlp_tiny", "--device", "cpu", "--planner", "lru", "-m"],
}
BAD_LIMITS = [("50%%", "not a memory limit: '50%%'"), ("0", "must be positive, not 0"),
              ("100.5%", "between 0%"), ("1e400", "not a finite number"), ("0x10", "not a memory limit: '0x10'"),
              ("GiB", "not a memory limit: 'GiB'"), ("%", "not a memory limit: '%'"), ("0x", "must be positive"),
              ("-0.5x", "must be positive"), ("nanGiB", "nanGiB"), ("5KB", "below the minimum")]
LIMIT_CASES = [(cmd, limit, words) for cmd in LIMIT_TAKERS for limit, words in BAD_LIMITS
               if not (cmd == "run" and limit == "5KB")]  # run learns its minimum by recording: covered elsewhere


@pytest.mark.parametrize("cmd,limit,words", LIMIT_CASES, ids=[f"{c} {m}" for c, m, _ in LIMIT_CASES])
def test_every_limit_taker_refuses_every_malformed_limit(files: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, cmd: str, limit: str,
                                                         words: str) -> None:
    monkeypatch.chdir(files)
    before = sorted(p.name for p in files.rglob("*"))
    code, err = cli([*LIMIT_TAKERS[cmd], limit], capsys)
    line = err.strip()
    assert code != 0 and "Traceback" not in err and "\n" not in line, err
    assert words in line, line
    assert sorted(p.name for p in files.rglob("*")) == before, "something was left behind"


@pytest.mark.parametrize("args", [
    ["record", "--model", "mlp_tiny", "-o", "x.trace"], ["inspect", TRACE], ["simulate", TRACE, "-m", "50%"],
    ["plan", TRACE, "-m", "50%", "-o", "x.json"], ["explain", PLAN], ["max-batch", "mlp_tiny", "--memory", "1GiB"],
    ["compare", TRACE, "-o", "c"], ["train", TRACE, "-m", "50%", "-o", "a.pt"],
    ["finetune", TRACE, "--from", AGENT, "-o", "b.pt"], ["run", "--model", "mlp_tiny", "-m", "50%"],
    ["ensemble", AGENT, "-o", "e.pt"]], ids=lambda a: a[0])
def test_every_command_with_standard_output_closed_says_so_and_does_nothing(
        files: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    """Started with standard output closed (``>&-``, Python's ``sys.stdout`` is None): one line on
    standard error, exit status 2, before any work (nothing written)."""
    monkeypatch.chdir(files)
    before = sorted(p.name for p in files.iterdir())
    monkeypatch.setattr("sys.stdout", None)
    code = main(args)
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "standard output is closed" in err, err
    assert sorted(p.name for p in files.iterdir()) == before


def test_unreadable_output_folder_fails_before_any_work(files: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    monkeypatch.chdir(files)
    ro = files / "readonly"
    ro.mkdir()
    ro.chmod(0o500)
    code, err = cli(["train", TRACE, "-m", "50%", "-o", "readonly/a.pt"], capsys)
    assert code == 2 and "not writable" in err


# --------------------------------------------------------------------------- the Python API
def _api_cases(files: Path) -> list[tuple[Callable[[], Any], type[BaseException], str]]:
    import torch.nn.functional as F

    import dqn_swap
    from dqn_swap.agents.dqn import load_agent
    from dqn_swap.env import SwapRecomputeEnv
    from dqn_swap.models import build_workload
    from dqn_swap.plan import Plan, PlanError
    from dqn_swap.recorder import RecordingError, record_trace
    from dqn_swap.runtime import PlannedExecution
    from dqn_swap.simulator import simulate
    from dqn_swap.trace import TraceError

    trace = Trace.load(files / TRACE)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 4))
    y_cpu = torch.randint(0, 4, (2,))
    return [
        (lambda: Trace.load(files / "nan.trace"), TraceError, "not finite"),
        (lambda: Trace.load(files / "noops.trace"), TraceError, "no ops"),
        (lambda: SwapRecomputeEnv(trace, "abc"), ValueError, "not a memory limit"),
        (lambda: SwapRecomputeEnv(trace, 0.5), ValueError, "ambiguous"),
        (lambda: SwapRecomputeEnv(str(files / "missing.trace"), "50%"), TraceError, "no such file"),
        (lambda: dqn_swap.MemoryLimit.parse(True), ValueError, "not a memory limit"),
        (lambda: build_workload("nosuch", 2), ValueError, "unknown model"),
        (lambda: build_workload("resnet_tiny", 0), ValueError, "batch size"),
        (lambda: build_workload("resnet_tiny", 10**20), ValueError, "batch size"),
        (lambda: dqn_swap.get_planner("nosuch"), ValueError, "unknown planner"),
        (lambda: Plan.load(files / "dup.json", trace), PlanError, "more than one action"),
        (lambda: Plan.load(files / "negative.json", trace), PlanError, "memory_limit"),
        (lambda: PlannedExecution(None, Plan.load(files / PLAN), Trace.load(files / TRACE).with_durations(
            trace.op_duration * 2)), PlanError, "made for trace"),
        (lambda: simulate(trace.with_durations(trace.op_duration * 2), Plan.load(files / PLAN)), PlanError,
         "made for trace"),
        (lambda: load_agent(files / "nan.pt"), ValueError, "not finite"),
        (lambda: load_agent(files / "thuge.pt"), ValueError, "DQN setting T"),
        (lambda: record_trace(mlp, torch.randn(2, 8, device="meta"),
                              lambda out: F.cross_entropy(out, y_cpu.reshape(-1)),
                              lambda p: torch.optim.SGD(p, lr=0.1), device="meta"),
         RecordingError, "cpu tensor"),
    ]


def test_python_api(files: Path) -> None:
    cases = _api_cases(files)
    assert len(cases) + len(CLI_CASES) >= 60
    for i, (call, error, words) in enumerate(cases):
        with pytest.raises(error) as info:
            call()
        message = str(info.value)
        assert words in message, f"case {i}: {message}"
        assert "\n" not in message.strip(), f"case {i}: {message}"


@pytest.mark.parametrize("fields,words", [
    ({"model_type": "vit", "image_size": "abc", "hidden_size": 32, "num_hidden_layers": 1,
      "num_attention_heads": 2, "intermediate_size": 64, "patch_size": 4}, "image_size"),
    ({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
      "intermediate_size": 64, "vocab_size": 100, "attn_implementation": "flash_attention_2"}, "FlashAttention2"),
    ({"model_type": "llama", "hidden_size": -4, "num_hidden_layers": 1, "num_attention_heads": 2,
      "intermediate_size": 64, "vocab_size": 100}, "cfg"),
    ({"model_type": "nosuchtype"}, "not a Hugging Face model configuration"),
])
def test_a_hugging_face_config_the_library_rejects(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, fields: dict, words: str) -> None:
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(fields))
    code, err = cli(["record", "--model", "hf:cfg", "--batch-size", "2", "--device", "meta", "-o", "x.trace"], capsys)
    line = err.strip()
    assert code == 2 and "Traceback" not in err and "\n" not in line, err
    assert "cfg" in line and words in line, line
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cfg", "config.json"]


def _type_cases(files: Path) -> list[tuple[str, Callable[[], Any], type[BaseException], str]]:
    import dqn_swap
    from dqn_swap.plan import Plan
    from dqn_swap.recorder import RecordingError, record_trace
    from dqn_swap.runtime import PlannedExecution
    from dqn_swap.simulator import simulate
    from dqn_swap.integrations import AutoPlanError

    trace = Trace.load(files / TRACE)
    plan = Plan.load(files / PLAN)
    m = torch.nn.Linear(4, 2)
    x = torch.randn(2, 4)

    def loss(out: torch.Tensor) -> torch.Tensor:
        return out.sum()

    def sgd(p: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(p, lr=0.1)

    from dqn_swap.capacity import largest_sizes
    from dqn_swap.explain import explain_plan
    from dqn_swap.plan import PlanError

    other = Trace.load(files / TRACE).replace(op_duration=trace.op_duration * 2)
    from dqn_swap.planners import manual_plan, saved_activations

    acts = saved_activations(trace)
    twice = torch.nn.Linear(4, 2)
    return [
        ("explain_plan trace", lambda: explain_plan(str(files / TRACE), plan), TypeError,
         "trace must be a Trace (Trace.load(path) reads one), not str"),
        ("explain_plan plan", lambda: explain_plan(trace, str(files / PLAN)), TypeError,
         "plan must be a Plan (Plan.load(path) reads one), not str"),
        ("explain_plan depth", lambda: explain_plan(trace, plan, depth=0), ValueError, "depth must be a whole number"),
        ("explain_plan another trace", lambda: explain_plan(other, plan), PlanError, "made for trace"),
        ("largest_sizes record", lambda: largest_sizes("resnet50", 2**30), TypeError, "record must be a function"),
        ("largest_sizes memory", lambda: largest_sizes(lambda n: trace, "16GiB"), ValueError,
         "memory must be a whole number from 1, not '16GiB'"),
        ("largest_sizes cap", lambda: largest_sizes(lambda n: trace, 2**30, start=8, cap=4), ValueError,
         "start (8) is above cap (4)"),
        ("autoplan planning", lambda: dqn_swap.autoplan(m, "50%", planning="later"), AutoPlanError,
         "planning='later': one of inline, background"),
        ("autoplan log_every", lambda: dqn_swap.autoplan(m, "50%", log_every=0), AutoPlanError,
         "log_every=0: a whole number of steps"),
        ("autoplan tensorboard", lambda: dqn_swap.autoplan(m, "50%", tensorboard=5), TypeError, "tensorboard"),
        ("autoplan model", lambda: dqn_swap.autoplan("model", "50%"), AutoPlanError, "torch.nn.Module, got str"),
        ("autoplan limit", lambda: dqn_swap.autoplan(m, [1, 2]), ValueError, "not a memory limit: [1, 2]"),
        ("autoplan limit tensor", lambda: dqn_swap.autoplan(m, torch.tensor(10**9)), ValueError,
         "not a memory limit: a Tensor; give a number of bytes"),
        ("Plan.load trace path", lambda: Plan.load(files / PLAN, str(files / TRACE)), TypeError,
         "trace must be a Trace (Trace.load(path) reads one) or None, not str"),
        ("autoplan planner type", lambda: dqn_swap.autoplan(m, "50%", planner=5), TypeError, "planner must be str"),
        ("autoplan planner name", lambda: dqn_swap.autoplan(m, "50%", planner="nosuch"), AutoPlanError,
         "unknown planner 'nosuch'"),
        ("autoplan optimizer", lambda: dqn_swap.autoplan(m, "50%", optimizer="adam"), AutoPlanError,
         "optimizer must be a torch.optim.Optimizer"),
        ("autoplan new_shapes", lambda: dqn_swap.autoplan(m, "50%", new_shapes="maybe"), AutoPlanError,
         "new_shapes='maybe'"),
        ("autoplan cache", lambda: dqn_swap.autoplan(m, "50%", cache=5), TypeError, "cache must be a file name"),
        ("autoplan planner_options", lambda: dqn_swap.autoplan(m, "50%", planner_options=[1]), TypeError,
         "planner_options must be dict or None, not list"),
        ("autoplan runtime_options", lambda: dqn_swap.autoplan(m, "50%", runtime_options="x"), TypeError,
         "runtime_options must be dict or None"),
        ("autoplan allow_infeasible", lambda: dqn_swap.autoplan(m, "50%", allow_infeasible="yes"), TypeError,
         "allow_infeasible must be bool"),
        ("record model", lambda: record_trace(None, x, loss, sgd), TypeError, "model must be a torch.nn.Module"),
        ("record loss", lambda: record_trace(m, x, 5, sgd), TypeError, "loss_fn must be callable or None, not int"),
        ("record optimizer", lambda: record_trace(m, x, loss, "sgd"), TypeError, "optimizer (an optimizer"),
        ("record device", lambda: record_trace(m, x, loss, sgd, device="tpu9"), RecordingError, "device 'tpu9'"),
        ("record meta", lambda: record_trace(m, x, loss, sgd, meta=[1]), TypeError, "meta must be dict or None"),
        ("record inputs", lambda: record_trace(m, x, loss, sgd, inputs="maybe"), RecordingError, "unknown inputs"),
        ("simulate plan path", lambda: simulate(trace, "p.json"), TypeError, "Plan.load(path) reads a file"),
        ("simulate trace", lambda: simulate("t.trace", plan), TypeError, "trace must be dqn_swap.Trace, not str"),
        ("plan load", lambda: Plan.load(5), TypeError, "path must be a file name"),
        ("trace load", lambda: Trace.load(None), TypeError, "path must be a file name"),
        ("limit list", lambda: dqn_swap.MemoryLimit.parse([1]), ValueError, "not a memory limit: [1]"),
        ("limit dict", lambda: dqn_swap.MemoryLimit.parse({"a": 1}), ValueError, "not a memory limit"),
        ("runtime plan", lambda: PlannedExecution(m, None, trace), TypeError, "plan must be dqn_swap.Plan"),
        ("runtime trace", lambda: PlannedExecution(m, plan, "t.trace"), TypeError, "trace must be dqn_swap.Trace"),
        ("runtime model", lambda: PlannedExecution("m", plan, trace), TypeError, "model must be a torch.nn.Module"),
        ("planner", lambda: dqn_swap.get_planner(5), ValueError, "unknown planner 5"),
        # a planner's time, one meaning for every planner that reads it
        ("optimal time_limit", lambda: dqn_swap.get_planner("optimal", time_limit=-1), ValueError,
         "planner 'optimal': time_limit must be a positive number of seconds, not -1"),
        ("optimal time_limit None", lambda: dqn_swap.get_planner("optimal", time_limit=None), ValueError,
         "time_limit must be a positive number of seconds, not None"),
        ("optimal wall_limit", lambda: dqn_swap.get_planner("optimal", wall_limit=float("inf")), ValueError,
         "wall_limit must be a positive number of seconds or None, not inf"),
        ("optimal round_time_limit", lambda: dqn_swap.get_planner("optimal", round_time_limit=True), ValueError,
         "round_time_limit must be a positive number"),
        ("dqn-search time_limit", lambda: dqn_swap.get_planner("dqn-search", time_limit="fast"), ValueError,
         "planner 'dqn-search': time_limit must be a positive number of seconds or None, not 'fast'"),
        ("auto time_limit", lambda: dqn_swap.get_planner("auto", time_limit=0), ValueError,
         "planner 'auto': time_limit must be a positive number of seconds or None, not 0"),
        ("auto time_limit nan", lambda: dqn_swap.get_planner("auto", time_limit=float("nan")), ValueError,
         "time_limit must be a positive number"),
        # plans made by hand
        ("manual_plan tensor", lambda: manual_plan(trace, swap=[10**9]), ValueError,
         "tensor 1000000000 is not a tensor of this trace"),
        ("manual_plan tensor text", lambda: manual_plan(trace, recompute=["3"]), ValueError,
         "tensor '3' is not a tensor of this trace"),
        ("manual_plan both", lambda: manual_plan(trace, swap=acts[:2], recompute=acts[1:2]), ValueError,
         f"tensor {acts[1]} is both in swap and in recompute"),
        # saving over what is there
        ("plan save folder", lambda: plan.save(files / "dir.trace"), IsADirectoryError, "is a directory"),
        ("trace save folder", lambda: trace.save(files / "dir.trace", overwrite=True), IsADirectoryError,
         "is a directory"),
        ("plan save through a file", lambda: plan.save(files / PLAN / "x.json"), NotADirectoryError,
         "p.json is a file, not a folder"),
        ("trace save socket", lambda: trace.save(files / "sock.json", overwrite=True), OSError,
         "is not a regular file"),
        ("plan save link", lambda: plan.save(files / "dangling.json"), FileExistsError, "already exists"),
        # one autoplan per model
        ("autoplan twice", lambda: (dqn_swap.autoplan(twice, "50%"), dqn_swap.autoplan(twice, "50%")), AutoPlanError,
         "this model already has dqn_swap.autoplan attached"),
    ]


def test_wrong_argument_types_in_the_python_api(files: Path) -> None:
    """A wrong type is one line naming the argument, raised at the call (not an AttributeError inside)."""
    for label, call, error, words in _type_cases(files):
        with pytest.raises(error) as info:
            call()
        message = str(info.value)
        assert words in message and "\n" not in message.strip(), f"{label}: {message}"


def test_one_autoplan_per_model_and_another_after_remove() -> None:
    """A second autoplan on a model is refused while the first is attached; once it is removed, or for a
    copy of the model, another attaches."""
    import copy

    import dqn_swap
    from dqn_swap.integrations import AutoPlanError

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    first = dqn_swap.autoplan(model, "50%")
    with pytest.raises(AutoPlanError, match="already has dqn_swap.autoplan attached"):
        dqn_swap.autoplan(model, "60%")
    dqn_swap.autoplan(copy.deepcopy(model), "50%").remove()
    first.remove()
    dqn_swap.autoplan(model, "60%").remove()


def test_a_model_planned_and_dropped_is_freed() -> None:
    """What keeps one autoplan per model keeps no model alive: a model dropped with its autoplan
    attached is collected."""
    import gc
    import weakref

    import dqn_swap

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    dqn_swap.autoplan(model, "50%")
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
