"""The README's examples run as written (on the CPU here, on CUDA where there is one)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(after_heading: str) -> str:
    text = README.read_text()
    section = text[text.index(after_heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_planned_training_example_runs_and_follows_the_plan() -> None:
    scope: dict = {}
    exec(compile(python_block("### A plan you made"), "README.md", "exec"), scope)
    plan, runtime = scope["plan"], scope["runtime"]
    assert plan.figures["feasible"] and plan.actions
    stats = runtime.stats
    assert runtime.iterations == 3
    assert stats.packed == stats.expected_packs or stats.packed == stats.hooks_off_after + 1
    assert stats.swapped + stats.recompute_removed == len(plan.actions)


def test_autoplan_example_runs_and_follows_its_plan() -> None:
    scope: dict = {}
    exec(compile(python_block("### In your own loop: one line"), "README.md", "exec"), scope)
    planned = scope["planned"]
    assert planned.last == "planned" and planned.steps == 5
    entry = planned.last_entry
    assert entry.plan.actions and entry.plan.figures["feasible"]
    assert planned.stats.packed == planned.stats.expected_packs
