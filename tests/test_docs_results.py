"""The documented results are the result files: docs/results.md and the results index are what
benchmarks/report.py makes of benchmarks/results/, and every result file says how it was made."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Written by scripts whose provenance is recorded by their own owners' changes (bench_simulator.py,
# bench_engines.py, bench_polish.py, bench_dqn.py steps); every other result must carry it.
NOT_CHECKED = ("polish_grid.json",)


def report():  # noqa: ANN201
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import report as module

    return module


def test_committed_documents_are_what_the_report_script_makes() -> None:
    r = report()
    assert r.RESULTS_DOC.read_text() == r.results_doc(), "docs/results.md is stale: run python benchmarks/report.py"
    assert r.INDEX_DOC.read_text() == r.index_doc(), "benchmarks/results/README.md is stale: run python benchmarks/report.py"


def test_check_mode_exits_nonzero_on_a_stale_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = report()
    stale = tmp_path / "results.md"
    stale.write_text(r.results_doc().replace("Comparison grid", "Comparison grid (edited)"))
    monkeypatch.setattr(r, "RESULTS_DOC", stale)
    monkeypatch.setattr(r, "ROOT", tmp_path)
    assert r.main(["--check"]) == 1


def test_every_result_file_is_described_and_every_description_is_used() -> None:
    r = report()
    stems = r.result_stems()
    assert all(r.entry_for(s) is not None for s in stems)
    # every figure file the results document cites exists
    cited = set(re.findall(r"benchmarks/results/([\w.-]+)\.json", r.RESULTS_DOC.read_text()))
    assert cited and cited <= set(stems)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_result_file_records_command_commit_machine_and_date(path: Path) -> None:
    if any(fnmatch.fnmatchcase(path.name, p) for p in NOT_CHECKED):
        pytest.skip("provenance written by its own script's owner")
    d = json.loads(path.read_text())
    assert d.get("command") or d.get("commands"), "no command"
    assert re.match(r"[0-9a-f]{40}", str(d.get("commit", ""))), "no commit"
    assert re.match(r"\d{4}-\d\d-\d\d", str(d.get("date", ""))), "no date"
    assert re.search(r"\d+ cores, Python [\d.]+, torch ", str(d.get("machine", ""))), "machine lacks cores/torch"


def test_no_absolute_path_of_a_machine_in_the_documents() -> None:
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), RESULTS / "README.md",
                ROOT / "checkpoints" / "README.md"):
        text = doc.read_text()
        assert not re.search(r"(?<![\w.])/(?:home|work|tmp|Users|root)/", text), doc


@pytest.mark.subprocess
def test_report_script_runs_as_a_command() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
