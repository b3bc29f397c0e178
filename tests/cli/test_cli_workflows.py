"""The workflow subcommands (train, finetune, run) and simulate / plan / compare, on tiny workloads."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from dqn_swap.cli import main
from dqn_swap.trace import Trace
from dqn_swap.units import format_bytes

ROOT = Path(__file__).resolve().parents[2]
# A few hundred steps of a small network; one thread (two cores, often shared, make torch's
# thread pool slower than one thread on graphs this small).
FAST = ["--steps", "300", "--set", "eval_every=150", "--set", "learning_starts=50", "--set", "p=8",
        "--threads", "1", "--log-dir", "none"]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def run_quietly(args):
    """``main`` outside a test function (module fixtures cannot use capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    assert code == 0, err.getvalue()
    return out.getvalue()


def one_line_error(code, err, *fragments):
    assert code == 2, err
    assert err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("workflows")


@pytest.fixture(scope="module")
def mlp(folder):
    path = folder / "mlp.trace"
    run_quietly(["record", "--model", "mlp_tiny", "--batch-size", "4", "-o", str(path)])
    return path


@pytest.fixture(scope="module")
def other_trace(folder):
    path = folder / "mlp2.trace"
    run_quietly(["record", "--model", "mlp_tiny", "--batch-size", "2", "-o", str(path)])
    return path


@pytest.fixture(scope="module")
def resnet(folder, tiny_resnet_trace):
    """resnet_tiny at batch 4, recorded on meta (conftest): baselines find feasible plans for it."""
    path = folder / "resnet_tiny.trace"
    tiny_resnet_trace.save(path)
    return path


@pytest.fixture(scope="module")
def agent(folder, mlp):
    path = folder / "agent.pt"
    n = torch.get_num_threads()
    try:
        summary = json.loads(run_quietly(["train", str(mlp), "--memory-limits", "90%,50%", "-o", str(path),
                                          "--curve", str(folder / "agent.png"), "--json", *FAST]))
    finally:
        torch.set_num_threads(n)
    return path, summary


# --------------------------------------------------------------------------- train
def test_train_writes_an_agent_that_plan_uses(agent, mlp, folder, capsys, monkeypatch):
    from dqn_swap.agents.dqn import load_agent
    from dqn_swap.plan import Plan

    path, summary = agent
    assert summary["agent_file"] == str(path) and summary["steps"] == 300
    assert summary["last_evaluation"]["step"] == 300 and "score" in summary["best"]
    assert summary["memory_limits"] == ["90%", "50%"]
    assert (folder / "agent.png").stat().st_size > 1000
    net, config, ckpt = load_agent(path)
    assert config.p == 8 and config.total_timesteps == 300
    assert ckpt["training"]["command"].startswith("dqn-swap train ")
    assert ckpt["training"]["environments"] == ["mlp_tiny@90%", "mlp_tiny@50%"]
    trace = Trace.load(mlp)
    assert ckpt["trace_fingerprints"] == [trace.fingerprint]

    plan_path = folder / "dqn-plan.json"
    code, out, err = run(["plan", str(mlp), "-m", "70%", "--planner", "dqn", "--agent", str(path),
                          "-o", str(plan_path), "--json"], capsys)
    assert code in (0, 1), err  # 1: the (barely trained) agent's plan does not fit
    figures = json.loads(out)
    assert figures["planner"] == "dqn" and "feasible" in figures
    plan = Plan.load(plan_path, trace)
    assert plan.planner == "dqn" and plan.settings["agent"] == str(path)
    assert plan.settings["decode"] == "greedy"  # auto: a small graph is decoded greedily

    code, out, err = run(["simulate", str(mlp), "-m", "70%", "--planner", "dqn", "--agent", str(path),
                          "--decode", "cover", "--json"], capsys)
    assert code in (0, 1), err
    assert json.loads(out)["planner"] == "dqn"

    # --members: an ensemble file plans with its mean and each agent, and keeps the fastest plan
    ens = Path(__file__).resolve().parents[2] / "checkpoints" / "ensemble.pt"
    members_plan = folder / "members-plan.json"
    code, out, err = run(["plan", str(mlp), "-m", "50%", "--agent", str(ens), "--members", "-o", str(members_plan),
                          "--json"], capsys)
    assert code == 2 and "--members is read by dqn only" in err and "--planner dqn" in err  # the default is auto
    code, out, err = run(["plan", str(mlp), "-m", "50%", "--planner", "dqn", "--agent", str(ens), "--members",
                          "-o", str(members_plan), "--json"], capsys)
    assert code == 0, err
    plan = Plan.load(members_plan, trace)
    overheads = plan.settings["member_overheads"]
    assert plan.settings["members"] == 10 and list(overheads) == [str(ens)] and len(overheads[str(ens)]) == 11
    fitting = [o for o in overheads[str(ens)] if o is not None]
    assert json.loads(out)["overhead"] == pytest.approx(min(fitting), abs=1e-6)
    # and with more agent files, each in its own environment (the shipped groups ensemble: max_chain=3),
    # the shipped ones named as a pip-installed user names them, from a folder without checkpoints/
    monkeypatch.chdir(folder)
    code, out, err = run(["plan", str(mlp), "-m", "50%", "--planner", "dqn", "--agent", "ensemble", "--members", "ensemble_groups",
                          "-o", str(members_plan), "--force", "--json"], capsys)
    assert code == 0, err
    plan = Plan.load(members_plan, trace)
    overheads = plan.settings["member_overheads"]
    assert plan.settings["members"] == 14 and list(overheads) == ["ensemble", "ensemble_groups"]
    fitting = [o for per_file in overheads.values() for o in per_file if o is not None]
    assert json.loads(out)["overhead"] == pytest.approx(min(fitting), abs=1e-6)
    code, out, err = run(["simulate", str(mlp), "-m", "50%", "--planner", "dqn", "--agent", str(path), "--members"], capsys)
    one_line_error(code, err, "needs an ensemble", str(path))


def test_the_default_planner_says_which_candidate_made_the_plan(mlp, folder, capsys):
    code, out, err = run(["simulate", str(mlp), "-m", "40%", "--json"], capsys)
    assert code == 0, err
    figures = json.loads(out)
    assert figures["planner"] == "auto" and figures["chosen"]
    code, out, err = run(["plan", str(mlp), "-m", "40%", "--search-seconds", "0.5", "-o", str(folder / "auto.json"),
                          "--force"], capsys)
    assert code == 0, err
    plan = json.loads((folder / "auto.json").read_text())
    assert plan["planner"] == "auto" and plan["settings"]["time_limit"] == 0.5  # --search-seconds: --time-limit
    assert "chosen" in out and plan["settings"]["chosen"] in out


def test_train_refuses_to_overwrite(agent, mlp, capsys):
    path, _ = agent
    before = path.read_bytes()
    code, out, err = run(["train", str(mlp), "-m", "50%", "-o", str(path), *FAST], capsys)
    one_line_error(code, err, "already exists", "--force")
    assert path.read_bytes() == before


def test_limit_below_the_minimum_names_it(mlp, tmp_path, capsys):
    minimum = Trace.load(mlp).minimum_memory
    # MODEL:BATCH is recorded on the meta device: the same trace as the file
    code, _, err = run(["train", "mlp_tiny:4", str(mlp), "-m", "90%,1KiB", "-o", str(tmp_path / "a.pt"), *FAST],
                       capsys)
    one_line_error(code, err, "mlp_tiny:4: memory limit 1.00 KiB is below the minimum", format_bytes(minimum),
                   str(minimum))
    assert not (tmp_path / "a.pt").exists()


@pytest.mark.parametrize("args,message", [
    (["-m", "0.5"], "ambiguous"),
    (["-m", "150%"], "between 0%"),
    (["-m", "50%", "--set", "nonsense=1"], "not a training setting"),
    (["-m", "50%", "--set", "oops"], "key=value"),
])
def test_train_bad_input_one_line(args, message, mlp, tmp_path, capsys):
    code, _, err = run(["train", str(mlp), *args, "-o", str(tmp_path / "a.pt"), "--log-dir", "none"], capsys)
    one_line_error(code, err, message)


def test_train_unknown_trace_one_line(tmp_path, capsys):
    code, _, err = run(["train", "nonexistent", "-o", str(tmp_path / "a.pt")], capsys)
    one_line_error(code, err, "no such trace file")


# --------------------------------------------------------------------------- finetune
def test_finetune_from_the_trained_agent(agent, mlp, tmp_path, capsys):
    from dqn_swap.agents.dqn import load_agent

    source, _ = agent
    out_path = tmp_path / "ft.pt"
    code, out, err = run(["finetune", str(mlp), "--from", str(source), "-m", "70%", "-o", str(out_path),
                          "--steps", "100", "--set", "eval_every=50", "--set", "learning_starts=20",
                          "--threads", "1", "--log-dir", "none", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["steps"] == 100 and summary["agent_file"] == str(out_path)
    _, config, ckpt = load_agent(out_path)
    assert ckpt["training"]["init_from"] == str(source)
    assert config.start_e == 0.2 and config.p == 8  # the source's network, less exploration
    assert ckpt["training"]["evaluations"][0]["step"] == 0  # the starting agent is evaluated first
    start = ckpt["training"]["evaluations"][0]["score"]
    assert summary["start_score"] == start
    improved = ckpt["training"]["best"].get("phase") != "start"
    assert summary["outcome"].startswith("training improved on the starting agent" if improved else
                                         "training did not improve on the starting agent")
    assert err.count("train: ") == len(ckpt["training"]["evaluations"])  # a plain line per evaluation off a terminal
    # the table says it too, beside the starting agent's score
    code, out, err = run(["finetune", str(mlp), "--from", str(source), "-m", "70%", "-o", str(out_path), "--force",
                          "--steps", "100", "--set", "eval_every=50", "--set", "learning_starts=20",
                          "--threads", "1", "--log-dir", "none"], capsys)
    assert code == 0, err
    assert f"score {start:.4f}" in out and summary["outcome"] in out


def test_finetune_missing_source_one_line(mlp, tmp_path, capsys):
    code, _, err = run(["finetune", str(mlp), "--from", str(tmp_path / "none.pt"), "-o", str(tmp_path / "x.pt")],
                       capsys)
    one_line_error(code, err, "no such agent file")


# --------------------------------------------------------------------------- run
def test_run_on_cpu_prints_a_table_and_writes_json(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    code, out, err = run(["run", "--model", "mlp_tiny", "--batch-size", "4", "--device", "cpu", "--planner",
                          "swap-all", "--memory-limit", "50%", "--steps", "1", "-o", str(report_path)], capsys)
    assert code == 0, err
    assert "planned" in out and "save_on_cpu" in out and "allocator's timeline" in out
    assert "planned_peak_within_limit: True" in out and "predicted_peak_bytes" in out
    report = json.loads(report_path.read_text())
    assert {m: r["status"] for m, r in report["methods"].items()} == {
        "unplanned": "ok", "planned": "ok", "torch-checkpoint": "ok", "save_on_cpu": "ok"}
    # The CPU's measured peak beside the limit and the prediction of the plan's schedule.
    comparison = report["comparison"]
    assert comparison["planned_peak_allocated"] <= report["memory_limit"]
    assert comparison["planned_peak_allocated"] == report["methods"]["planned"]["peak_allocated"]
    assert comparison["planned_peak_over_predicted"] <= 1.0
    assert "peak_allocated" not in report["methods"]["save_on_cpu"]
    # exactness, and no step time compared on the CPU (the simulator's times are a GPU's)
    assert comparison["planned_losses_identical_to_unplanned"] is True
    assert not any(k.startswith("throughput_vs") or k in ("measured_overhead", "simulator_step_time_error")
                   for k in comparison)
    assert "times on cpu: host compute" in out
    low, high = report["trace"]["minimum_memory"], report["trace"]["peak_bytes"]
    assert report["memory_limit"] == round(low + 0.5 * (high - low))  # % means what it means in plan
    assert report["plan"]["planner"] == "swap-all"
    code, _, err = run(["run", "--model", "mlp_tiny", "--device", "cpu", "-m", "50%", "-o", str(report_path)],
                       capsys)
    one_line_error(code, err, "already exists")


def test_run_with_a_baseline_planner_and_a_multiple_of_the_peak(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code, out, err = run(["run", "--model", "mlp_tiny", "--batch-size", "4", "--device", "cpu", "--planner",
                              "greedy", "-m", "1.2x", "--steps", "1", "--methods", "unplanned,planned",
                              "-o", str(report_path), "--quiet", "--json"], capsys)
    assert code == 0, err
    printed = json.loads(out)
    report = json.loads(report_path.read_text())
    assert printed["memory_limit"] == report["memory_limit"] == round(1.2 * report["unplanned_peak_bytes"])
    assert report["plan"]["planner"] == "greedy" and set(report["methods"]) == {"unplanned", "planned"}
    assert err == ""  # --quiet


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is available")
def test_run_on_cuda_without_a_gpu_one_line(capsys):
    code, _, err = run(["run", "--model", "mlp_tiny", "--device", "cuda", "-m", "50%"], capsys)
    one_line_error(code, err, "no CUDA GPU is available")


@pytest.mark.parametrize("args,message", [
    (["-m", "0.5"], "ambiguous"),
    (["-m", "50%", "--planner", "nonsense"], "unknown planner 'nonsense'"),
    (["-m", "50%", "--methods", "planned,magic"], "unknown method 'magic'"),
    (["-m", "50%", "--agent", "/nonexistent.pt"], "no such file"),
])
def test_run_bad_input_one_line(args, message, capsys):
    code, _, err = run(["run", "--model", "mlp_tiny", "--device", "cpu", *args], capsys)
    one_line_error(code, err, message)


def test_run_script_and_subcommand_share_names():
    from dqn_swap.cli import run_cmd
    from dqn_swap.integrations.experiment import METHODS, RENAMED_METHODS

    assert run_cmd.METHOD_NAMES == METHODS and run_cmd.RENAMED_METHODS == RENAMED_METHODS


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scripts_take_their_earlier_spelling():
    train = load_script("train_agent")
    assert train.translate(["--trace", "a.trace", "--trace", "gpt_tiny:4", "--limits", "90%", "30%", "8e9",
                            "--steps", "5", "--out", "x.pt"], "train") == [
        "train", "a.trace", "gpt_tiny:4", "--memory-limits", "90%,30%,8e9", "--steps", "5",
        "--output", "x.pt"]
    runner = load_script("run_planned_training")
    assert runner.translate(["gpt", "--limit", "0.5x", "--out", "r.json", "--quiet"]) == [
        "run", "--model", "gpt", "--memory-limit", "0.5x", "--output", "r.json", "--force", "--quiet"]  # run's planner
    assert runner.translate(["gpt", "--planner", "dqn"])[-2:] == ["--memory-limit", "50%"]  # above any minimum


# --------------------------------------------------------------------------- help
@pytest.mark.parametrize("command", ["train", "finetune", "run"])
def test_help_of_new_subcommands(command, capsys):
    code = main([command, "--help"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Example" in out and f"dqn-swap {command} " in out and "%%" not in out


def test_top_level_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    positions = [out.index(f"    {c} ") for c in
                 ("record", "inspect", "simulate", "plan", "compare", "train", "finetune", "run")]
    assert positions == sorted(positions)


# --------------------------------------------------------------------------- simulate, plan, compare
def test_simulate_with_a_baseline(resnet, capsys):
    code, out, err = run(["simulate", str(resnet), "-m", "70%", "--planner", "greedy", "--json"], capsys)
    assert code == 0, err
    figures = json.loads(out)
    assert figures["feasible"] is True and figures["planner"] == "greedy"
    assert figures["peak_bytes"] <= figures["memory_limit"]
    trace = Trace.load(resnet)
    assert figures["memory_limit"] == round(trace.minimum_memory + 0.7 * (trace.peak_bytes - trace.minimum_memory))


def test_plan_writes_a_plan_and_refuses_to_overwrite_it(resnet, tmp_path, capsys):
    from dqn_swap.plan import Plan

    path = tmp_path / "plan.json"
    code, out, err = run(["plan", str(resnet), "-m", "80%", "--planner", "greedy", "-o", str(path)], capsys)
    assert code == 0, err
    assert str(path) in out and path.exists()
    plan = Plan.load(path, Trace.load(resnet))
    assert plan.planner == "greedy"
    before = path.read_bytes()
    code, _, err = run(["plan", str(resnet), "-m", "80%", "--planner", "greedy", "-o", str(path)], capsys)
    one_line_error(code, err, "already exists")
    assert path.read_bytes() == before
    code, out, err = run(["simulate", str(resnet), "--plan", str(path), "--json"], capsys)
    assert json.loads(out)["memory_limit"] == plan.memory_limit


def test_plan_optimal_reports_its_certified_bound(resnet, capsys):
    code, out, err = run(["simulate", str(resnet), "-m", "40%", "--planner", "optimal", "--time-limit", "5",
                          "--json"], capsys)
    assert code == 0, err
    figures = json.loads(out)
    assert figures["planner"] == "optimal" and figures["feasible"]
    assert figures["lower_bound"] <= figures["certified_bound"] * (1 + 1e-12)
    assert figures["certified_bound"] <= figures["makespan"] * (1 + 1e-9)
    assert figures["certified_gap"] == pytest.approx(figures["makespan"] / figures["certified_bound"] - 1)
    code, _, err = run(["simulate", str(resnet), "-m", "40%", "--planner", "optimal", "--time-limit", "0"], capsys)
    one_line_error(code, err, "--time-limit")


def test_search_simulations_set_dqn_search_local_search(resnet, tmp_path, capsys):
    """--search-simulations 0 turns dqn-search's local search off; a budget is recorded in the plan file."""
    plans = {}
    for n in ("0", "300"):
        path = tmp_path / f"plan{n}.json"
        code, out, err = run(["plan", str(resnet), "-m", "40%", "--planner", "dqn-search", "--search-simulations", n,
                              "-o", str(path)], capsys)
        assert code == 0, err
        plans[n] = json.loads(path.read_text())
    assert "polish" not in plans["0"]["settings"]
    polished = plans["300"]["settings"]["polish"]
    assert polished["simulations"] <= 300
    assert plans["300"]["figures"]["makespan"] <= plans["0"]["figures"]["makespan"] * (1 + 1e-12)
    code, _, err = run(["simulate", str(resnet), "-m", "40%", "--planner", "dqn-search", "--search-simulations",
                        "-5"], capsys)
    one_line_error(code, err, "--search-simulations")


def test_compare_with_optimal_measures_every_plan_against_the_ceiling(resnet, tmp_path, capsys):
    folder = tmp_path / "cmp"
    code, out, err = run(["compare", str(resnet), "--planners", "greedy,lru,optimal", "--memory-limits", "40%",
                          "--time-limit", "5", "-o", str(folder), "--json"], capsys)
    assert code == 0, err
    rows = {r["planner"]: r for r in json.loads(out)}
    opt = rows["optimal"]
    assert opt["ceiling_s"] == pytest.approx(opt["certified_bound_s"])
    for r in rows.values():
        assert r["ceiling_s"] == opt["ceiling_s"] and r["ceiling"] in ("optimum", "certified bound")
        if r["feasible"]:
            assert r["distance_to_ceiling"] == pytest.approx(r["makespan_s"] / r["ceiling_s"] - 1)
            assert r["distance_to_ceiling"] >= -1e-9
    assert "ceiling" in (folder / "compare.md").read_text()


def test_simulate_a_plan_made_for_another_trace(resnet, other_trace, tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert run(["plan", str(other_trace), "-m", "80%", "--planner", "greedy", "-o", str(path)], capsys)[0] in (0, 1)
    code, _, err = run(["simulate", str(resnet), "--plan", str(path)], capsys)
    one_line_error(code, err, "made for trace")


def test_compare_writes_tables_and_plots(resnet, tmp_path, capsys):
    folder = tmp_path / "cmp"
    code, out, err = run(["compare", str(resnet), "--planners", "greedy,window", "--memory-limits", "90%,60%",
                          "-o", str(folder), "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 4 and {r["planner"] for r in rows} == {"greedy", "window"}
    assert all(r["feasible"] for r in rows)
    assert "greedy" in (folder / "compare.md").read_text()
    with open(folder / "compare.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    for png in ("overhead.png", "makespan_lb.png"):
        assert (folder / png).stat().st_size > 1000
    code, _, err = run(["compare", str(resnet), "--planners", "greedy", "--memory-limits", "90%", "-o", str(folder)],
                       capsys)
    one_line_error(code, err, "already exists")


# --------------------------------------------------------------------------- run --plan
def test_run_follows_a_saved_plan_and_refuses_one_for_another_trace(tmp_path, capsys):
    """record + plan + run --plan: run records the same trace, follows the plan's actions at its limit;
    a plan of another batch size is refused in one line before any training."""
    trace_path, plan_path, report_path = tmp_path / "r.trace", tmp_path / "plan.json", tmp_path / "report.json"
    run_quietly(["record", "--model", "resnet_tiny", "--batch-size", "2", "--device", "cpu", "-o", str(trace_path)])
    run_quietly(["plan", str(trace_path), "-m", "50%", "--planner", "greedy", "-o", str(plan_path)])
    saved = json.loads(plan_path.read_text())
    assert saved["actions"]  # a plan that moves something
    code, out, err = run(["run", "--model", "resnet_tiny", "--batch-size", "2", "--device", "cpu", "--plan",
                          str(plan_path), "--steps", "1", "--methods", "planned", "-o", str(report_path),
                          "--quiet"], capsys)
    assert code == 0, err
    report = json.loads(report_path.read_text())
    assert report["trace"]["fingerprint"] == saved["trace_fingerprint"]
    assert report["memory_limit"] == saved["memory_limit"] and report["plan"]["file"] == str(plan_path)
    assert report["plan"]["planner"] == "greedy" and report["plan"]["swaps"] == len(saved["actions"])
    assert report["methods"]["planned"]["status"] == "ok"
    assert report["comparison"]["planned_peak_within_limit"] is True
    code, _, err = run(["run", "--model", "resnet_tiny", "--batch-size", "1", "--device", "cpu", "--plan",
                        str(plan_path), "--steps", "1", "--quiet"], capsys)
    one_line_error(code, err, f"{plan_path} (against the trace run recorded: resnet_tiny at batch size 1",
                   f"made for trace {saved['trace_fingerprint']}")
    code, _, err = run(["run", "--model", "resnet_tiny", "--batch-size", "1", "--device", "cpu", "--plan",
                        str(plan_path), "--trace", str(trace_path)], capsys)
    one_line_error(code, err, "a trace of batch size 2, not 1 (--batch-size)")


def test_run_plan_holds_the_plan_bytes_beside_the_devices_outside_bytes(tmp_path, capsys):
    """A saved plan's limit is its own bytes: ``run --plan`` adds what the device held outside the
    recorded iteration (a GPU trace's ``outside_bytes``, set here on a CPU trace) once, and takes
    nothing off (it once resolved the plan's bytes again as a device size, taking them off twice)."""
    from dqn_swap.trace import Trace

    trace_path, plan_path, report_path = tmp_path / "r.trace", tmp_path / "plan.json", tmp_path / "report.json"
    run_quietly(["record", "--model", "mlp_tiny", "--batch-size", "4", "--device", "cpu", "-o", str(trace_path)])
    trace = Trace.load(trace_path)
    outside = 3000
    trace.replace(meta={**trace.meta, "outside_bytes": outside}).save(trace_path, overwrite=True)
    assert Trace.load(trace_path).outside_bytes == outside
    run_quietly(["plan", str(trace_path), "-m", "50%", "--planner", "sqrt-n", "-o", str(plan_path)])
    saved = json.loads(plan_path.read_text())
    code, _, err = run(["run", "--model", "mlp_tiny", "--batch-size", "4", "--device", "cpu", "--plan",
                        str(plan_path), "--trace", str(trace_path), "--steps", "1", "--methods", "planned",
                        "-o", str(report_path), "--quiet"], capsys)
    assert code == 0, err
    report = json.loads(report_path.read_text())
    assert report["trace"]["outside_bytes"] == outside
    assert report["memory_limit"] == saved["memory_limit"] + outside


@pytest.mark.parametrize("args,message", [
    (["-m", "50%", "--plan", "p.json"], "--memory-limit does not go with --plan"),
    (["--plan", "p.json", "--planner", "lru"], "--planner does not go with --plan"),
    (["-m", "50%", "--trace", "t.trace"], "--trace goes with --plan"),
    ([], "--memory-limit is required"),
    (["--plan", "nosuch.json"], "nosuch.json: no such file"),
])
def test_run_plan_options_one_line(args, message, capsys):
    code, _, err = run(["run", "--model", "mlp_tiny", "--device", "cpu", *args], capsys)
    one_line_error(code, err, message)


def test_run_help_names_every_kind_of_model(capsys):
    assert main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for form in ("resnet_tiny", "hf:NAME", "hf:PATH/config.json", "gen:FAMILY:SEED", "package.module:function",
                 "--plan FILE", "--trace FILE"):
        assert form in out, form


def test_compare_shows_no_figures_for_an_infeasible_plan(resnet, tmp_path, capsys):
    """An infeasible cell gives the op where it fails and the bytes it lacks, no overhead, makespan or peak."""
    folder = tmp_path / "cmp"
    code, out, err = run(["compare", str(resnet), "--planners", "none,greedy", "--memory-limits", "100%,0%",
                          "-o", str(folder), "--json"], capsys)
    assert code == 0, err
    rows = {(r["planner"], r["limit"]): r for r in json.loads(out)}
    failed = rows[("none", "0%")]
    assert failed["feasible"] is False
    assert failed["overhead"] is None and failed["makespan_s"] is None and failed["peak_bytes"] is None
    assert failed["distance_to_ceiling"] is None and failed["makespan_over_lower_bound"] is None
    trace = Trace.load(resnet)
    assert 0 <= failed["fails_at_op"] < trace.n_ops and failed["fails_short_bytes"] > 0
    assert failed["fails_at"] == trace.op_label(failed["fails_at_op"])
    fits = rows[("none", "100%")]
    assert fits["feasible"] and fits["overhead"] == 0.0 and fits["fails_at_op"] is None
    with open(folder / "compare.csv") as f:
        csv_rows = {(r["planner"], r["limit"]): r for r in csv.DictReader(f)}
    assert csv_rows[("none", "0%")]["overhead"] == csv_rows[("none", "0%")]["makespan_s"] == ""
    assert csv_rows[("none", "0%")]["fails_at_op"] == str(failed["fails_at_op"])
    table = (folder / "compare.md").read_text()
    assert f"fails at #{failed['fails_at_op']}, {format_bytes(failed['fails_short_bytes'])} short" in table
    assert "-0.0%" not in table


def test_percent_has_no_negative_zero():
    from dqn_swap.cli.compare_cmd import percent

    assert percent(-1e-17) == "0.0%" and percent(-0.0) == "0.0%" and percent(0.0123) == "1.2%"
    assert percent(-0.02) == "-2.0%"


def test_every_planner_has_its_own_plot_style_and_the_legend_is_outside(resnet, tmp_path, monkeypatch):
    from dqn_swap.agents import planner_names
    from dqn_swap.cli import compare_cmd

    names = [*planner_names(), "extra-1", "extra-2", "extra-3"]
    assert len(names) >= 12
    styles = compare_cmd.planner_styles(names)
    keys = {(s["color"], s["marker"], s["linestyle"]) for s in styles.values()}
    assert len(keys) == len(names)
    assert (styles["dqn"]["color"], styles["dqn"]["marker"]) != (styles["optimal"]["color"],
                                                                 styles["optimal"]["marker"])
    assert compare_cmd.planner_styles(["optimal"]) == {"optimal": styles["optimal"]}  # the same in any comparison
    figures = []
    monkeypatch.setattr("dqn_swap.plots.save", lambda fig, path: figures.append(fig) or path)
    rows = compare_cmd.compare_grid({"r": Trace.load(resnet)}, ["90%", "60%"], ["greedy", "window", "lru"])
    compare_cmd.plot_comparison(rows, tmp_path, True)
    assert len(figures) == 2
    for fig in figures:
        assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
        legend = fig.legends[0]
        assert [t.get_text() for t in legend.get_texts()] == ["greedy", "window", "lru"]
        fig.canvas.draw()
        box, axes_box = legend.get_window_extent(), fig.axes[-1].get_window_extent()
        assert box.x0 >= axes_box.x1  # right of the axes: it covers no curve


def test_compare_says_why_sqrt_n_does_not_apply_to_a_recurrence():
    from dqn_swap.cli.compare_cmd import compare_grid, markdown_table
    from dqn_swap.models.rnn import CharLSTM
    from dqn_swap.recorder import record_trace

    torch.manual_seed(0)
    trace = record_trace(CharLSTM(vocab=11, hidden=16, layers=2), torch.randint(0, 11, (2, 12)),
                         lambda out: out.sum(), lambda p: torch.optim.SGD(p, lr=0.1), device="meta",
                         meta={"model": "char-lstm"})
    rows = compare_grid({"lstm": trace}, ["50%"], ["greedy", "sqrt-n"])
    cell = next(r for r in rows if r["planner"] == "sqrt-n")
    assert not cell["feasible"] and cell["not_applicable"].startswith("not applicable: the forward graph has")
    table = markdown_table(rows)
    assert f"not applicable: fails at #{cell['fails_at_op']}" in table
    assert f"`sqrt-n` is {cell['not_applicable']}." in table


MY_MODELS = '''
import torch
from dqn_swap.models import Workload


def small_mlp(batch_size, device):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
    x = torch.randn(batch_size, 32, device=device)
    y = torch.randint(0, 4, (batch_size,), device=device)
    return Workload("small_mlp", model, (x,), lambda out: torch.nn.functional.cross_entropy(out, y),
                    lambda params: torch.optim.SGD(params, lr=0.1))
'''


@pytest.mark.subprocess
def test_the_installed_command_records_a_model_of_the_current_folder(tmp_path):
    """`dqn-swap record --model mymodels:small_mlp` finds mymodels.py in the current folder, as
    `python -m dqn_swap` does (the installed script's own folder heads its sys.path, not the current one)."""
    import shutil
    import subprocess
    import sys

    script = Path(sys.executable).parent / "dqn-swap"
    if not script.exists():
        script = shutil.which("dqn-swap")
    if script is None:
        pytest.skip("the dqn-swap command is not installed")
    (tmp_path / "mymodels.py").write_text(MY_MODELS)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([str(script), "record", "--model", "mymodels:small_mlp", "--batch-size", "8", "-o", "m.trace"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert Trace.load(tmp_path / "m.trace").n_ops > 0


def test_compare_prints_a_short_table_with_one_recommendation_per_limit(resnet, tmp_path, capsys):
    """The short table (default, best baseline, best switch, lower bound: all over unplanned compute,
    the same reference in every run) and one line per limit saying which planner to use; every
    planner stays in compare.md, the CSV and the JSON."""
    from dqn_swap.cli.compare_cmd import recommend

    folder = tmp_path / "cmp"
    code, out, err = run(["compare", str(resnet), "--planners", "auto,lru,window,per-block,offload-all",
                          "--memory-limits", "60%,20%", "-o", str(folder)], capsys)
    assert code == 0, err
    assert "| limit | ceiling | auto (default) | best baseline | best switch | use |" in out
    lines = [line for line in out.splitlines() if " at 60%: use " in line or " at 20%: use " in line]
    assert len(lines) == 2, out
    md = (folder / "compare.md").read_text()
    assert "best switch" in md and "| window |" not in out and "window" in md.split("**Every planner**")[1]
    # the recommendation: the fastest feasible plan, or the default within 1 % of it
    cell = [{"planner": "auto", "feasible": True, "makespan_s": 1.005, "planning_s": 1, "overhead": 0.005,
             "lower_bound_s": 1.0},
            {"planner": "lru", "feasible": True, "makespan_s": 1.0, "planning_s": 0, "overhead": 0.0,
             "lower_bound_s": 1.0},
            {"planner": "window", "feasible": False, "makespan_s": None, "planning_s": 0, "overhead": None}]
    assert recommend(cell)[0] == "auto" and "within 0.5%" in recommend(cell)[1]
    cell[0]["makespan_s"] = 1.02
    assert recommend(cell)[0] == "lru"
    assert recommend([cell[2]])[0] is None


def test_compare_several_agents_at_once(resnet, tmp_path, capsys):
    from pathlib import Path as P

    agents = [str(P(__file__).parents[2] / "checkpoints" / "grid" / f"gpt@{x}.pt") for x in (50, 70)]
    code, out, err = run(["compare", str(resnet), "--planners", "dqn,lru", "--agent", *agents,
                          "--memory-limits", "50%", "-o", str(tmp_path / "c"), "--json"], capsys)
    assert code == 0, err
    assert {r["planner"] for r in json.loads(out)} == {"dqn@gpt@50", "dqn@gpt@70", "lru"}
    code, _, err = run(["compare", str(resnet), "--planners", "dqn", "--agent", agents[0], agents[0],
                        "--memory-limits", "50%", "-o", str(tmp_path / "d")], capsys)
    one_line_error(code, err, "the same agent twice")


def test_a_better_mean_names_the_cells_where_the_agent_to_beat_plans_better() -> None:
    """The summary's verdict: an agent kept for its mean score says where the reference plans better."""
    from types import SimpleNamespace

    from dqn_swap.cli.train_cmd import verdict

    def ev(step: int, phase: str | None, scores: dict[str, float]) -> dict:
        return {"step": step, "score": sum(scores.values()) / len(scores), **({"phase": phase} if phase else {}),
                "per_env": {n: {"return": -s} for n, s in scores.items()}}

    ref = ev(0, "reference", {"net@90%": 0.0109, "net@50%": 0.0577, "net@30%": 0.20})
    trained = ev(1000, None, {"net@90%": 0.0149, "net@50%": 0.0577, "net@30%": 0.10})
    result = SimpleNamespace(evaluations=[ref, trained], best={"step": 1000, "score": trained["score"]})
    score, said = verdict(result, "reference")
    assert score == ref["score"]
    assert said.startswith("training improved on the reference agent")
    assert "plans better at net@90% (0.0109 against 0.0149)" in said and "50%" not in said.split("plans better")[1]
    everywhere = SimpleNamespace(evaluations=[ref, ev(1000, None, {"net@90%": 0.01, "net@50%": 0.05, "net@30%": 0.1})],
                                 best={"step": 1000, "score": 0.0533})
    assert "not better everywhere" not in verdict(everywhere, "reference")[1]
    kept = SimpleNamespace(evaluations=[ref, trained], best={"step": 0, "phase": "reference", "score": ref["score"]})
    assert verdict(kept, "reference")[1].startswith("training did not improve on the reference agent")
