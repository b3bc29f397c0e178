"""``dqn-swap run``: record, plan (or take a saved plan) and really train a network under a memory limit."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..files import write_text
from ..units import format_bytes
from .common import AGENT_HELP, MAX_SEED, MAX_STEPS, batch_size, check_host_memory, load_trace, whole

# The names of dqn_swap.integrations.experiment.METHODS and RENAMED_METHODS, written out so that
# --help does not import torch (a test checks they agree).
METHOD_NAMES = ("unplanned", "planned", "torch-checkpoint", "save_on_cpu")
RENAMED_METHODS = {"checkpoint": "torch-checkpoint"}

#: What ``--model`` accepts besides the zoo, as ``dqn-swap record`` (:func:`dqn_swap.user_code.load_workload`).
MODEL_FORMS = ("hf:NAME, a Hugging Face architecture (hf:gpt2, hf:llama, hf:bert, hf:vit) or hf:PATH/config.json; "
               "gen:FAMILY:SEED, a network drawn from a family of dqn_swap.models.generator (gen:mlp_mixer:3); or "
               "your own, as 'package.module:function' where function(batch_size, device) returns a "
               "dqn_swap.models.Workload")

RUN_LIMIT_HELP = ("GPU memory limit for the plan: a percentage, as everywhere in dqn-swap (0%% is the least "
                  "memory any plan needs for the recorded trace, 100%% its unplanned peak); a multiple of "
                  "the unplanned peak, 0.5x (on CUDA the peak the unplanned run measured, else the "
                  "trace's); or bytes with a unit (8GiB, 512MiB)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from dqn_swap.agents import planner_help

    from ..models import MODEL_NAMES

    p = sub.add_parser(
        "run", help="train a network for real following a plan, beside the alternatives",
        description="Record one iteration of a network on the device, plan swapping and "
                    "recomputation for the memory limit (or take a saved plan made for that trace, --plan), "
                    "then train a few steps following the plan "
                    "and measure step time, throughput and peak memory beside unplanned training, "
                    "full activation checkpointing with torch.utils.checkpoint (torch-checkpoint) and "
                    "torch's save_on_cpu, with the simulator's "
                    "prediction for the plan. Optionally find the largest batch that trains under a "
                    "budget. On the CPU the peak is measured from the allocator's timeline and compared with "
                    "the limit and the plan's prediction.",
        epilog="Examples: dqn-swap run --model resnet50 --batch-size 256 --memory-limit 50% "
               "-o report.json; dqn-swap run --model gpt --batch-size 8 -m 0.7x --planner greedy "
               "--max-batch planned,torch-checkpoint (0.7x: 70 % of the unplanned peak); a saved plan: "
               "dqn-swap record --model mlp_tiny --batch-size 4 --device cpu -o m.trace, "
               "dqn-swap plan m.trace -m 50% -o plan.json, then "
               "dqn-swap run --model mlp_tiny --batch-size 4 --device cpu --plan plan.json")
    p.add_argument("--model", required=True, help=f"a zoo network ({', '.join(MODEL_NAMES)}); {MODEL_FORMS}")
    p.add_argument("--batch-size", type=batch_size, default=32, help="batch size (default 32)")
    p.add_argument("--memory-limit", "-m", help=RUN_LIMIT_HELP + " (required unless --plan gives it)")
    p.add_argument("--planner",
                   help=f"who plans (default auto: the best plan in a few seconds): {planner_help()}; or your own, "
                        "package.module:name (a planner class or factory of the current folder's code)")
    p.add_argument("--plan", metavar="FILE",
                   help="follow this saved plan (dqn-swap plan) instead of planning: it must have been made "
                        "for the trace run records, that is one recorded by dqn-swap record with the same "
                        "--model, --batch-size, --seed and --profile on this --device (on the CPU op "
                        "times come from the profile; on CUDA they are measured anew, so pass the plan's "
                        "trace with --trace); a plan for another trace is refused before any training. "
                        "The limit and the device profile are the plan's")
    p.add_argument("--trace", metavar="FILE",
                   help="with --plan: the trace the plan was made for, used instead of recording one "
                        "(its model and batch size, where it records them, must be --model and --batch-size)")
    p.add_argument("--agent", help=f"for --planner auto (the default) / dqn / dqn-search: {AGENT_HELP}")
    p.add_argument("--steps", type=whole(1, MAX_STEPS, "steps"), default=10, help="measured training steps per method, after one "
                                                         "warm-up step (default 10)")
    p.add_argument("--device", choices=["cuda", "cpu"],
                   help="where to train (default: cuda when a GPU is available, else cpu)")
    p.add_argument("--methods", default=",".join(METHOD_NAMES),
                   help=f"comma-separated methods to run (default all: {','.join(METHOD_NAMES)}); unplanned "
                        "is plain training, planned follows the plan, torch-checkpoint wraps every block in "
                        "torch.utils.checkpoint, save_on_cpu keeps every saved tensor on the host")
    p.add_argument("--max-batch", default="", metavar="METHODS",
                   help="comma-separated methods whose largest batch size under --budget is searched "
                        "(measured on CUDA; on the CPU only unplanned and planned, predicted)")
    p.add_argument("--budget", help="memory budget of --max-batch, same forms as --memory-limit "
                                    "(default: the limit)")
    p.add_argument("--profile", help="device profile for planning (default: measured on CUDA, v100-pcie3 on the CPU)")
    p.add_argument("--seed", type=whole(0, MAX_SEED, "seed"), default=0, help="random seed for weights and inputs (default 0)")
    p.add_argument("--no-expandable-segments", action="store_true",
                   help="keep CUDA's default allocator settings (default: expandable segments on)")
    p.add_argument("-o", "--output", help="write the full report here (JSON)")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.add_argument("--quiet", action="store_true", help="print no progress messages and no table")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.set_defaults(func=run)


def methods(text: str, option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    renamed = [t for t in items if t in RENAMED_METHODS]
    if renamed:
        raise ValueError(f"{option}: the method {renamed[0]!r} is now called {RENAMED_METHODS[renamed[0]]!r}")
    bad = [t for t in items if t not in METHOD_NAMES]
    if bad:
        raise ValueError(f"{option}: unknown method {bad[0]!r}; choose from {', '.join(METHOD_NAMES)}")
    return items


def run(args: argparse.Namespace) -> int:
    import torch

    from ..cost import PROFILES
    from ..limits import MemoryLimit
    from ..integrations.experiment import run_planned_training

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA GPU is available (use --device cpu)")
    run_methods, max_batch = _checked_options(args)
    plan, trace = _saved_plan(args) if args.plan is not None else (None, None)
    MemoryLimit.parse(args.memory_limit)  # syntax errors now, not after recording and training
    if args.budget is not None:
        if not max_batch:
            raise ValueError("--budget is the memory budget of --max-batch, which is not given")
        MemoryLimit.parse(args.budget)
    if args.profile is not None and args.profile != "measured" and args.profile not in PROFILES:
        raise ValueError(f"unknown device profile {args.profile!r}; choose one of: measured, {', '.join(PROFILES)}")
    from ..plots import check_output

    out = check_output(args.output, args.force) if args.output is not None else None
    if plan is None:
        from dqn_swap.agents import get_planner

        get_planner(args.planner, agent=args.agent)  # unknown names and unreadable agent files fail now
        from ..planners import check_options_apply

        check_options_apply([args.planner], ["--agent"] if args.agent is not None else [])

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[run] {message}", file=sys.stderr, flush=True)

    if args.device == "cpu":
        from ..user_code import load_workload

        check_host_memory(lambda device: load_workload(args.model, args.batch_size, device, args.seed),
                          args.model, args.batch_size)
    report = run_planned_training(args.model, args.batch_size, args.memory_limit,
                                  plan.planner if plan is not None else args.planner, args.steps,
                                  args.device, profile=args.profile, methods=run_methods, seed=args.seed,
                                  expandable_segments=not args.no_expandable_segments, budget=args.budget,
                                  max_batch_methods=max_batch, agent=args.agent, progress=say, plan=plan,
                                  trace=trace, plan_source=f"{args.plan} (against the trace run recorded: "
                                  f"{args.model} at batch size {args.batch_size}, seed {args.seed})")
    if plan is not None:
        report["plan"]["file"] = args.plan
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text(out, json.dumps(report, indent=1, default=str) + "\n", overwrite=True)
        report["report"] = str(out)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    elif not args.quiet:
        print(report_table(report))
        if out is not None:
            print(f"wrote {out}")
    planned = report["methods"].get("planned")
    return 1 if planned is not None and planned.get("status") != "ok" else 0


def _checked_options(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The options that go together (a saved plan brings its own limit and planner), each refused
    in one line; returns the methods to run and those whose largest batch is searched."""
    from ..planners import DEFAULT_PLANNER

    if args.plan is None:
        if args.trace is not None:
            raise ValueError("--trace goes with --plan: it names the trace a saved plan was made for")
        if args.memory_limit is None:
            raise ValueError("--memory-limit is required (or --plan FILE, a saved plan with its own limit)")
        args.planner = args.planner or DEFAULT_PLANNER
    else:
        for option, value in (("--memory-limit", args.memory_limit), ("--planner", args.planner),
                              ("--agent", args.agent), ("--max-batch", args.max_batch or None)):
            if value is not None:
                raise ValueError(f"{option} does not go with --plan: the saved plan brings its own limit and "
                                 "planner (re-plan with dqn-swap plan to change them)")
    if args.steps < 1:
        raise ValueError(f"--steps must be at least 1, not {args.steps}")
    run_methods = methods(args.methods, "--methods")
    if not run_methods:
        raise ValueError("--methods is empty; choose from " + ", ".join(METHOD_NAMES))
    max_batch = methods(args.max_batch, "--max-batch")
    if args.max_batch.strip() and not max_batch:
        raise ValueError("--max-batch is empty; choose from " + ", ".join(METHOD_NAMES))
    return run_methods, max_batch


def _saved_plan(args: argparse.Namespace):  # noqa: ANN202
    """``--plan FILE`` (and ``--trace``) read and checked now, not after the unplanned runs: the
    plan, and its trace where given; the limit and profile taken from the plan."""
    import torch

    from ..cost import PROFILES
    from ..plan import Plan

    trace = None
    plan = Plan.load(args.plan)
    on_cuda = args.device == "cuda" or (args.device is None and torch.cuda.is_available())
    if args.profile is None and not on_cuda and plan.profile in PROFILES:
        args.profile = plan.profile  # the profile the plan's trace was recorded with
    if args.trace is not None:
        trace = load_trace(args.trace)
        for key, value in (("model", args.model), ("batch_size", args.batch_size)):
            if trace.meta.get(key) is not None and trace.meta[key] != value:
                raise ValueError(f"{args.trace}: a trace of {key.replace('_', ' ')} {trace.meta[key]}, not "
                                 f"{value} (--{key.replace('_', '-')})")
        plan.check_trace(trace, args.plan)
        from ..simulator import verify_plan

        verify_plan(trace, plan, args.plan)  # an edited schedule is refused now, not after the unplanned runs
    elif on_cuda:
        raise ValueError(f"--plan {args.plan} on CUDA needs --trace FILE, the trace it was made for: a "
                         "recording on CUDA measures op times anew, so it never matches the plan's trace")
    args.memory_limit = plan.memory_limit
    return plan, trace


def report_table(report: dict[str, Any]) -> str:
    """The report of :func:`~dqn_swap.integrations.experiment.run_planned_training` as a table for people."""

    def size(value: Any) -> str:
        return format_bytes(value) if isinstance(value, (int, float)) else "-"

    plan = report["plan"]
    spec = report.get("memory_limit_spec")
    limit = size(report["memory_limit"]) + (f" ({spec})" if spec and spec != str(report["memory_limit"]) else "")
    source = " measured" if report.get("unplanned_peak_source") == "measured" else ""
    lines = [f"{report['model']} batch {report['batch_size']} on {report.get('gpu') or report['device']}, "
             f"limit {limit}, unplanned peak{source} {size(report['unplanned_peak_bytes'])}; "
             f"plan: {plan['planner']}, {plan['swaps']} swaps / {plan['recomputes']} recomputes",
             f"{'method':<12} {'status':<7} {'step ms':>9} {'samples/s':>10} {'peak alloc':>12} {'peak reserved':>14}"]
    for name, r in report["methods"].items():
        if r.get("status") != "ok":
            lines.append(f"{name:<12} {r.get('status', '?'):<7} {r.get('error', '')}".rstrip())
            continue
        alloc = size(r.get("peak_allocated"))
        reserved = size(r.get("peak_reserved"))
        lines.append(f"{name:<12} {'ok':<7} {r['step_time_s'] * 1e3:>9.2f} {r['throughput']:>10.1f} "
                     f"{alloc:>12} {reserved:>14}")
    if not str(report["device"]).startswith("cuda"):
        lines.append(f"memory on {report['device']}: the allocator's timeline of one more, untimed step "
                     "(save_on_cpu not measured: its host memory is the same memory)")
        lines.append(f"times on {report['device']}: host compute, with copies that are moves within host memory; "
                     "they say nothing of a GPU's, so no step time is compared (the simulator's are the profile's "
                     "GPU's)")
    sim = report.get("simulator")
    if sim:
        overhead = f"{100 * sim['overhead']:.1f}%" if isinstance(sim.get("overhead"), float) else "-"
        lines.append(f"simulator: feasible {sim['feasible']}, overhead {overhead}, peak {size(sim['peak_bytes'])}, "
                     f"peak with instant copies (what a synchronous device holds) "
                     f"{size(sim.get('instant_copy_peak_bytes'))}")
    for key, value in report.get("comparison", {}).items():
        if key.endswith("_allocated") or key.endswith("_bytes"):
            lines.append(f"{key}: {size(value)}")
        else:
            lines.append(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
    for method, r in report.get("largest_batch", {}).items():
        if isinstance(r, dict):
            found = r["batch_size"] if r.get("batch_size") is not None else "none"
            lines.append(f"largest batch under {size(report['largest_batch']['budget'])} with {method}: "
                         f"{found} ({r['how']})")
    return "\n".join(lines)
