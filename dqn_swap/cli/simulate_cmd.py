"""``dqn-swap simulate`` and ``dqn-swap plan``: one planner, one trace, one limit."""

from __future__ import annotations

import argparse
import sys
import time

from ..cost import PROFILES
from .common import (AGENT_HELP, add_planner_options, given_flags, human, load_trace, planner_values, print_json,
                     print_table, showing_progress)

LIMIT_HELP = ("GPU memory limit: a percentage, where 0%% is the least memory any plan needs (what stays at "
              "the busiest op with every saved activation, and the input batch where autograd saves it, away "
              "from its last forward use to its next use) and 100%% the unplanned peak; a multiple of the unplanned peak (0.5x); or bytes with a unit "
              "(8GiB, 6.5GB, 512MiB), the GPU's memory: what a GPU trace says the device held beside the iteration "
              "comes off. A bare number is bytes; one of at most 1 is refused as ambiguous")


def add_common(p: argparse.ArgumentParser) -> None:
    from dqn_swap.agents import planner_help

    p.add_argument("trace", help="trace file written by 'dqn-swap record'")
    p.add_argument("--memory-limit", "-m", required=False, help=LIMIT_HELP)
    p.add_argument("--planner", default=None,
                   help=f"who plans (default auto: the best plan in a few seconds): {planner_help()}; or your own, "
                        "package.module:name (a planner class or factory of the current folder's code)")
    p.add_argument("--agent", help=f"for --planner auto / dqn / dqn-search: {AGENT_HELP}")
    p.add_argument("--profile", choices=list(PROFILES),
                   help="device profile for transfer times (default: the one the trace was recorded with)")
    add_planner_options(p)
    p.add_argument("--keep", action="append", default=[], metavar="PIN",
                   help="a saved activation every plan must keep on the device (never swapped nor recomputed): "
                        "a tensor id, or a pattern matched against the name of the module whose op made it "
                        "('layers.0.*') or the op's ('aten.gelu*'); repeat for more")
    p.add_argument("--recompute", action="append", default=[], metavar="PIN",
                   help="a saved activation every plan must recompute (same forms as --keep)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def pins_of(args: argparse.Namespace):  # noqa: ANN201
    """``--keep`` and ``--recompute`` as :class:`~dqn_swap.pins.Pins` (a number is a tensor id), or None."""
    from ..pins import Pins

    def one(text: str) -> int | str:
        return int(text) if text.strip().isdigit() else text

    pins = Pins(tuple(one(x) for x in args.keep), tuple(one(x) for x in args.recompute))
    return pins or None


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "simulate", help="simulate a plan on a trace and print its cost",
        description="Simulate one training iteration under a memory limit, following a plan made by "
                    "--planner or read from --plan, and print makespan, overhead, stalls, bytes "
                    "moved, peak memory and makespan over the lower bound.",
        epilog="Examples: dqn-swap simulate r50.trace -m 60% --planner window; "
               "dqn-swap simulate r50.trace --plan plan.json --json")
    add_common(s)
    s.add_argument("--plan", help="simulate this plan file instead of planning (its limit is used "
                                  "unless --memory-limit is given)")
    s.set_defaults(func=run_simulate)
    p = sub.add_parser(
        "plan", help="plan swapping and recomputation for a trace and write a plan file",
        description="Decide which tensors to swap out and which to recompute so the iteration fits "
                    "the memory limit, and write the plan (JSON) with its simulated figures.",
        epilog="Example: dqn-swap plan r50.trace -m 8GiB --planner greedy -o plan.json")
    add_common(p)
    p.add_argument("-o", "--output", required=True, help="plan file to write (JSON)")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.set_defaults(func=run_plan)


def made_by(plan) -> dict:  # noqa: ANN001
    """Which of the default planner's candidates made the plan (empty for other planners)."""
    chosen = plan.settings.get("chosen") if plan.planner == "auto" else None
    return {"chosen": chosen} if chosen else {}


def certified(plan) -> dict:  # noqa: ANN001
    """The optimal planner's certified bound and gap, as figures (empty for other planners)."""
    s = plan.settings
    if "certified_bound" not in s:
        return {}
    return {"certified_bound": s["certified_bound"], "certified_gap": s["certified_gap"],
            "proved_optimal": s["proved_optimal"], "solve_s": s["solve_seconds"]}


def make_plan(trace, limit_text: str, planner_name: str, agent: str | None, profile_name: str | None,
              options: dict | None = None, pins=None):  # noqa: ANN001
    """Resolve the limit, run the planner, return (plan, planning seconds, profile).  ``options``: the
    planner options given (:func:`.common.planner_values`); one the planner does not read is refused."""
    from dqn_swap.agents import get_planner

    from ..cost import profile_of
    from ..planners import DEFAULT_PLANNER, check_options_apply, planner_options, settings_from
    from ..trace import resolve_memory_limit

    if limit_text is None:
        raise ValueError("--memory-limit is required (for example 60% or 8GiB)")
    planner_name = planner_name or DEFAULT_PLANNER
    options = options or {}
    check_options_apply([planner_name], [flag for flag, (o, _) in planner_options().items() if o.dest in options]
                        + (["--agent"] if agent is not None else []))
    limit = resolve_memory_limit(trace, limit_text)
    say_outside(trace, limit_text, limit)
    profile = profile_of(trace, profile_name)
    planner = get_planner(planner_name, agent=agent, pins=pins, **settings_from(planner_name, options))
    t0 = time.perf_counter()
    with showing_progress():
        plan = planner.plan(trace, limit, profile)
    return plan, time.perf_counter() - t0, profile


def say_outside(trace, limit_text: str, limit: int) -> None:  # noqa: ANN001
    """One line on stderr where a size or multiple lost the bytes a GPU held outside the iteration."""
    from ..limits import MemoryLimit
    from ..units import format_bytes

    if trace.outside_bytes and MemoryLimit.parse(limit_text).kind != "percent":
        print(f"dqn-swap: the GPU held {format_bytes(trace.outside_bytes)} outside the recorded iteration "
              f"(cuBLAS's workspaces, other tensors): the plan's own bytes are held to {format_bytes(limit)}",
              file=sys.stderr, flush=True)


def report(figures: dict, as_json: bool) -> None:
    if as_json:
        print_json(figures)
    else:
        print_table([(k, human(k, v)) for k, v in figures.items()])


def run_simulate(args: argparse.Namespace) -> int:
    from ..cost import profile_of
    from ..plan import Plan
    from ..simulator import simulate
    from ..trace import resolve_memory_limit

    trace = load_trace(args.trace)
    if args.plan:
        given = {"--planner": args.planner is not None, "--keep": bool(args.keep), "--recompute": bool(args.recompute),
                 "--agent": args.agent is not None} | {flag: True for flag in given_flags(args)}
        for option, yes in given.items():
            if yes:
                raise ValueError(f"{option} does not go with --plan: the plan is made already, and its actions "
                                 "are what is simulated")
        plan = Plan.load(args.plan, trace)
        limit = resolve_memory_limit(trace, args.memory_limit) if args.memory_limit else plan.memory_limit
        if args.memory_limit:
            say_outside(trace, args.memory_limit, limit)
        profile = profile_of(trace, args.profile or plan.profile)
        planning_s = None
    else:
        plan, planning_s, profile = make_plan(trace, args.memory_limit, args.planner, args.agent, args.profile,
                                              planner_values(args), pins_of(args))
        limit = plan.memory_limit
    result = simulate(trace, plan.actions, limit, profile)
    figures = {"planner": plan.planner, **made_by(plan), "n_swap": plan.n_swap, "n_recompute": plan.n_recompute,
               **result.figures(), **(certified(plan) if limit == plan.memory_limit else {}),
               "planning_s": planning_s}
    report(figures, args.json)
    if not result.feasible and not args.json:
        explain_infeasible(trace, plan, result.infeasible)
    return 0 if result.feasible else 1


def explain_infeasible(trace, plan, infeasible) -> None:  # noqa: ANN001
    """Where an infeasible plan ran out of memory and, for a planner whose method cannot reach
    the trace's minimum memory, why (``Plan.settings["limitation"]``)."""
    if infeasible is not None:
        print(f"infeasible: {infeasible.message(trace)}")
    if plan.settings.get("not_applicable"):
        print(f"{plan.planner} is {plan.settings['not_applicable']}")
    elif plan.settings.get("limitation"):
        print(f"{plan.planner} cannot plan down to the minimum ({human('bytes', trace.minimum_memory)}): "
              f"{plan.settings['limitation']}")


def run_plan(args: argparse.Namespace) -> int:
    from ..plots import check_output

    out = check_output(args.output, args.force)
    trace = load_trace(args.trace)
    plan, planning_s, _ = make_plan(trace, args.memory_limit, args.planner, args.agent, args.profile,
                                    planner_values(args), pins_of(args))
    plan.save(out, overwrite=args.force)
    report({"plan": str(out), "planner": plan.planner, **made_by(plan), "n_swap": plan.n_swap,
            "n_recompute": plan.n_recompute, **plan.figures, **certified(plan), "planning_s": planning_s}, args.json)
    feasible = plan.figures.get("feasible", True)
    if not feasible and not args.json:
        from ..simulator import Infeasibility

        reason = plan.figures.get("infeasible")
        explain_infeasible(trace, plan, Infeasibility(**reason) if reason else None)
    return 0 if feasible else 1
