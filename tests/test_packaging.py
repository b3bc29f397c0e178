"""What ``pip install dqn-swap`` puts on a machine: one top-level package, the shipped agents inside it.

``env/`` and ``agents/`` are folders of this repository; installed, they are ``dqn_swap.env`` and
``dqn_swap.agents``, so that they neither clash with other distributions' top-level ``agents``
(openai-agents) nor are shadowed by a user's ``env.py``.  The fresh-venv check (``import env``
and ``import agents`` fail, ``dqn-swap plan --planner dqn`` works from another folder) is in the
closing note of the issue that made this so; this test checks the built wheel itself.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_has_one_top_level_package_and_the_agents(tmp_path: Path) -> None:
    # Built from a copy of the sources alone: an editable install's dqn_swap.egg-info/SOURCES.txt
    # (and a build/ folder) in the checkout would add every file they list, and hide a package
    # missing from pyproject's list, as they once did.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "runs",
                                                             "__pycache__", ".whl", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(tmp_path), str(src)], check=True,
                   capture_output=True)
    wheel = next(tmp_path.glob("dqn_swap-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.startswith("dqn_swap-")}
    assert top == {"dqn_swap"}, top
    for needed in ("dqn_swap/env/swap_recompute.py", "dqn_swap/agents/dqn/planner.py",
                   "dqn_swap/agents/baselines/base.py", "dqn_swap/agents/optimal/program.py",
                   "dqn_swap/checkpoints/default.pt",
                   "dqn_swap/checkpoints/grid/resnet50.pt", "dqn_swap/checkpoints/README.md"):
        assert needed in names, needed
    assert not any(n.endswith("/__pycache__/") or ".pyc" in n for n in names)
    # every module of the repository's packages, under its installed name (a package missing from
    # pyproject's list left dqn_swap/simulator/ out of the wheel, and every install but an editable
    # one could not simulate or plan)
    folders = {"dqn_swap": "dqn_swap", "env": "dqn_swap/env", "agents": "dqn_swap/agents",
               "checkpoints": "dqn_swap/checkpoints"}
    for folder, installed in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            name = f"{installed}/{path.relative_to(ROOT / folder).as_posix()}"
            if folder == "dqn_swap" and path.relative_to(ROOT / folder).parts[0] in ("env", "agents", "checkpoints"):
                continue
            assert name in names, f"{name} is not in the wheel"


def test_help_answers_without_importing_torch() -> None:
    code = ("import sys, time; t = time.perf_counter(); from dqn_swap.cli import build_parser; "
            "build_parser().format_help(); print(time.perf_counter() - t, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out[1] == "False"  # torch is imported only by what needs it
    assert float(out[0]) < 0.5
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dqn_swap", "--help"], check=True, capture_output=True)
    assert time.perf_counter() - start < 2.0  # the interpreter's own start included, on a shared machine
