"""The README's examples run as written (on the CPU here, on CUDA where there is one): every
```python block, and every ``dqn-swap`` command of its ```bash / ```console blocks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# The heading above each ```python block, and the test below that runs it.
PYTHON_BLOCKS = ("### Record a trace", "### From Python", "### In your own loop: one line", "### With Hugging Face's `Trainer`",
                 "### A plan you made", "### Your own planner")


def python_block(after_heading: str) -> str:
    text = README.read_text()
    section = text[text.index(after_heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def readme_commands(text: str | None = None) -> list[str]:
    """The ``dqn-swap`` command lines of the README's ```bash and ```console blocks, in order
    (continuation lines joined, a ``$ `` prompt dropped)."""
    text = README.read_text() if text is None else text
    commands = []
    for block in re.findall(r"```(?:bash|console)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split()).removeprefix("$ ")
            if line.startswith("dqn-swap "):
                commands.append(line)
    return commands


def run_block(heading: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict:
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(python_block(heading), "README.md", "exec"), scope)
    return scope


def test_every_python_block_is_run_by_a_test() -> None:
    text = README.read_text()
    blocks = [m.start() for m in re.finditer(r"```python\n", text)]
    covered = {text.index("```python\n", text.index(h)) for h in PYTHON_BLOCKS}
    assert sorted(covered) == blocks


def test_the_readme_is_a_guide_of_at_most_400_lines() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    # the two commands first, then the user's own model in the user's own loop
    assert text.index("## Two commands") < text.index("### In your own loop: one line") < text.index("## Recording traces")


def test_ones_own_planner_example_registers_a_planner_that_plans(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from dqn_swap.agents import get_planner
    from dqn_swap.planners import unregister
    from .conftest import record_mlp

    try:
        run_block("### Your own planner", monkeypatch, tmp_path)
        trace = record_mlp("meta")
        plan = get_planner("swap-everything").plan(trace, trace.peak_bytes)
        assert plan.planner == "swap-everything" and plan.n_swap > 0
    finally:
        unregister("swap-everything")


def test_a_model_of_ones_own_records_from_the_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from dqn_swap.cli import main
    from dqn_swap.trace import Trace

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodels.py").write_text(python_block("### Record a trace"))
    line = re.search(r"`(dqn-swap record --model mymodels:small_mlp [^`]*)`", README.read_text()).group(1)
    assert main(line.split()[1:]) == 0
    assert Trace.load(tmp_path / "mine.trace").n_ops > 0


def test_recording_example_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trace = run_block("### From Python", monkeypatch, tmp_path)["trace"]
    assert trace.n_ops > 0 and trace.peak_bytes > trace.minimum_memory > 0


def test_planned_training_example_runs_and_follows_the_plan(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    scope = run_block("### A plan you made", monkeypatch, tmp_path)
    plan, runtime = scope["plan"], scope["runtime"]
    assert plan.figures["feasible"] and plan.actions
    stats = runtime.stats
    assert runtime.iterations == 3
    assert stats.packed == stats.expected_packs or stats.packed == stats.hooks_off_after + 1
    assert stats.swapped + stats.recompute_removed == len(plan.actions)


def test_autoplan_example_runs_and_follows_its_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    planned = run_block("### In your own loop: one line", monkeypatch, tmp_path)["planned"]
    assert planned.last == "planned" and planned.steps == 5
    entry = planned.last_entry
    assert entry.plan.actions and entry.plan.figures["feasible"]
    assert planned.stats.packed == planned.stats.expected_packs


def test_trainer_example_trains_with_a_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    scope = run_block("### With Hugging Face's `Trainer`", monkeypatch, tmp_path)
    callback = next(c for c in scope["trainer"].callback_handler.callbacks
                    if isinstance(c, scope["AutoPlanCallback"]))
    planned = callback.planned
    assert scope["trainer"].state.global_step == 3
    assert planned is not None and planned.last == "planned"


def test_command_parser_joins_continuations_and_drops_prompts() -> None:
    text = "```bash\n$ dqn-swap inspect a.trace \\\n    --json\necho no\n```\n```\ndqn-swap not-bash\n```\n"
    assert readme_commands(text) == ["dqn-swap inspect a.trace --json"]
    commands = readme_commands()
    for sub in ("record", "inspect", "simulate", "plan", "compare", "explain", "max-batch", "run", "train", "finetune"):
        assert any(c.split()[1] == sub for c in commands), sub
    assert any("--plan " in c and c.split()[1] == "run" for c in commands)
    assert not any("--planners all" in c and "--time-limit" not in c for c in commands)


# Runs the commands in order in one process (one import of torch), each as `dqn-swap` would.
RUNNER = r"""
import contextlib, io, json, shlex, sys, time
from dqn_swap.cli import main
for line in sys.stdin.read().splitlines():
    out, err, t0 = io.StringIO(), io.StringIO(), time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(shlex.split(line)[1:])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    print(json.dumps({"command": line, "rc": rc, "cpu_s": time.process_time() - t0,
                      "stderr": err.getvalue()[-2000:]}), flush=True)
"""


def run_commands(commands: list[str], cwd: Path) -> None:
    """Run ``commands`` in order in ``cwd``, in one child process; every one must exit 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", RUNNER], input="\n".join(commands), capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(commands), proc.stderr[-2000:]
    failed = [f"{r['command']} -> {r['rc']}: {r['stderr']}" for r in results if r["rc"] != 0]
    assert not failed, "\n".join(failed)


@pytest.mark.subprocess
def test_recording_and_planning_commands_run(tmp_path: Path) -> None:
    text = README.read_text()
    run_commands(readme_commands(text[:text.index("\n## Planned training")]), tmp_path)
    for name in ("r18.trace", "r18-plan.json", "llama-plan.json", "mixer.trace", "vgg16.trace",
                 "comparison/compare.md", "comparison/compare.csv", "r18-plan-explained.png", "resnet18-max-batch.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    plan = json.loads((tmp_path / "r18-plan.json").read_text())
    assert plan["planner"] == "auto" and plan["actions"] and plan["settings"]["chosen"]
    table = (tmp_path / "comparison" / "compare.md").read_text()
    assert all(p in table for p in ("window", "greedy", "lru", "dqn", "optimal"))


@pytest.mark.slow
@pytest.mark.subprocess
def test_every_shell_command_runs(tmp_path: Path) -> None:
    """All of them in order, training and planned training included (about a minute on one core)."""
    run_commands(readme_commands(), tmp_path)
    for name in ("tiny.trace", "tiny-plan.json", "agent.pt", "tuned.pt", "r18-tuned-plan.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "r18-tuned-plan.json").read_text())["actions"]
