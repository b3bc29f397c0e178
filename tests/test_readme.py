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
    exec(compile(python_block("## Running planned training"), "README.md", "exec"), scope)
    plan, runtime = scope["plan"], scope["runtime"]
    assert plan.figures["feasible"] and plan.actions
    stats = runtime.stats
    assert runtime.iterations == 3
    assert stats.packed == stats.expected_packs or stats.packed == stats.hooks_off_after + 1
    assert stats.swapped + stats.recompute_removed == len(plan.actions)
