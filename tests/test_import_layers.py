"""The import layers: no arrow runs back up.

::

    core  <-  env  <-  agents  <-  integrations  <-  command line, benchmarks, scripts
    core  <-  runtime          <-  integrations  <-  command line, benchmarks, scripts

A module may import its own layer and the layers below it.  The runtime applies plans and
imports the core only; nothing below the integrations imports the runtime.  The layers:

* **core**: ``dqn_swap/*.py`` and ``dqn_swap/models/``.  The models are core: they import the
  core only (:mod:`dqn_swap.recorder`, :mod:`dqn_swap.cost`), and the agents and the command
  line import them.
* **env**: ``env/`` (installed as ``dqn_swap.env``).
* **agents**: ``agents/`` (``dqn_swap.agents``) and ``checkpoints/`` (``dqn_swap.checkpoints``,
  the shipped agents' weights, which only the DQN planner loads).
* **runtime**: ``dqn_swap/runtime/``.
* **integrations**: ``dqn_swap/integrations/`` (``autoplan`` and the ``Trainer`` callback, which
  record with the core, plan with the agents and train with the runtime).
* **top**: ``dqn_swap/cli/``, ``dqn_swap/__main__.py`` (``python -m dqn_swap`` is the command
  line), ``benchmarks/`` and ``scripts/``.

The check is static: every module's source is parsed with :mod:`ast`, and every import in it
is an arrow, at module level or inside a function (a lazy import runs back up as surely,
only later), under ``if TYPE_CHECKING`` too, and so are ``importlib.import_module`` calls with a
literal name and the package's table of lazily imported names.  ``from dqn_swap import name``
counts as an arrow to the module that ``name`` comes from.

The few arrows that run up on purpose are listed in :data:`EXCEPTIONS`, each with its reason;
a listed arrow that no longer exists fails too, so that the list stays true.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Repository folder -> the package it installs as (setup.py's ``ROOTS``).
PACKAGES = {"dqn_swap": "dqn_swap", "env": "dqn_swap.env", "agents": "dqn_swap.agents",
            "checkpoints": "dqn_swap.checkpoints"}
#: Folders of scripts run from the repository (they import each other by bare name).
SCRIPT_FOLDERS = ("benchmarks", "scripts")

CORE, ENV, AGENTS, RUNTIME, INTEGRATIONS, TOP = "core", "env", "agents", "runtime", "integrations", "top"
#: The layers each layer may import.
ALLOWED = {CORE: {CORE}, ENV: {CORE, ENV}, AGENTS: {CORE, ENV, AGENTS}, RUNTIME: {CORE, RUNTIME},
           INTEGRATIONS: {CORE, ENV, AGENTS, RUNTIME, INTEGRATIONS}, TOP: {CORE, ENV, AGENTS, RUNTIME, INTEGRATIONS, TOP}}

#: Arrows that run up on purpose: (importing module, imported module) -> why.
EXCEPTIONS = {
    ("dqn_swap", "dqn_swap.agents"):
        "the package's face: dqn_swap.get_planner is re-exported for users (lazily, on first use)",
    ("dqn_swap", "dqn_swap.runtime"):
        "the package's face: dqn_swap.PlannedExecution and the runtime's errors are re-exported for users (lazily, "
        "on first use)",
    ("dqn_swap", "dqn_swap.agents.dqn"):
        "the package's face: dqn_swap.AgentFileError, one of the error family, is re-exported for users (lazily, "
        "on first use)",
    ("dqn_swap", "dqn_swap.integrations"):
        "the package's face: dqn_swap.autoplan and its error are re-exported for users (lazily, on first use)",
    ("dqn_swap.trainer", "dqn_swap.integrations.trainer"):
        "the path users import the Trainer callback by (from dqn_swap.trainer import AutoPlanCallback)",
}


@dataclass(frozen=True)
class Arrow:
    """One import: where it is written, the module it loads, and whether it only runs for a type checker."""

    source: str
    target: str
    line: int
    typing_only: bool = False


def layer_of(module: str) -> str | None:
    """The layer of a module of this repository; None for anything else (the standard library, torch...)."""
    first = module.split(".")[0]
    if first in SCRIPT_FOLDERS or module in script_modules():
        return TOP
    if first in PACKAGES and first != "dqn_swap":  # a repository folder imported by its folder's name
        module = PACKAGES[first] + module[len(first):]
    if module != "dqn_swap" and not module.startswith("dqn_swap."):
        return None
    parts = module.split(".")
    second = parts[1] if len(parts) > 1 else ""
    if second in ("cli", "__main__"):
        return TOP
    if second == "runtime":
        return RUNTIME
    if second == "integrations":
        return INTEGRATIONS
    if second == "env":
        return ENV
    if second in ("agents", "checkpoints"):
        return AGENTS
    return CORE


@functools.lru_cache(maxsize=None)
def script_modules() -> frozenset[str]:
    """The bare names the benchmarks and scripts import each other by (``bench_dqn``, ``machine``)."""
    return frozenset(p.stem for folder in SCRIPT_FOLDERS for p in (ROOT / folder).glob("*.py"))


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    """The dotted name ``path`` imports as, installed, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] in PACKAGES:
        parts[:1] = PACKAGES[parts[0]].split(".")
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module a relative ``from`` names."""
    if not level:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def arrows_of(source: str, module: str, is_package: bool, known: frozenset[str],
              lazy: dict[str, str]) -> list[Arrow]:
    """Every import in ``source`` (the text of ``module``), as arrows.

    ``known``: the modules of the repository, to tell ``from pkg import submodule`` from
    ``from pkg import name``.  ``lazy``: the package face's lazily imported names and their modules,
    so that ``from dqn_swap import get_planner`` is an arrow to the agents.
    """
    tree = ast.parse(source)
    found: list[Arrow] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Arrow(module, alias.name, node.lineno, typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    target = f"{base}.{alias.name}"
                elif base == "dqn_swap" and alias.name in lazy:
                    target = lazy[alias.name]
                else:
                    target = base
                found.append(Arrow(module, target, node.lineno, typing_only))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                name = node.args[0].value
                level = len(name) - len(name.lstrip("."))
                found.append(Arrow(module, _absolute(module, is_package, level, name[level:] or None),
                                   node.lineno, typing_only))
        elif isinstance(node, ast.Assign) and module == "dqn_swap" and any(
                isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            found.extend(Arrow(module, target, node.lineno, typing_only) for target in sorted(set(lazy.values())))
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(tree, False)
    return found


def lazy_table(init_source: str) -> dict[str, str]:
    """The package face's ``_LAZY`` table (name -> absolute module), read from its source."""
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            table = ast.literal_eval(node.value)
            return {name: _absolute("dqn_swap", True, len(m) - len(m.lstrip(".")), m.lstrip(".")) for name, m in
                    table.items()}
    return {}


def source_files(root: Path) -> list[Path]:
    """The repository's Python modules whose layer is checked (tests are not)."""
    folders = [*PACKAGES, *SCRIPT_FOLDERS]
    return sorted(p for folder in folders for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


@functools.lru_cache(maxsize=None)
def all_arrows() -> tuple[Arrow, ...]:
    files = source_files(ROOT)
    names = {p: module_name(p, ROOT) for p in files}
    known = frozenset(name for name, _ in names.values())
    lazy = lazy_table((ROOT / "dqn_swap" / "__init__.py").read_text(encoding="utf-8"))
    found: list[Arrow] = []
    for path, (name, is_package) in names.items():
        found.extend(arrows_of(path.read_text(encoding="utf-8"), name, is_package, known, lazy))
    return tuple(found)


def upward(arrows: tuple[Arrow, ...] | list[Arrow]) -> list[Arrow]:
    """The arrows that import a layer their own layer may not."""
    bad = []
    for arrow in arrows:
        here, there = layer_of(arrow.source), layer_of(arrow.target)
        if here is not None and there is not None and there not in ALLOWED[here]:
            bad.append(arrow)
    return bad


def _shown(arrow: Arrow) -> str:
    return (f"{arrow.source} ({layer_of(arrow.source)}) imports {arrow.target} ({layer_of(arrow.target)}) "
            f"at line {arrow.line}")


# ------------------------------------------------------------------------------------------ tests
def test_the_layers_name_the_folders_pyproject_installs() -> None:
    """The folder -> package map above is the one pip installs (setup.py's ``ROOTS``), so the layers
    name real modules, and every package setup.py finds is checked."""
    import ast

    from setuptools import find_packages

    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)}
    roots = ast.literal_eval(values["ROOTS"])
    inside = ast.literal_eval(values["INSIDE"])
    assert {folder: package for package, folder in roots.items()} == PACKAGES
    installed = set(roots)
    for name, folder in roots.items():
        installed |= {f"{name}.{p}" for p in find_packages(str(ROOT / folder))
                      if not (folder == "dqn_swap" and p.split(".")[0] in inside)}
    read = {module_name(p, ROOT)[0] for p in source_files(ROOT)}
    assert installed <= read  # every installed package is checked


def test_no_import_runs_back_up_a_layer() -> None:
    bad = [arrow for arrow in upward(all_arrows()) if (arrow.source, arrow.target) not in EXCEPTIONS]
    assert not bad, "imports that run back up a layer:\n" + "\n".join(map(_shown, bad))


def test_every_listed_exception_is_still_an_upward_arrow() -> None:
    seen = {(arrow.source, arrow.target) for arrow in upward(all_arrows())}
    stale = [pair for pair in EXCEPTIONS if pair not in seen]
    assert not stale, f"listed as exceptions but no longer imported: {stale}; remove them from EXCEPTIONS"


def test_the_core_has_no_import_cycle() -> None:
    """Core modules import each other without a cycle: sizes (dqn_swap.units) sit below both
    the trace and the limits.  Imports under ``if TYPE_CHECKING`` never run and do not count."""
    graph: dict[str, set[str]] = {}
    for arrow in all_arrows():
        if not arrow.typing_only and layer_of(arrow.source) == CORE and layer_of(arrow.target) == CORE \
                and arrow.source != arrow.target:
            graph.setdefault(arrow.source, set()).add(arrow.target)
    done: set[str] = set()

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        """A cycle through the modules ``path`` (the imports that led here) and ``node``, if any."""
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            cycle = cycle_from(nxt, path + [node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = cycle_from(start, [])
        assert cycle is None, "import cycle in the core: " + " -> ".join(cycle)
    assert "dqn_swap.units" in graph["dqn_swap.limits"] and "dqn_swap.trace" not in graph["dqn_swap.limits"]


def test_no_import_cycle_anywhere() -> None:
    """No cycle among all the package's modules (the core, the environment, the agents, the
    runtime, the command line), lazy imports inside functions included: a module that needs what
    imports it holds a piece that belongs elsewhere.  Imports under ``if TYPE_CHECKING`` do not count."""
    graph: dict[str, set[str]] = {}
    for arrow in all_arrows():
        if not arrow.typing_only and layer_of(arrow.source) is not None and layer_of(arrow.target) is not None \
                and arrow.source != arrow.target:
            graph.setdefault(arrow.source, set()).add(arrow.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for start in sorted(graph):
        if start not in index:
            visit(start)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
    assert "dqn_swap.agents.dqn" in {layer_of(m) and m.rsplit(".", 1)[0] for m in graph}  # the agents are in it


# ------------------------------------------------------------------------- the checker itself
def test_the_checker_sees_lazy_relative_face_and_importlib_imports() -> None:
    """A core module with each kind of import into the agents: every one is found and refused."""
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import numpy\n"
        "from .trace import Trace\n"
        "if TYPE_CHECKING:\n"
        "    from dqn_swap.env.swap_recompute import SwapRecomputeEnv\n"
        "def plan(trace):\n"
        "    from .agents import get_planner\n"
        "    return get_planner('lru')\n"
        "def face():\n"
        "    from . import get_planner, runtime\n"
        "def dynamic():\n"
        "    import importlib\n"
        "    return importlib.import_module('dqn_swap.cli')\n"
    )
    known = frozenset({"dqn_swap", "dqn_swap.trace", "dqn_swap.agents", "dqn_swap.runtime", "dqn_swap.cli",
                       "dqn_swap.env.swap_recompute"})
    arrows = arrows_of(source, "dqn_swap.fake", False, known, {"get_planner": "dqn_swap.agents"})
    targets = {(a.target, a.line, a.typing_only) for a in arrows}
    assert ("numpy", 3, False) in targets and ("dqn_swap.trace", 4, False) in targets
    assert ("dqn_swap.env.swap_recompute", 6, True) in targets
    assert ("dqn_swap.agents", 8, False) in targets  # inside a function
    assert ("dqn_swap.agents", 11, False) in targets  # through the package face's lazy name
    assert ("dqn_swap.runtime", 11, False) in targets  # a submodule named in `from . import`
    assert ("dqn_swap.cli", 14, False) in targets
    assert sorted((a.target, a.line) for a in upward(arrows)) == [
        ("dqn_swap.agents", 8), ("dqn_swap.agents", 11), ("dqn_swap.cli", 14), ("dqn_swap.env.swap_recompute", 6),
        ("dqn_swap.runtime", 11)]


@pytest.mark.parametrize(("source", "target", "allowed"), [
    ("dqn_swap.runtime.swap", "dqn_swap.agents", False),
    ("dqn_swap.runtime.swap", "dqn_swap.env", False),
    ("dqn_swap.runtime.swap", "dqn_swap.trace", True),
    ("dqn_swap.env.candidates", "dqn_swap.agents.baselines", False),
    ("dqn_swap.agents.dqn.planner", "dqn_swap.env.swap_recompute", True),
    ("dqn_swap.agents.dqn.planner", "dqn_swap.checkpoints", True),
    ("dqn_swap.agents.dqn.report", "dqn_swap.models", True),
    ("dqn_swap.agents.local_search", "dqn_swap.runtime", False),
    ("dqn_swap.models.corpus", "dqn_swap.agents", False),
    ("dqn_swap.trace", "dqn_swap.cli.common", False),
    ("dqn_swap.cli.run_cmd", "dqn_swap.runtime", True),
    ("bench_optimal", "bench_dqn", True),
    ("dqn_swap.plan", "bench_dqn", False),
    ("dqn_swap.plan", "agents.baselines", False),  # the repository folder by its own name
])
def test_layers_of_pairs(source: str, target: str, allowed: bool) -> None:
    assert (upward([Arrow(source, target, 1)]) == []) is allowed
