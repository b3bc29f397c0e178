#!/usr/bin/env python
"""The benchmark results as documents: ``docs/results.md`` and ``benchmarks/results/README.md``.

Both are generated from the result files in ``benchmarks/results/`` and nothing else, so
that every figure the documentation shows is one a result file holds, with the command,
commit, machine and date that file records::

    python benchmarks/report.py            # rewrite both documents
    python benchmarks/report.py --check    # exit 1 if either differs from what the files give

``CATALOG`` says what each result file shows; a result file it does not describe is an
error (``--check`` names it), so a new result is documented when it is added.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_DOC = ROOT / "docs" / "results.md"
INDEX_DOC = RESULTS / "README.md"

# Planner names as the guide writes them, for result files recorded under earlier names.
DISPLAY = {"checkpoint": "sqrt-n"}


@dataclass(frozen=True)
class Entry:
    """One result (a JSON file and the files made beside it) and what it shows."""

    pattern: str  # file name or glob of the JSON file, without the extension
    what: str
    section: str | None = None  # the docs/results.md section that shows it (None: the index only)


CATALOG: tuple[Entry, ...] = (
    Entry("default_planner_test", "The default planner (auto) on the test families' 56 cells beside every baseline, "
          "dqn and dqn-search, against the best plans known", "default"),
    Entry("default_planner_grid", "The default planner on the comparison grid against every baseline and switch",
          "default"),
    Entry("default_planner_anytime", "What the agent buys a search: the quality after 1 to 30 seconds of local search "
          "seeded by the agent, by the best baseline and by a fixed rule", "default"),
    Entry("default_train", "dqn-swap train with its defaults on three networks the zoo does not hold, against the "
          "shipped agent", "default"),
    Entry("planners_auto_*", "Planning time (CPU seconds of one thread) and overhead of auto on ResNet-50 b64, "
          "ResNet-1001 b64 and a 32-layer Llama", "default"),
    Entry("dqn_grid", "Comparison grid: every baseline and the agent made for each network or cell "
          "(checkpoints/grid/), simulated overhead in 20 cells", "grid"),
    Entry("dqn_grid_ensemble", "The grid planned by checkpoints/ensemble.pt alone, in one pass, against the best "
          "baseline (+0.001) and the certified bound"),
    Entry("dqn_grid_ensemble_members", "The grid planned by checkpoints/ensemble.pt decoded by members (the mean's "
          "plan and each agent's own, the fastest simulated kept), against the best baseline (+0.001)"),
    Entry("dqn_grid_ensemble_groups_members", "The same, with checkpoints/ensemble_groups.pt's plans in the running "
          "(its mean and each agent's, in its own environment)"),
    Entry("dqn_grid_default_only_search_tol", "The grid planned by the shipped agent alone, greedy (dqn) and "
          "with lookahead and local search (dqn-search), against the best baseline (+0.001) and the "
          "certified bound", "search"),
    Entry("optimal_grid_60s", "The exact planner on the grid at 60 CPU seconds a cell: optimum or certified "
          "gap, and every planner's distance to the bound", "optimal"),
    Entry("optimal_grid", "The exact planner on the grid at 600 s a cell; the bounds the two grid results "
          "above measure distance against", "optimal600"),
    Entry("optimal_scaling", "Solve time, program size and certified gap of the exact planner against graph "
          "size (ResNet-18 to -152, b64, 50 %)", "scaling"),
    Entry("optimal_bound_enumeration", "The certified bound checked against every plan of 5,000 random small "
          "traces", "bound"),
    Entry("polish_grid", "Local search on the best baseline's plan and on the agent's, on the grid's tight "
          "cells"),
    Entry("generalization_test", "Networks no agent was trained on: the generator's test families, every "
          "planner, the shipped agent", "test"),
    Entry("best_known", "The best feasible plan known per cell of the generated networks (network, batch size, "
          "profile, limit): planner and settings that found it, trace fingerprint, makespan, and the certified "
          "lower bound beside it; the table agents are scored against (bench_generalization.py --best-known)"),
    Entry("generalization_validation_polish", "The generator's validation families (24 cells), the shipped "
          "agent with and without local search, and the polished best baseline", "validation"),
    Entry("generalization_validation_ablation", "How the agent is taught, on the validation families: TD "
          "learning with improved demonstrations against expert iteration, a narrow corpus and a wider network, "
          "each agent alone in one pass (benchmarks/ablation_expert.sh)", "expert"),
    Entry("generalization_test_ablation", "The same agents on the test families, against the best plans known "
          "(benchmarks/ablation_expert.sh)", "expert"),
    Entry("generalization_validation_joint", "The shipped ensemble fine-tuned as a whole (the mean of its agents' "
          "Q-values trained, with the ensembles' plans decoded by members as demonstrations), on the validation "
          "families, in one pass (benchmarks/ablation_joint.sh)", "expert"),
    Entry("generalization_test_joint", "The same ensembles on the test families, against the best plans known "
          "(benchmarks/ablation_joint.sh)", "expert"),
    Entry("generalization_test_trainval", "Ensembles of agents trained on the training and validation families "
          "together, against as many of the shipped ensemble's agents, on the test families in one pass "
          "(benchmarks/ablation_trainval.sh)", "expert"),
    Entry("ensemble_value_gate", "The shipped ensemble's member chosen in one pass by its own value of the first "
          "state, against the mean and decoding by members, on the validation families "
          "(benchmarks/ablation_value_gate.py)", "expert"),
    Entry("dqn_grid_train8", "The grid planned in one pass by eight of checkpoints/ensemble.pt's agents "
          "(benchmarks/ablation_trainval.sh)"),
    Entry("dqn_grid_trainval8", "The grid planned in one pass by eight agents trained on the training and "
          "validation families (benchmarks/ablation_trainval.sh)"),
    Entry("env_ceiling", "What the agent's environment can express: every best plan known replayed in it as a "
          "demonstration, with recompute chains offered and not", "ceiling"),
    Entry("user_baselines", "What users would switch on instead (per-block checkpointing, torchtune's activation "
          "offloading, both, torch.compile's activation-budget knapsack) against dqn and the best baseline",
          "user"),
    Entry("table1", "The window paper's Table 1 in simulation: ResNet-50 under 16 GiB, images/s against "
          "batch size, every planner, two link profiles", "table1"),
    Entry("table1_b1440_dqn_search", "Table 1's batch 1440 planned by dqn-search and dqn", "table1"),
    Entry("dqn_ablation_small", "Ablation of the DQN's named options on two small networks, two seeds",
          "ablation"),
    Entry("dqn_ablation_demonstrations_small", "Demonstrations (DQfD) against none, small networks",
          "demonstrations"),
    Entry("dqn_ablation_demonstrations_resnet50", "Demonstrations (DQfD) against none, ResNet-50 b64",
          "demonstrations"),
    Entry("dqn_train_resnet50*", "Wall time to train an agent on ResNet-50 b64 (20,000 steps)", "train"),
    Entry("dqn_plan_time", "The agent's planning time on ResNet-1001 b64, greedy and cover decoding",
          "plantime"),
    Entry("dqn_transfer_finetune20_sched_*_s[0-9]", "Fine-tuning as it is now (the learning rate raised over the "
          "first tenth of the updates and lowered to zero at the end, updates from a twentieth of the steps), "
          "the three small-to-large pairs against training from scratch, 20 % of the steps, one seed per file",
          "transfer"),
    Entry("dqn_transfer_finetune20_interleave_*_s[0-9]", "The same sources and scratch runs, fine-tuned with "
          "every cell's episode in progress and the steps taken in the cells in turn (an option measured "
          "and removed: worse in five of seven runs)", "transfer"),
    Entry("dqn_transfer_finetune20_const_*_s[0-9]", "The same sources and scratch runs, fine-tuned as before "
          "(constant rate, updates from step 200)", "transfer"),
    Entry("dqn_transfer_finetune20_s[0-9]", "Fine-tuning the shipped agent for 20 % of the steps against "
          "training from scratch (ResNet-152, Llama-8l), one seed per file", "transfer"),
    Entry("dqn_transfer_finetune20_seeds", "The three seeds' curves as one plot "
          "(checkpoints/transfer_finetune20_seeds.png)"),
    Entry("dqn_transfer_finetune20_llama_lr1_s[0-9]", "The same on Llama-8l with the full learning rate",
          "transfer"),
    Entry("dqn_transfer_finetune20_se_cnn_s[0-9]", "Fine-tuning an agent of a small squeeze-excitation CNN "
          "(gen:se_cnn:2) on a larger one (gen:se_cnn:1) against training from scratch there, 20 % of the steps",
          "transfer"),
    Entry("dqn_transfer_finetune20_se_cnn_lr1_s[0-9]", "The same from gen:se_cnn:2 with the full learning rate",
          "transfer"),
    Entry("dqn_transfer_finetune20_se_cnn_tf1_s[0-9]", "The same from gen:se_cnn:2 with one update per step, "
          "fine-tuning's default since (the scratch runs evaluated every 1,000 steps, as by default)", "transfer"),
    Entry("dqn_transfer_finetune20_resnet50_152_s[0-9]", "Fine-tuning an agent trained on ResNet-50 b32 alone "
          "(4,000 steps, same seed) on ResNet-152 b32 against training from scratch there, 20 % of the steps",
          "transfer"),
    Entry("dqn_transfer_finetune20_llama8_32_s[0-9]", "Fine-tuning an agent trained on an 8-layer Llama alone "
          "(4,000 steps, same seed) on a 32-layer one of the same width (benchmarks/configs/llama-32l-512) "
          "against training from scratch there, 20 % of the steps", "transfer"),
    Entry("dqn_transfer_finetune20_demonstrations", "The same with demonstrations for both runs", "transfer"),
    Entry("dqn_transfer_finetune20_search", "The shipped, scratch and fine-tuned agents planning through "
          "dqn-search (needs the seed-0 transfer run's agents in runs/transfer/)", "transfer-search"),
    Entry("planners_*", "Planning time (CPU seconds of one thread, simulations) and overhead of dqn and "
          "dqn-search: ResNet-50 b64, ResNet-1001 b64, a 32-layer Llama at sequence length 4,096"),
    Entry("search_grid*", "dqn-search on the grid with no time cap: overhead, CPU seconds and simulations "
          "per cell (search_grid_before: the search before moves were screened by their memory need)"),
    Entry("dqn_env_steps", "Environment steps per second on ResNet-50 b64"),
    Entry("runtime_overhead_cpu", "Planned training's step time against unplanned, CPU, one thread",
          "overhead"),
    Entry("runtime_host_cpu", "The runtime's own CPU cost per saved tensor, on a chain of tiny ops", "host"),
    Entry("runtime_memory_cpu", "Planned training's measured CPU peak against the limit and the prediction, "
          "every planner on every model", "memory"),
    Entry("runtime_memory_cpu_ensemble", "The same measure for the plans of checkpoints/ensemble.pt, on every model"),
    Entry("runtime_memory_cpu_ensemble_members", "The same measure for the plans of ensemble.pt decoded by members "
          "with ensemble_groups.pt, on every model"),
    Entry("runtime_memory_late_copies", "The same cases on a stand-in device whose copies run late, against the "
          "simulated peak", "memory"),
    Entry("autoplan_overhead_cpu", "autoplan's step time against PlannedExecution and unplanned training",
          "autoplan"),
    Entry("variants_cpu", "Iterations that never repeat (wav2vec2 with layerdrop and time masking): planning "
          "variants as they come, the first plan alone, or safe mode throughout", "variants"),
    Entry("background_planning_cpu", "autoplan planning on a worker thread against planning inline, in a loop "
          "of three batch shapes: loop time, the longest step, steps waiting in safe mode, bit-identity",
          "background"),
    Entry("varying_loops_background_cpu", "The varying-loops benchmark's autoplan cells with plans made on a "
          "worker thread (planning=\"background\"): stops, steps over the limit, bit-identity, collections of "
          "the garbage collector on the worker", "background"),
    Entry("varying_loops_cpu", "Planned training on Hugging Face, PyG and custom models in the loops users write "
          "(padding, held outputs, accumulation, parameter groups added midway, retain_graph, bf16) through autoplan, "
          "the Trainer callback and PlannedExecution: stops, steps over the limit, bit-identity, variants; shapes "
          "that change at every step, exact against buckets", "varying"),
    Entry("virtual_clock_cpu", "The runtime's step on the virtual clock against the simulated makespan, every "
          "planner on every model of the memory benchmark", "clock"),
    Entry("runtime_*", "Planned training on a GPU (bench_runtime.py on CUDA)", "gpu"),
    Entry("record", "Recording time, host memory, file size and load time on meta", "record"),
    Entry("simulator*", "Simulation speed"),
)

SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("default", "The default planner",
     "`auto` (`dqn_swap/agents/auto.py`): the quick baselines, `dqn-search` with the shipped agent and the "
     "baselines' plans polished by local search, within a budget of seconds that grows with the trace; the "
     "fastest plan that fits. Overheads are simulated; CPU seconds are one thread's."),
    ("grid", "Comparison grid",
     "Simulated overhead, (makespan - compute) / compute, of every planner at 90/70/50/30 % on five "
     "networks (meta traces, profile `v100-pcie3`); `×`: the plan does not fit; bold: the lowest baseline. "
     "`dqn` is the agent made for the network or cell (`checkpoints/grid/`, else `default.pt`); "
     "M/LB its makespan over the lower bound."),
    ("search", "The shipped agent alone, with and without search",
     "`default.pt` on every cell, greedy (`dqn`) and with lookahead and local search (`dqn-search`); "
     "a cell counts when the plan is within 0.001 of the best baseline's overhead."),
    ("optimal", "The exact planner, 60 CPU seconds a cell",
     "Per cell the optimum (overhead), or a bound on it (≥) with the certified gap of the best plan, which "
     "bound proves it, the solve time, and every planner's distance to the bound, makespan / bound - 1 "
     "(bold: the best plan)."),
    ("optimal600", "The exact planner, 600 s a cell", "The bounds the grid results above are measured against."),
    ("scaling", "Solve time against graph size", "ResNets at b64, 50 %, 600 s a solve."),
    ("bound", "The certified bound, checked by enumeration",
     "Random small traces whose every plan was enumerated and simulated: the bound must never exceed the "
     "optimum, and a proof must never be claimed falsely."),
    ("test", "Networks never seen: the test families",
     "Two networks of each of the seven test families at their own batch size, profile and precision, every "
     "baseline and user switch, the shipped agent alone (`dqn`) and with search, and the best plan known "
     "(`best_known.json`); `✓`: at or below the best baseline (+0.001)."),
    ("validation", "Networks never seen: the validation families", "Three networks of each validation family."),
    ("expert", "Teaching the agent: expert iteration, corpus and width",
     "Every agent planned alone, in one pass (`dqn`), on two networks of each validation family at four limits, "
     "then on the test families' 56 cells against the best plans known; the arms trained 6,000 steps each "
     "unless named (docs/learning.md, \"Expert iteration\")."),
    ("ceiling", "What the agent's environment can express",
     "Every plan of the table of best plans known (the test families, 56 cells), replayed in the environment an "
     "agent plans in, as a demonstration is replayed: no agent alone does better than the episode its "
     "environment lets it reach. With recompute chains off (the environment's default), removals whose "
     "producer reads another removed tensor are not offered."),
    ("user", "The switches users reach for",
     "Hugging Face's per-block checkpointing, torchtune's activation offloading, the two together and "
     "torch.compile's activation-memory-budget knapsack, modelled in the simulator, against the agent and the "
     "best baseline of the papers."),
    ("table1", "The window paper's Table 1",
     "ResNet-50 recorded on meta at each batch of the paper's table, planned under 16 GiB, images/s = batch / "
     "simulated iteration time. The paper's rows are its measurements on a V100; ours are simulated with the "
     "`v100-nvlink` roofline, which puts the unplanned iteration at 335 images/s where the paper measured 581: "
     "compare shapes and ratios. The table's `dqn-search` row was planned without local search; the last "
     "table plans batch 1440 with it."),
    ("ablation", "DQN ablation",
     "Best and final greedy score (mean overhead plus penalty over the 8 environments, lower is better), "
     "averaged over the seeds."),
    ("demonstrations", "Demonstrations", "The same score, with and without DQfD demonstrations."),
    ("train", "Training time", "20,000 steps on ResNet-50 b64 at four limits."),
    ("plantime", "Planning time on a large graph", "ResNet-1001 b64 (about 80,000 events), the shipped agent."),
    ("transfer", "Fine-tuning against training from scratch",
     "Best greedy score of each run (lower is better); fine-tuning gets 20 % of the scratch run's steps. The "
     "`se_cnn` runs fine-tune an agent trained (20,000 steps, same seed) on a smaller member of the family, "
     "`gen:se_cnn:2` (1,789 events), on a larger one, `gen:se_cnn:1` (3,448). `resnet50_152` and `llama8_32` "
     "fine-tune an agent trained (4,000 steps, same seed) on ResNet-50 b32 or an 8-layer Llama b16 alone on "
     "ResNet-152 b32 or a 32-layer Llama of the same width b16. These and `se_cnn_tf1` fine-tune with one "
     "update per step, fine-tuning's default now; the older runs, with one every four. The last column is the first evaluation at which "
     "the scratch run scored as well as the fine-tuned agent's best."),
    ("transfer-search", "Planned through `dqn-search`", "Mean overhead over the four limits."),
    ("overhead", "Planned training's step time (CPU)",
     "Median step time against unplanned training, the methods interleaved step by step in one run."),
    ("host", "The runtime's own cost per saved tensor (CPU)",
     "A chain of 256 `tanh` on 16 elements, each saving one tensor (next to no compute): (planned step - "
     "unplanned step) / saved tensors, one thread, the methods interleaved. Live check `ops`: every forward op's "
     "name against the trace (the default); `packs`: the saves alone, as before the op check existed."),
    ("memory", "Planned training's memory (CPU)",
     "Measured peak from the allocator's timeline against the limit and the plan's prediction."),
    ("autoplan", "`autoplan`'s cost", "CPU seconds of one thread per step, the methods interleaved."),
    ("variants", "Iterations that never repeat",
     "`benchmarks/bench_variants.py`: three policies on the same steps, CPU seconds of the training thread and "
     "the simulated seconds of a GPU profile."),
    ("background", "Planning off the training thread",
     "`autoplan(..., planning=\"background\")` against the default, planning inline; wall seconds, the modes one "
     "after the other in one warm process."),
    ("varying", "Loops that vary (CPU)",
     "Every step measured from one allocator timeline over the whole run (the step's start included), against "
     "the limit of the plan it followed; training's state against unplanned training of the same loop."),
    ("clock", "The runtime against the simulator, on the virtual clock",
     "Each plan followed through the real runtime on the virtual-clock stand-in device "
     "(`dqn_swap/runtime/clock.py`: ops take the profile's time, copies their bytes over its bandwidth, "
     "the host waits where the runtime waits), against the simulator's makespan for the same plan; "
     "profile `v100-pcie3`."),
    ("gpu", "Planned training on a GPU", "Step time, throughput and peak memory on CUDA."),
    ("record", "Recording", "Meta device; a fresh process per case."),
)


def entry_for(stem: str) -> Entry | None:
    """The catalog entry of a result file's stem: an exact name first, then the first matching glob."""
    for e in CATALOG:
        if e.pattern == stem:
            return e
    return next((e for e in CATALOG if fnmatch.fnmatchcase(stem, e.pattern)), None)


def load(stem: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{stem}.json").read_text())


def display(text: str) -> str:
    """Planner names of older result files as the guide writes them."""
    for old, new in DISPLAY.items():
        text = re.sub(rf"(?<![\w/.-]){old}(?![\w/.-])", new, text)
    return text


def command_of(d: dict[str, Any]) -> str:
    cmd = d.get("command") or "; ".join(d.get("commands", [])) or "(not recorded)"
    return cmd if not cmd.startswith("benchmarks/") else f"python {cmd}"


def provenance_line(stem: str) -> str:
    d = load(stem)
    commit = str(d.get("commit", "(not recorded)"))
    sha = commit.split()[0][:12] if commit[:1].isalnum() else commit
    return (f"<sub>`benchmarks/results/{stem}.json` · `{command_of(d)}` · commit {sha} · "
            f"{str(d.get('date', '(no date)')).split(' (')[0]} · {d.get('machine', '(machine not recorded)')}</sub>")


def tables_of(md: str) -> str:
    """A result's markdown from its first table or ``###`` heading on (the lines before are its
    provenance, which :func:`provenance_line` gives from the JSON), with ops named ``op N``."""
    lines = md.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(("|", "### "))), len(lines))
    out: list[str] = []
    for ln in lines[start:]:
        if ln.startswith("### ") and out and out[-1]:
            out.append("")
        if not (ln == "" and out and out[-1] == ""):
            out.append(ln)
        if ln.startswith("### "):
            out.append("")
    return display(re.sub(r"#(\d+) ", r"op \1 ", "\n".join(out).strip()))


def fmt(x: float | None, spec: str = ".4f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def pct_text(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f} %"


# --------------------------------------------------------------------------------------------- sections
def s_grid() -> tuple[str, list[str]]:
    d = load("dqn_grid")
    text = tables_of((RESULTS / "dqn_grid.md").read_text())
    if f"in {d['wins']} of {d['n_cells']} cells" not in text:
        raise SystemExit("report: dqn_grid.md does not match dqn_grid.json; re-run the grid")
    return text, ["dqn_grid"]


def s_search() -> tuple[str, list[str]]:
    d = load("dqn_grid_default_only_search_tol")
    from common import NAMES

    rows = ["| network | limit | best baseline | `dqn` | `dqn-search` | `dqn-search` to the bound |", "|---|---|---|---|---|---|"]
    for c in d["cells"]:
        b = c["best_baseline"]
        best = f"{c[b]['overhead']:.4f} ({display(b)})" if b else "none fits"
        s = c["dqn-search"]
        rows.append(f"| {NAMES.get(c['model'], c['model'])} | {round(c['limit'] * 100)} % | {best} | "
                    f"{fmt(c['dqn']['overhead'])} | {fmt(s['overhead'])} | {pct_text(s.get('distance_to_bound'))} |")
    rows.append("")
    rows.append(f"At or below the best baseline (+{d['tolerance']:g}): `dqn` {d['wins']} of {d['n_cells']} cells, "
                f"`dqn-search` {d['search_wins']} of {d['n_cells']}. Geometric-mean distance to the certified "
                f"bound: `dqn` {pct_text(d['dqn_geomean_distance_to_bound'])}, `dqn-search` "
                f"{pct_text(d['dqn-search_geomean_distance_to_bound'])}; to the optimum over the proved cells: "
                f"{pct_text(d['dqn_geomean_distance_to_optimum_proved_cells'])} and "
                f"{pct_text(d['dqn-search_geomean_distance_to_optimum_proved_cells'])}.")
    return "\n".join(rows), ["dqn_grid_default_only_search_tol"]


def s_md(stem: str) -> Callable[[], tuple[str, list[str]]]:
    return lambda: (tables_of((RESULTS / f"{stem}.md").read_text()), [stem])


def s_mds(*stems: str) -> Callable[[], tuple[str, list[str]]]:
    """Several results' tables in one section, each under its file's name."""
    return lambda: ("\n\n".join(f"`{stem}`:\n\n" + tables_of((RESULTS / f"{stem}.md").read_text()) for stem in stems),
                    list(stems))


def s_generalization(stem: str) -> Callable[[], tuple[str, list[str]]]:
    def build() -> tuple[str, list[str]]:
        text = tables_of((RESULTS / f"{stem}.md").read_text())
        summary = load(stem).get("summary", {})
        means = [f"`{name}` {v['geomean_vs_best']:.3f}" for name, v in summary.items() if "geomean_vs_best" in v]
        if means:
            text += ("\n\nMakespan over the best baseline's, geometric mean over the cells: " + ", ".join(means) + ".")
        return text, [stem]
    return build


def s_bound() -> tuple[str, list[str]]:
    d = load("optimal_bound_enumeration")
    t = d["totals"]
    rows = ["| traces | plans simulated | bound above the optimum | false proofs | proved optimal | "
            "largest bound / optimum |", "|---|---|---|---|---|---|",
            f"| {t['cases']:,} | {t['plans_simulated']:,} | {t['bound_violations']} | {t['false_proofs']} | "
            f"{t['proved']:,} | {t['max_bound_over_optimum']:.6f} |"]
    return "\n".join(rows), ["optimal_bound_enumeration"]


def s_table1() -> tuple[str, list[str]]:
    text = tables_of((RESULTS / "table1.md").read_text())
    d = load("table1_b1440_dqn_search")
    rows = ["| batch 1440, `v100-nvlink`, 16 GiB | overhead | images/s | planning s |", "|---|---|---|---|"]
    for name in ("dqn", "dqn-search"):
        r = d[name]
        rows.append(f"| `{name}` | {r['overhead']:.4f} | {r['images_per_s']:.0f} | {r.get('planning_s', float('nan')):.1f} |")
    return text + "\n\n" + "\n".join(rows), ["table1", "table1_b1440_dqn_search"]


def s_ablation() -> tuple[str, list[str]]:
    d = load("dqn_ablation_small")
    rows = ["| variant | best | final | seconds per run |", "|---|---|---|---|"]
    rows += [f"| {k} | {v['best']:.4f} | {v['final']:.4f} | {v['seconds']:.0f} |"
             for k, v in d.items() if isinstance(v, dict) and "best" in v]
    return "\n".join(rows), ["dqn_ablation_small"]


def s_demonstrations() -> tuple[str, list[str]]:
    rows = ["| networks | variant | best | final | seconds per run |", "|---|---|---|---|---|"]
    stems = ["dqn_ablation_demonstrations_small", "dqn_ablation_demonstrations_resnet50"]
    for stem in stems:
        d = load(stem)
        nets = "ResNet-50 b64, 1 seed" if "resnet50" in stem else "resnet_tiny b8 + gpt_tiny b4, 2 seeds"
        rows += [f"| {nets} | {k} | {v['best']:.4f} | {v['final']:.4f} | {v['seconds']:.0f} |"
                 for k, v in d.items() if isinstance(v, dict) and "best" in v]
    return "\n".join(rows), stems


def s_train() -> tuple[str, list[str]]:
    stems = sorted(p.stem for p in RESULTS.glob("dqn_train_resnet50*.json"))
    rows = ["| file | threads | minutes | best score |", "|---|---|---|---|"]
    for stem in stems:
        d = load(stem)
        threads = re.search(r"--threads (\d+)", d.get("command", ""))
        rows.append(f"| `{stem}` | {threads.group(1) if threads else '?'} | {d['seconds'] / 60:.1f} | "
                    f"{d['best']['score']:.4f} |")
    return "\n".join(rows), stems


def s_default() -> tuple[str, list[str]]:
    """The default planner: its scorecard on the test families, the grid, its planning time on large graphs,
    the quality per second of search by seed, and what train with its defaults gives."""
    test = load("default_planner_test")
    rows = ["| planner | cells at or below the best baseline | makespan / best known | makespan / best baseline's | "
            "CPU s per cell, median | max |", "|---|---|---|---|---|---|"]
    for name in ("auto", "dqn-search", "dqn", "best baseline polished"):
        c = test["scorecard"][name]
        rows.append(f"| {name} | {c['wins']} / {c['cells']} | {c['geomean_vs_best_known']:.4f} | "
                    f"{c['geomean_vs_best']:.4f} | {c['cpu_seconds_median']:.2f} | {c['cpu_seconds_max']:.2f} |")
    parts = ["The test families (two networks of each of seven families no agent was trained on, four limits):",
             "\n".join(rows), "The comparison grid:", tables_of((RESULTS / "default_planner_grid.md").read_text())]
    stems = ["default_planner_test", "default_planner_grid"]
    timing = sorted(p.stem for p in RESULTS.glob("planners_auto_*.json"))
    if timing:
        rows = ["| network | events | limit | overhead | CPU s | wall s |", "|---|---|---|---|---|---|"]
        for stem in timing:
            d = load(stem)
            for r in d["rows"]:
                rows.append(f"| {d['trace']} | {d['events']:,} | {round(r['fraction'] * 100)} % | {fmt(r['overhead'])} | "
                            f"{r['cpu_s']:.2f} | {r['planning_s']:.2f} |")
        parts += ["Planning time on large graphs (one thread):", "\n".join(rows)]
        stems += timing
    for stem, title in (("default_planner_anytime", "What the agent buys a search:"),
                        ("default_train", "`dqn-swap train` with its defaults:")):
        if (RESULTS / f"{stem}.md").exists():
            parts += [title, tables_of((RESULTS / f"{stem}.md").read_text())]
            stems.append(stem)
    return "\n\n".join(parts), stems


def s_plantime() -> tuple[str, list[str]]:
    d = load("dqn_plan_time")
    decs = d.get("decodings", ["greedy", "cover"])
    rows = ["| limit | " + " | ".join(f"{x}: seconds, actions, overhead" for x in decs) + " |",
            "|---|" + "---|" * len(decs)]
    for lim, r in d.items():
        if isinstance(r, dict) and lim.endswith("%"):
            rows.append(f"| {lim} | " + " | ".join(
                f"{r[x]['seconds']:.2f} s, {r[x]['n_actions']}, {fmt(r[x]['overhead'])}" for x in decs if x in r) + " |")
    return "\n".join(rows), ["dqn_plan_time"]


def s_transfer() -> tuple[str, list[str]]:
    stems = sorted(p.stem for p in RESULTS.glob("dqn_transfer_finetune20_*.json")
                   if p.stem not in ("dqn_transfer_finetune20_search", "dqn_transfer_finetune20_seeds"))
    rows = ["| run | network | fine-tuned from | from scratch: best (s) | fine-tuned: best (s) | reached | "
            "scratch steps to the fine-tuned best |", "|---|---|---|---|---|---|---|"]
    for stem in stems:
        d = load(stem)
        for net, r in d.items():
            if isinstance(r, dict) and "scratch_best" in r:
                # where the scratch run first scored as well as the fine-tuned agent's best (None: never)
                level = next((step for step, score in r.get("scratch_curve", []) if score <= r["finetune_best"]), None)
                rows.append(f"| {stem.removeprefix('dqn_transfer_finetune20_')} | {net} | "
                            f"`{Path(r.get('agent', 'checkpoints/default.pt')).name}` | {r['scratch_best']:.4f} "
                            f"({r.get('scratch_seconds', 0):.0f}) | {r['finetune_best']:.4f} "
                            f"({r.get('finetune_seconds', 0):.0f}) | {'yes' if r.get('reached') else 'no'} | "
                            f"{'never' if level is None else format(level, ',') + ' of ' + format(r['scratch_steps'], ',')} |")
    return "\n".join(rows), stems


def s_transfer_search() -> tuple[str, list[str]]:
    d = load("dqn_transfer_finetune20_search")
    nets = [k for k, v in d.items() if isinstance(v, dict)]
    agents = list(d[nets[0]])
    rows = ["| network | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents)]
    rows += [f"| {n} | " + " | ".join(f"{d[n][a]['mean']:.4f}" for a in agents) + " |" for n in nets]
    return "\n".join(rows), ["dqn_transfer_finetune20_search"]


def s_memory() -> tuple[str, list[str]]:
    rows = ["| device | cases | models (written outside the zoo) | planners | limits | precisions | above the limit | "
            "measured / predicted | bit-identical |", "|---|---|---|---|---|---|---|---|---|"]
    stems = [stem for stem in ("runtime_memory_cpu", "runtime_memory_late_copies") if (RESULTS / f"{stem}.json").exists()]
    for stem in stems:
        d = load(stem)
        s = d["summary"]
        late = d.get("late_copies")
        device = (f"stand-in, copies {late * 1e3:g} ms late (predicted: the simulated peak)" if late else
                  "CPU, copies at once (predicted: the schedule with instant copies)")
        rows.append(f"| {device} | {s['cases']} | {s['models']} ({s['foreign_models']}) | "
                    f"{', '.join(display(p) for p in s['planners'])} | {', '.join(s['limits'])} | "
                    f"{', '.join(s['precisions'])} | {s['over_limit']} | "
                    f"{s['min_measured_over_predicted']:.3f} to {s['max_measured_over_predicted']:.3f} | "
                    f"{s['bit_identical']} |")
    return "\n".join(rows), stems


def s_gpu() -> tuple[str, list[str]]:
    stems = sorted(p.stem for p in RESULTS.glob("runtime_*.json")
                   if p.stem not in ("runtime_overhead_cpu", "runtime_memory_cpu", "runtime_memory_late_copies",
                                     "runtime_host_cpu"))
    if not stems:
        return "No GPU measurement is recorded yet: `python benchmarks/bench_runtime.py --steps 10 --planner dqn " \
               "--max-batch` on a CUDA machine writes `benchmarks/results/runtime_<gpu>.{json,md}`.", []
    parts = []
    for s in stems:
        note = load(s).get("note")
        parts.append((f"{note}\n\n" if note else "") + tables_of((RESULTS / f"{s}.md").read_text()))
    return "\n\n".join(parts), stems


BUILDERS: dict[str, Callable[[], tuple[str, list[str]]]] = {
    "default": lambda: s_default(),
    "grid": s_grid, "search": s_search, "optimal": s_md("optimal_grid_60s"), "optimal600": s_md("optimal_grid"),
    "scaling": s_md("optimal_scaling"), "bound": s_bound, "test": s_generalization("generalization_test"),
    "validation": s_generalization("generalization_validation_polish"),
    "expert": s_mds("generalization_validation_ablation", "generalization_test_ablation",
                    "generalization_validation_joint", "generalization_test_joint",
                    "generalization_test_trainval", "ensemble_value_gate"),
    "ceiling": s_md("env_ceiling"), "table1": s_table1, "ablation": s_ablation,
    "demonstrations": s_demonstrations, "train": s_train, "plantime": s_plantime, "transfer": s_transfer,
    "transfer-search": s_transfer_search, "overhead": s_md("runtime_overhead_cpu"), "memory": s_memory,
    "host": s_md("runtime_host_cpu"),
    "autoplan": s_md("autoplan_overhead_cpu"), "background": s_mds("background_planning_cpu", "varying_loops_background_cpu"),
    "variants": s_md("variants_cpu"),
    "clock": s_md("virtual_clock_cpu"),
    "varying": s_md("varying_loops_cpu"), "user": s_md("user_baselines"), "gpu": s_gpu, "record": s_md("record"),
}

GENERATED = "<!-- Generated by `python benchmarks/report.py` from benchmarks/results/; do not edit by hand. -->"


def results_doc() -> str:
    """``docs/results.md``: every section's tables with the provenance of the files they come from."""
    parts = [GENERATED, "", "# Benchmark results", "",
             "Every table here is made from a file in `benchmarks/results/` by `python benchmarks/report.py`; "
             "under each, the file, the command that made it, the commit, the date and the machine. Simulated "
             "figures come from the simulator (`docs/simulator.md`); times are seconds on the machine named. "
             "`benchmarks/results/README.md` lists every result file.", ""]
    for key, title, intro in SECTIONS:
        text, stems = BUILDERS[key]()
        parts += [f"## {title}", "", intro, "", text, ""]
        parts += [provenance_line(s) + "  " for s in stems]
        if stems:
            parts[-1] = parts[-1].rstrip()
            parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def result_stems() -> list[str]:
    return sorted({p.stem for p in RESULTS.iterdir() if p.name != "README.md" and p.is_file()})


def index_doc() -> str:
    """``benchmarks/results/README.md``: each result file, what it shows and the command that makes it."""
    lines = [GENERATED, "", "# Benchmark results", "",
             "Each result: the files, what it shows, and the command that made it, as the JSON file records it "
             "(with the commit and the date; the machine is in the file). The tables are in `docs/results.md`.",
             "", "| files | what it shows | command | commit, date |", "|---|---|---|---|"]
    for stem in result_stems():
        e = entry_for(stem)
        if e is None:
            raise SystemExit(f"report: benchmarks/results/{stem}.* is not described in CATALOG "
                             "(benchmarks/report.py); add an entry")
        files = ", ".join(f"`{p.name}`" for p in sorted(RESULTS.glob(f"{glob_escape(stem)}.*")))
        if (RESULTS / f"{stem}.json").exists():
            d = load(stem)
            commit = str(d.get("commit", "")).split(" ")[0][:12] or "—"
            cmd, date = command_of(d), str(d.get("date", "—")).split(" (")[0]
        else:
            cmd, commit, date = "(made with its JSON)", "—", "—"
        lines.append(f"| {files} | {display(e.what)} | `{cmd}` | {commit}, {date} |")
    return "\n".join(lines) + "\n"


def glob_escape(stem: str) -> str:
    return re.sub(r"([\[\]*?])", r"[\1]", stem)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed documents instead of writing")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    docs = {RESULTS_DOC: results_doc(), INDEX_DOC: index_doc()}
    if args.check:
        stale = [p.relative_to(ROOT) for p, text in docs.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"report: {', '.join(map(str, stale))} differ from the result files; run python benchmarks/report.py",
                  file=sys.stderr)
            return 1
        return 0
    from dqn_swap.files import write_text

    for path, text in docs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text, overwrite=True)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
