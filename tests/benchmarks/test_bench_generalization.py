"""The table of best plans known and the scorecard of ``benchmarks/bench_generalization.py``:
the table only improves, a changed trace is reported, and the scorecard's means are the formulas'."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_generalization as bg  # noqa: E402

KEY = "gen:mlp_mixer:0 b33 v100-pcie3 70%"


def entry(makespan: float | None, fingerprint: str = "aaaa", planner: str | None = "knapsack",
          lower_bound: float = 0.8, **extra: object) -> dict:
    return {"model": "gen:mlp_mixer:0", "fingerprint": fingerprint, "compute_time": 0.75, "lower_bound": lower_bound,
            "makespan": makespan, "overhead": None if makespan is None else makespan / 0.75 - 1,
            "planner": planner, "settings": {"planner": planner}, **extra}


def test_the_table_only_improves() -> None:
    lines: list[str] = []
    table = {KEY: entry(1.0)}
    worse, changed = bg.merge_best_known(table, {KEY: entry(1.1, planner="dqn")}, lines.append)
    assert worse[KEY]["makespan"] == 1.0 and worse[KEY]["planner"] == "knapsack" and changed == []
    none_fits, changed = bg.merge_best_known(table, {KEY: entry(None, planner=None)}, lines.append)
    assert none_fits[KEY]["makespan"] == 1.0 and changed == []
    better, changed = bg.merge_best_known(table, {KEY: entry(0.9, planner="dqn-search long")}, lines.append)
    assert better[KEY]["makespan"] == 0.9 and better[KEY]["planner"] == "dqn-search long" and changed == [KEY]
    assert table[KEY]["makespan"] == 1.0  # the input is not modified
    other = "gen:mlp_mixer:0 b33 v100-pcie3 30%"
    added, changed = bg.merge_best_known(table, {other: entry(2.0)}, lines.append)
    assert set(added) == {KEY, other} and changed == [other]
    # the certified bound of the exact planner is kept, the larger of the two
    kept, changed = bg.merge_best_known({KEY: entry(1.0, certified_bound=0.85)},
                                        {KEY: entry(1.2, certified_bound=0.8)}, lines.append)
    assert kept[KEY]["certified_bound"] == 0.85 and kept[KEY]["makespan"] == 1.0 and changed == []
    assert lines == []


def test_a_changed_trace_is_reported_and_its_entry_replaced() -> None:
    lines: list[str] = []
    merged, changed = bg.merge_best_known({KEY: entry(1.0, "aaaa")}, {KEY: entry(1.5, "bbbb", planner="lru")},
                                          lines.append)
    assert merged[KEY]["makespan"] == 1.5 and merged[KEY]["fingerprint"] == "bbbb" and changed == [KEY]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert KEY in lines[0] and "aaaa" in lines[0] and "bbbb" in lines[0] and "replaced" in lines[0]


def card_cells() -> list[dict]:
    """Three cells: planner ``p`` 1.5 x the best known in the first, equal in the second, infeasible in
    the third; makespans are compute_time * (1 + overhead)."""
    def fig(overhead: float | None, cpu: float) -> dict:
        return {"feasible": overhead is not None, "overhead": overhead, "cpu_seconds": cpu}

    cells = [
        {"family": "a", "compute_time": 2.0, "lower_bound": 2.0, "best_known": {"makespan": 2.0},
         "knapsack": fig(0.25, 0.1), "lru": fig(0.5, 0.1), "p": fig(0.5, 3.0)},        # p: 3.0 s; known 2.0
        {"family": "a", "compute_time": 1.0, "lower_bound": 1.0, "best_known": {"makespan": 1.2},
         "knapsack": fig(0.2, 0.1), "p": fig(0.2, 1.0)},                                  # p: 1.2 s
        {"family": "b", "compute_time": 1.0, "lower_bound": 1.1, "best_known": {"makespan": 1.1},
         "knapsack": fig(0.1, 0.1), "p": fig(None, 5.0)},
    ]
    return cells


def test_scorecard_geometric_means_by_hand() -> None:
    s = bg.scorecard(card_cells(), "p", tolerance=1e-3)
    assert s["cells"] == 3 and s["infeasible"] == 1
    assert s["wins"] == 1  # the second cell (0.2 against 0.2); the first is 0.5 against 0.25
    assert s["geomean_vs_best_known"] == pytest.approx(math.sqrt(1.5 * 1.0))
    assert s["geomean_vs_lower_bound"] == pytest.approx(math.sqrt(1.5 * 1.2))
    assert s["geomean_vs_best"] == pytest.approx(math.sqrt((1.5 / 1.25) * 1.0))
    assert s["cpu_seconds_median"] == 3.0 and s["cpu_seconds_max"] == 5.0
    assert bg.geomean([]) is None


def test_best_entry_names_the_polished_plan_and_its_source(mlp_trace) -> None:  # noqa: ANN001
    cell = {"network": "mlp", "family": None, "batch_size": 2, "profile": "v100-pcie3", "limit": 0.7,
            "limit_bytes": 1000, "lower_bound": mlp_trace.compute_time,
            "knapsack": {"feasible": True, "overhead": 0.3, "cpu_seconds": 0.1},
            "lru": {"feasible": False, "overhead": None, "cpu_seconds": 0.1},
            "polished baselines": {"window": {"feasible": True, "overhead": 0.1, "simulations": 40}},
            bg.POLISHED: {"feasible": True, "overhead": 0.2, "simulations": 50, "from": "knapsack"}}
    e = bg.best_entry(cell, mlp_trace, {"knapsack": {"planner": "knapsack"}}, {"commit": "c", "date": "d"})
    assert e["planner"] == "window polished" and e["settings"]["from"] == "window"
    assert e["settings"]["simulations"] == 40 and e["fingerprint"] == mlp_trace.fingerprint
    assert e["makespan"] == pytest.approx(mlp_trace.compute_time * 1.1) and e["commit"] == "c"
    none = bg.best_entry({**cell, "knapsack": cell["lru"], "polished baselines": {}, bg.POLISHED: cell["lru"]},
                         mlp_trace, {}, {})
    assert none["planner"] is None and none["makespan"] is None


def test_an_entry_takes_its_plans_figures_from_the_current_simulator(mlp_trace, tmp_path: Path) -> None:  # noqa: ANN001
    """The table keeps plans: an entry whose figures another model of the simulator wrote is given the
    current one's, and an entry without a plan file, or for another trace, stays as it is."""
    from dqn_swap.agents import get_planner
    from dqn_swap.limits import resolve_limit
    from dqn_swap.simulator import simulate

    plan = get_planner("greedy").plan(mlp_trace, resolve_limit(mlp_trace, "50%"))
    plan.save(tmp_path / "best.plan.json")
    stale = {**entry(1.0, fingerprint=mlp_trace.fingerprint), "overhead": 9.0, "plan_file": str(tmp_path / "best.plan.json")}
    now = bg.resimulated(stale, mlp_trace)
    assert now["makespan"] == simulate(mlp_trace, plan).makespan and now["overhead"] == simulate(mlp_trace, plan).overhead
    assert now["planner"] == stale["planner"] and now["plan_file"] == stale["plan_file"]
    assert bg.resimulated({**stale, "fingerprint": "other"}, mlp_trace) == {**stale, "fingerprint": "other"}
    no_file = {k: v for k, v in stale.items() if k != "plan_file"}
    assert bg.resimulated(no_file, mlp_trace) == no_file


def test_a_table_that_is_not_one_is_refused_in_one_line(tmp_path: Path) -> None:
    assert bg.read_best_known(tmp_path / "none.json") == {}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cells": [1, 2]}))
    with pytest.raises(ValueError, match="not a table of best plans known") as e:
        bg.read_best_known(bad)
    assert "\n" not in str(e.value)


def test_the_shipped_agent_names_the_families_it_was_trained_on() -> None:
    t = bg.trained_families(bg.DEFAULT_AGENT)
    # resnet_tiny, resnet18 (basic blocks), gpt_tiny, lstm_short, resnet50 (bottlenecks)
    assert t == {"families": ["bottleneck_cnn", "decoder_transformer", "recurrent_lm", "residual_cnn"],
                 "unknown": []}


def test_bad_options_exit_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bg.main(["--families", "no_such_family", "--limits", "0.7"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no_such_family" in err and "mlp_mixer" in err
    with pytest.raises(SystemExit) as e:
        bg.main(["--keep-table"])
    assert e.value.code == 2


@pytest.mark.slow
@pytest.mark.subprocess  # the result's provenance asks git for the commit
def test_the_command_builds_the_table_keeps_it_and_reports_a_changed_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from dqn_swap.plan import Plan
    from dqn_swap.trace import Trace

    monkeypatch.setattr(bg, "CORPUS", tmp_path / "corpus")
    table, plans = tmp_path / "best_known.json", tmp_path / "plans"
    argv = ["--families", "mlp_mixer", "--limits", "0.7", "--polish-control", "--best-known", str(table),
            "--best-known-plans", str(plans), "--json", str(tmp_path / "run.json")]
    assert bg.main(argv) == 0
    cells = json.loads(table.read_text())["cells"]
    (key, e), = cells.items()
    assert key == KEY and e["makespan"] >= e["lower_bound"] and e["planner"]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["cells"][0]["best_known"]["makespan"] == e["makespan"]
    assert run["scorecard"]["dqn"]["geomean_vs_best_known"] >= 1.0
    # the plan file is the entry's plan, for this trace
    trace = Trace.load(tmp_path / "corpus" / "test" / "mlp_mixer-0.trace")
    plan = Plan.load(plans / Path(e["plan_file"]).name, trace)  # paths in the temporary folder are kept by name
    assert plan.figures["makespan"] == pytest.approx(e["makespan"], rel=1e-9)
    capsys.readouterr()

    # a second run finds nothing faster: the table is not written again
    before = table.read_text()
    assert bg.main(argv) == 0
    assert table.read_text() == before and "0 of 1 cells" in capsys.readouterr().out

    # an entry made for another trace is reported in one line and replaced, even by a slower plan
    d = json.loads(before)
    d["cells"][KEY] |= {"fingerprint": "0123456789abcdef", "makespan": e["makespan"] / 2}
    table.write_text(json.dumps(d))
    assert bg.main(argv) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "0123456789abcdef" in line]
    assert len(lines) == 1 and KEY in lines[0] and trace.fingerprint in lines[0]
    after = json.loads(table.read_text())["cells"][KEY]
    assert after["fingerprint"] == trace.fingerprint and after["makespan"] == pytest.approx(e["makespan"])


def test_a_result_to_reuse_that_is_not_one_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"no cells": []}))
    with pytest.raises(ValueError, match="not a result of this script") as e:
        bg.reusable_cells(bad)
    assert "\n" not in str(e.value)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"cells": [{"fingerprint": "ab", "limit_bytes": 7, "window": {}}, {"limit_bytes": 1}]}))
    assert list(bg.reusable_cells(good)) == [("ab", 7)]  # a cell without a fingerprint cannot be matched


@pytest.mark.slow
@pytest.mark.subprocess  # the result's provenance asks git for the commit
def test_reused_baselines_are_the_earlier_runs_and_only_the_agent_plans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bg, "CORPUS", tmp_path / "corpus")
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    base = ["--families", "mlp_mixer", "--limits", "0.7", "--polish-control"]
    assert bg.main([*base, "--json", str(first)]) == 0
    earlier = json.loads(first.read_text())["cells"][0]
    # the earlier figures are marked, so a reused planner shows by its unchanged timing too
    d = json.loads(first.read_text())
    d["cells"][0]["window"]["seconds"] = 1234.5
    first.write_text(json.dumps(d))
    assert bg.main([*base, "--reuse", str(first), "--json", str(second)]) == 0
    cell = json.loads(second.read_text())["cells"][0]
    assert "window" in cell["reused"] and "dqn" not in cell["reused"] and cell["window"]["seconds"] == 1234.5
    assert cell[bg.POLISHED] == earlier[bg.POLISHED] and cell["dqn"]["overhead"] == earlier["dqn"]["overhead"]
    with pytest.raises(SystemExit):
        bg.main([*base, "--reuse", str(first), "--long-search", "1"])
