"""``dqn-swap train``: train a DQN agent on traces at several memory limits."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from .common import MAX_SEED, MAX_STEPS, MAX_THREADS, human, print_json, print_table, whole
from .simulate_cmd import LIMIT_HELP

TRACE_HELP = ("a trace file written by 'dqn-swap record', or MODEL:BATCH recorded now on the meta device: "
              "a zoo network (resnet_tiny:8), a Hugging Face model (hf:gpt2:8, hf:PATH/config.json:8), or a "
              "generated network gen:FAMILY:SEED (at its own batch size and profile; gen:FAMILY:SEED:BATCH "
              "for another batch)")
LIMITS_HELP = "comma-separated memory limits, each paired with every trace (default 90%%,70%%,50%%,30%%). "


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a DQN agent that plans swapping and recomputation",
        description="Train the structure2vec deep Q-network on one or more traces at several memory "
                    "limits (every trace is paired with every limit and episodes cycle through the "
                    "pairs), and save the agent with the weights of its best greedy evaluation. "
                    "Training must beat the shipped agent on these traces and limits, or the output holds the "
                    "shipped agent's weights and the summary says so. Use it with "
                    "'dqn-swap plan/simulate/compare/run --agent FILE' (the default planner searches from its "
                    "plans; --planner dqn for its greedy plan alone).",
        epilog="Example: dqn-swap train resnet_tiny:8 gpt_tiny:4 --memory-limits 90%,70%,50%,30% "
               "--steps 20000 -o agent.pt --curve agent.png")
    p.add_argument("traces", nargs="+", metavar="TRACE", help=TRACE_HELP)
    add_training_options(p, default_limits="90%,70%,50%,30%")
    p.add_argument("--steps", type=whole(1, MAX_STEPS, "steps"),
                   help="environment steps to train for (default 20000: the shipped agent's, about 10 CPU-minutes "
                        "on five small networks; evaluated every twentieth of them unless --set eval_every)")
    p.add_argument("--reference", default="default", metavar="AGENT_FILE",
                   help="the agent to beat, evaluated first on the same traces and limits; where training does not "
                        "beat it, the output holds its weights and the summary says so (default: the shipped agent; "
                        "'none': no reference)")
    p.add_argument("--seed", type=whole(0, MAX_SEED, "seed"), default=0, help="random seed: the same seed gives the same agent (default 0)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from the -o file's resume file (OUTPUT.resume, written "
                        "at every evaluation); same traces, limits and settings")
    p.set_defaults(func=run)


def add_training_options(p: argparse.ArgumentParser, default_limits: str) -> None:
    """Options ``train`` and ``finetune`` share."""
    p.add_argument("--memory-limits", "-m", default=default_limits, help=LIMITS_HELP + LIMIT_HELP)
    p.add_argument("-o", "--output", required=True, help="agent file to write (.pt)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="change a training setting (a field of dqn_swap.agents.dqn.DQNConfig, for example "
                        "--set eval_every=500 --set learning_rate=3e-4); repeatable")
    p.add_argument("--profile", help="device profile for transfer times (default: the one each trace was "
                                     "recorded with; MODEL:BATCH traces are recorded with v100-pcie3)")
    p.add_argument("--log-dir", default="runs",
                   help="TensorBoard logs go to LOG_DIR/RUN_NAME (default ./runs); 'none' writes no logs")
    p.add_argument("--run-name", help="name of the TensorBoard run (default OUTPUT-STEM__sSEED__TIME)")
    p.add_argument("--curve", help="also write a PNG of the evaluation score over training")
    p.add_argument("--threads", type=whole(1, MAX_THREADS, "threads"), help="CPU threads for torch while training (default 1: the graphs "
                                               "are small, and more threads thrash on a busy machine)")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def split_limits(text: str) -> list[str]:
    limits = [s.strip() for s in text.split(",") if s.strip()]
    if not limits:
        raise ValueError("--memory-limits is empty (for example 90%,70%,50%,30% or 8GiB,6GiB)")
    return limits


def training_limits(traces: dict[str, Any], texts: list[str]) -> list[Any]:
    """The CLI's limits as the trainer takes them (:class:`dqn_swap.limits.MemoryLimit`), checked
    against every trace."""
    from ..limits import MemoryLimit

    out = []
    for text in texts:
        limit = MemoryLimit.parse(text)
        for name, trace in traces.items():
            try:
                limit.resolve(trace)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        out.append(limit)
    return out


def check_outputs(args: argparse.Namespace, resume: bool = False) -> Path:
    """Refuse to replace files before any work is done."""
    from ..plots import check_output

    out = check_output(args.output, args.force or resume)
    if args.curve:
        check_output(args.curve, args.force, png=True)
    return out


def load_traces(specs: list[str], profile: str | None) -> dict[str, Any]:
    from dqn_swap.agents.dqn.report import load_trace_spec

    from ..cost import DEFAULT_PROFILE, PROFILES

    if profile is not None and profile not in PROFILES:
        raise ValueError(f"unknown device profile {profile!r}; choose one of: {', '.join(PROFILES)}")
    traces: dict[str, Any] = {}
    for spec in specs:
        if not spec.endswith(".trace") and not Path(spec).exists() and ":" not in spec:
            raise FileNotFoundError(f"{spec}: no such trace file (a zoo network is written MODEL:BATCH, "
                                    "for example resnet_tiny:8)")
        if ":" in spec and not Path(spec).exists():
            from dqn_swap.models import split_model_spec

            split_model_spec(spec)  # a bad batch is a one-line error before any recording
        traces[spec] = load_trace_spec(spec, profile or DEFAULT_PROFILE)
    return traces


def check_settings(overrides: dict[str, Any]) -> None:
    import dataclasses

    from dqn_swap.agents.dqn import DQNConfig

    names = [f.name for f in dataclasses.fields(DQNConfig)]
    unknown = [k for k in overrides if k not in names]
    if unknown:
        raise ValueError(f"--set {unknown[0]}: not a training setting; choose from: {', '.join(names)}")


def log_dir(text: str | None) -> str | None:
    return None if text is None or text.strip().lower() in ("", "none") else text


def command_line(args: argparse.Namespace) -> str:
    return "dqn-swap " + " ".join(shlex.quote(a) for a in getattr(args, "argv", None) or [args.command])


def verdict(result: Any, start_phase: str) -> tuple[float | None, str]:
    """The score of the agent the run had to beat (its step-0 evaluation of phase ``start_phase``:
    ``reference`` for train, ``start`` for finetune; None: none) and one plain sentence on the outcome."""
    first = next((e for e in result.evaluations if e.get("phase") == start_phase), None)
    if first is None:
        return None, ""
    who = "the reference agent" if start_phase == "reference" else "the starting agent"
    if result.best.get("phase") == start_phase:
        return first["score"], (f"training did not improve on {who} (score {first['score']:.4f}): the file holds "
                                f"{who}'s weights")
    said = (f"training improved on {who}: score {result.best['score']:.4f} against "
            f"{first['score']:.4f} ({result.best['score'] / first['score'] - 1:+.1%})"
            if first["score"] else f"training improved on {who}")
    worse = worse_cells(result, first)
    if worse:
        said += (f"; it is not better everywhere: the file holds the better agent on the mean, and {who} plans "
                 f"better at {', '.join(worse)}")
    return first["score"], said


def worse_cells(result: Any, first: dict[str, Any]) -> list[str]:
    """The cells (trace @ limit) where the agent kept scores worse than the one to beat (its evaluation
    ``first``), each with both scores, the one to beat's first: what a better mean can hide."""
    best = next((e for e in result.evaluations if e.get("step") == result.best.get("step")
                 and e.get("phase") == result.best.get("phase")), None)
    if best is None or not best.get("per_env") or not first.get("per_env"):
        return []
    return [f"{name} ({-first['per_env'][name]['return']:.4f} against {-row['return']:.4f})"
            for name, row in best["per_env"].items()
            if name in first["per_env"] and -row["return"] > -first["per_env"][name]["return"] + 1e-12]


def summarise(result: Any, args: argparse.Namespace, curve_label: str, start_phase: str = "reference") -> int:
    """Write the curve, print the summary (or JSON)."""
    evaluations = result.evaluations
    last = {k: v for k, v in evaluations[-1].items() if k != "per_env"} if evaluations else {}
    start_score, outcome = verdict(result, start_phase)
    curve = None
    if args.curve:
        from dqn_swap.agents.dqn.report import plot_curves

        curve = str(plot_curves({curve_label: [(e["step"], e["score"]) for e in evaluations]}, args.curve,
                                title=f"{Path(args.output).name}: {', '.join(args.traces)} @ {args.memory_limits}"))
    summary = {"agent_file": str(result.path), "steps": result.steps, "wall_time_s": round(result.wall_time, 2),
               "best": dict(result.best), "last_evaluation": last,
               "per_environment": evaluations[-1].get("per_env", {}) if evaluations else {},
               "traces": list(args.traces), "memory_limits": split_limits(args.memory_limits), "curve": curve,
               f"{start_phase}_score": start_score, "outcome": outcome}
    if args.json:
        print_json(summary)
        return 0
    best = result.best
    rows = [("agent file", summary["agent_file"]), ("steps", str(result.steps)),
            ("wall time", human("wall_time_s", result.wall_time)),
            ("best", f"score {best.get('score', float('nan')):.4f} at step {best.get('step')} "
                     f"(overhead {best.get('overhead', float('nan')):.4f}, feasible {best.get('feasible', 0):.0%})")]
    if last:
        rows.append(("last evaluation", f"step {last['step']}: score {last['score']:.4f}, overhead "
                                        f"{last['overhead']:.4f}, feasible {last['feasible']:.0%}, "
                                        f"{last['n_swap']:.1f} swaps, {last['n_recompute']:.1f} recomputes"))
    if start_score is not None:
        rows.insert(3, (f"{'reference' if start_phase == 'reference' else 'starting'} agent", f"score {start_score:.4f}"))
    if curve:
        rows.append(("curve", curve))
    print_table(rows)
    if outcome:
        print(outcome)
    print("score: mean over (trace, limit) of overhead plus penalties of the greedy plan; lower is better")
    print(f"use it: dqn-swap plan TRACE -m 50% --agent {result.path} -o plan.json (the default planner, auto, "
          "searches from its plans; --planner dqn for its greedy plan alone)")
    return 0


def run(args: argparse.Namespace) -> int:
    from dqn_swap.agents.dqn.report import parse_overrides

    out = check_outputs(args, resume=args.resume)
    overrides = parse_overrides(args.overrides)
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps must be at least 1, not {args.steps}")
        overrides["total_timesteps"] = args.steps
    from dqn_swap.agents.dqn import DQNConfig

    check_settings(overrides)
    from dqn_swap.agents.dqn.algorithm import eval_cadence, reference_mismatch

    overrides.setdefault("eval_every", eval_cadence(overrides.get("total_timesteps", DQNConfig().total_timesteps)))
    config = DQNConfig().replace(seed=args.seed, **overrides)
    limit_texts = split_limits(args.memory_limits)
    traces = load_traces(args.traces, args.profile)
    limits = training_limits(traces, limit_texts)
    reference = None
    if args.reference.strip().lower() != "none" and not args.resume:
        from dqn_swap.agents.dqn.agent_file import agent_location

        reference = agent_location(args.reference)
        if not reference.is_file():
            raise FileNotFoundError(f"{reference}: no such agent file (--reference)")
        why = reference_mismatch(reference, config)
        if why is not None:
            import sys

            print(f"dqn-swap train: no reference agent: {args.reference} cannot be compared ({why})", file=sys.stderr)
            reference = None
    from dqn_swap.agents.dqn.algorithm import train

    result = train(list(traces.values()), limits, out, config, profile=args.profile, log_dir=log_dir(args.log_dir),
                   run_name=args.run_name, progress=None, resume=args.resume, overwrite=args.force,
                   command=command_line(args), threads=args.threads, reference=reference)
    return summarise(result, args, "greedy plan")
