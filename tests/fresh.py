"""Tests that measure a whole process's memory, run in a process of their own.

The CPU allocator's timeline (:class:`dqn_swap.meter.AllocatorTimeline`) sees every allocation
of the process.  A test that compares a measured peak with a trace byte for byte can then fail
by a few bytes in a long session: in full runs on a loaded machine such comparisons came out
16 bytes apart, and passed alone, with the garbage collector held still and with a recording
made first.  :func:`fresh_process` runs the test in a new interpreter where nothing but the
module's fresh-process tests have run: the first of them to run starts ``python -m pytest`` on
all of them, and each then reports its own outcome there.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_INSIDE = "DQN_SWAP_TEST_IN_FRESH_PROCESS"
_NODES: dict[str, list[str]] = {}  # test file -> its fresh-process tests' node ids
_OUTCOMES: dict[str, tuple[bool, str]] = {}  # node id -> (passed, the child's output)


def _run_fresh(path: str) -> None:
    nodes = _NODES[path]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *nodes],
                          cwd=ROOT, env={**os.environ, _INSIDE: "1"}, capture_output=True, text=True,
                          timeout=900)
    text = done.stdout[-6000:] + done.stderr[-2000:]
    passed = set(re.findall(r"^PASSED (\S+)", done.stdout, flags=re.M))
    for node in nodes:
        _OUTCOMES[node] = (node in passed, text)


def fresh_process(test: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``test`` (a test function without parameters or fixtures) in a new interpreter."""
    path = Path(inspect.getsourcefile(test) or "").resolve().relative_to(ROOT).as_posix()
    node = f"{path}::{test.__name__}"
    _NODES.setdefault(path, []).append(node)

    @functools.wraps(test)
    def run() -> None:
        if os.environ.get(_INSIDE):
            test()
            return
        if node not in _OUTCOMES:
            _run_fresh(path)
        ok, text = _OUTCOMES[node]
        assert ok, f"{node} failed in a fresh process:\n{text}"

    return run
