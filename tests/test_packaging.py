"""What ``pip install dqn-swap`` puts on a machine: one top-level package, the shipped agents inside it.

``env/`` and ``agents/`` are folders of this repository; installed, they are ``dqn_swap.env`` and
``dqn_swap.agents``, so that they neither clash with other distributions' top-level ``agents``
(openai-agents) nor are shadowed by a user's ``env.py``.  These tests build the wheel from a copy of
the sources, check every module of the tree is in it, and run the quickstart's steps and planned
training with the wheel installed alone, from a folder outside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.subprocess  # every test here builds or runs the package in another process


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of the sources alone: an editable install's dqn_swap.egg-info/SOURCES.txt
    # (and a build/ folder) in the checkout would add every file they list, and hide a package
    # missing from pyproject's list, as they once did.
    tmp_path = tmp_path_factory.mktemp("wheel")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "runs",
                                                             "__pycache__", ".whl", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(tmp_path), str(src)], check=True,
                   capture_output=True)
    return next(tmp_path.glob("dqn_swap-*.whl"))


SMOKE = """
set -e
dqn-swap record --model resnet_tiny --batch-size 4 -o r.trace
dqn-swap plan r.trace -m 50% -o auto.json --search-seconds 1
dqn-swap simulate r.trace --plan auto.json --json > sim.json
dqn-swap compare r.trace --memory-limits 50% --planners greedy,lru,dqn -o cmp
dqn-swap run --model mlp_tiny --batch-size 4 --device cpu -m 50% --planner lru --steps 1
"""


def test_the_installed_wheel_records_plans_and_trains_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    """The wheel installed in a fresh virtual environment (its dependencies seen through a ``.pth``
    file naming this environment's packages, as no index is reachable here), with its own
    ``dqn-swap`` command: the quickstart's steps and planned training run from a folder outside the
    repository, on the installed files only."""
    import sysconfig
    import venv

    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(fresh)
    python = fresh / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps = [sysconfig.get_paths()["purelib"],
            *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))]  # (Debian's: dist-packages)
    # (the folders themselves only: their own .pth files, this checkout's editable install among them, are not read)
    (site / "dependencies.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The simulator's reference engine: the compiled one's kernels would be compiled again for this copy of
    # the package (12 s of the suite); its module is imported from the installed files above, and the
    # engines agree (tests/test_simulator_engines.py).
    env.update(OMP_NUM_THREADS="1", DQN_SWAP_ENGINE="python", PATH=f"{fresh / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    where = subprocess.run([str(python), "-c", "import dqn_swap.agents.auto as a, dqn_swap.simulator as s, "
                            "dqn_swap.simulator.compiled as c; print(a.__file__); print(s.__file__); print(c.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(w.startswith(str(site)) for w in where), where  # the installed files, not the source tree's
    assert (fresh / "bin" / "dqn-swap").exists()  # the console command pip made from the wheel's entry point
    p = subprocess.run(["bash", "-c", SMOKE], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    assert json.loads((work / "sim.json").read_text())["feasible"] and (work / "cmp" / "compare.md").exists()


def test_the_sdist_holds_the_tree_and_builds_a_wheel_of_the_same_files(wheel: Path, tmp_path: Path) -> None:
    """The source distribution, built from a copy of the sources, has every module, the shipped
    agents and the plan schema; the wheel pip builds from it (as it does for a release's sdist)
    holds the same files as the one built from the tree."""
    import tarfile

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "runs",
                                                             "__pycache__", ".whl", "results"))
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                    "b.build_sdist(sys.argv[1])", str(tmp_path)], cwd=src, check=True, capture_output=True)
    sdist = next(tmp_path.glob("dqn_swap-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        # (extraction filters came in Python 3.11.4 and 3.10.12: a Debian 3.11.2 has none)
        tar.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    for folder in ("dqn_swap", "env", "agents", "checkpoints"):
        for path in (ROOT / folder).rglob("*.py"):
            assert path.relative_to(ROOT).as_posix() in names, f"{path.relative_to(ROOT)} is not in the sdist"
    assert {"pyproject.toml", "README.md", "checkpoints/default.pt", "checkpoints/grid/resnet50.pt"} <= names
    built = tmp_path / "from_sdist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(built), str(next((tmp_path / "unpacked").iterdir()))],
                   check=True, capture_output=True)
    again = next(built.glob("dqn_swap-*.whl"))
    assert set(zipfile.ZipFile(again).namelist()) == set(zipfile.ZipFile(wheel).namelist())


def test_the_wheel_has_one_top_level_package_and_the_agents(wheel: Path) -> None:
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
