"""scripts/gpu_check.sh, the one prepared run for a GPU lent for minutes, in its dry run on the CPU:
it must run end to end here, so that it is not stale the day a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch

ROOT = Path(__file__).resolve().parents[1]


def run_check(*args: str, out: Path | None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("GPU_CHECK_OUT", None)
    if out is not None:
        env["GPU_CHECK_OUT"] = str(out)
    return subprocess.run(["bash", "scripts/gpu_check.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.subprocess
def test_dry_run_measures_every_method_and_planner(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    p = run_check("--dry-run", "--models", "resnet_tiny:4", "--limits", "checkpoint,50%", out=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert r["dry_run"] and r["device"] == "cpu" and len(r["commit"]) == 40 and r["machine"]
    assert r["estimate_seconds"] < 8 * 60  # what the run on a GPU allows itself, before it runs
    (m,) = r["models"]
    assert "error" not in m, m.get("error")
    assert {k: v["status"] for k, v in m["methods"].items()} == {k: "ok" for k in gpu_check.BASE_METHODS}
    assert m["trace"]["op_time_sum_over_step"] > 0
    cells = [c for c in m["cells"] if c.get("status") == "ok"]
    assert {(c["limit"], c["planner"]) for c in cells} == {(lim, pl) for lim in ("checkpoint", "50%")
                                                           for pl in gpu_check.planners()}
    for c in cells:
        assert c["under_limit"] and c["identical_losses"] and c["simulated_step_s"] > 0, c
    ckpt = [c for c in cells if c["limit"] == "checkpoint"]
    assert all(c["limit_bytes"] == m["methods"]["torch-checkpoint"]["peak_allocated"] for c in ckpt)
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("# GPU check (dry run, cpu)") and "| checkpoint | swap-all |" in md


@pytest.mark.subprocess
def test_it_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    p = run_check("--dry-run", out=None, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == "gpu_check: set GPU_CHECK_OUT to the folder the report goes to"
    if not torch.cuda.is_available():
        p = run_check(out=tmp_path, timeout=120)
        assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == \
            "gpu_check: no CUDA GPU here; --dry-run runs it on the CPU"
