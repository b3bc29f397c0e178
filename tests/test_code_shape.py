"""The house's rooms stay of one idea each: no module of the package over 600 lines, and no function
over 80 unless its docstring says why it is one function ("One function on purpose")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("dqn_swap", "agents", "env")
MODULE_LINES, FUNCTION_LINES = 600, 80
REASON = "One function on purpose"


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_the_package_is_where_this_test_looks() -> None:
    assert len(_sources()) > 100


def test_no_module_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines (split them by concern): {long}"


def test_no_function_over_80_lines_without_its_reason() -> None:
    long = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES and REASON not in " ".join((ast.get_docstring(node) or "").split()):
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {FUNCTION_LINES} lines whose docstring does not say '{REASON}': {long}"
