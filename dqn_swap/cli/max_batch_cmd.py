"""``dqn-swap max-batch``: the largest batch (or sequence) of a model that fits a memory size,
unplanned and with a plan, and how fast it trains."""

from __future__ import annotations

import argparse
import sys

from ..cost import DEFAULT_PROFILE, PROFILES
from .common import (MAX_SEED, add_planner_options, add_plot_options, batch_size, given_flags, human, planner_values,
                     plot_path, print_json, print_table, showing_progress, whole)

#: The planner's time budget per size unless --time-limit says otherwise: a few sizes are
#: planned, and the question is asked in seconds.
SECONDS_PER_SIZE = 2.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..planners import DEFAULT_PLANNER

    p = sub.add_parser(
        "max-batch", help="the largest batch of a model that fits a memory size, unplanned and planned, and how fast",
        description="Answer 'what is the largest batch of my model that fits in X GiB, and how fast does it "
                    "train?'. Records one iteration per batch size on the meta device (nothing is allocated, "
                    "times come from --profile), doubling then bisecting, and says: the largest batch that "
                    "fits unplanned; the largest under the minimum memory any plan needs (no planner can do "
                    "better); and, at a few batches in between, the plan's simulated time per iteration and "
                    "samples per second. With --seq-len, a Hugging Face language model's sequence length is "
                    "searched instead, at --batch-size. Writes a PNG of speed against size.",
        epilog="Examples: dqn-swap max-batch resnet50 --memory 16GiB; "
               "dqn-swap max-batch hf:gpt2 --memory 64MiB --seq-len --batch-size 8 --json")
    p.add_argument("model", help="a zoo network, hf:NAME, gen:FAMILY:SEED or package.module:function "
                                 "(as dqn-swap record --model)")
    p.add_argument("--memory", required=True,
                   help="the GPU's memory, as a size with a unit (16GiB, 40GB, 512MiB)")
    p.add_argument("--seq-len", action="store_true",
                   help="search the sequence length of a Hugging Face language model instead of the batch size")
    p.add_argument("--batch-size", type=batch_size, default=1,
                   help="with --seq-len: the batch size (default 1)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, choices=list(PROFILES),
                   help=f"device profile for op and copy times (default {DEFAULT_PROFILE})")
    p.add_argument("--planner", default=DEFAULT_PLANNER, help=f"who plans the sizes in between (default {DEFAULT_PLANNER})")
    add_planner_options(p)  # --time-limit: here the default is SECONDS_PER_SIZE per size
    p.add_argument("--points", type=whole(2, 12, "points"), default=4,
                   help="sizes planned from the largest unplanned to the largest any plan allows (default 4)")
    p.add_argument("--cap", type=whole(1, 1 << 20, "cap"), default=1 << 16,
                   help="largest size tried (default 65536; a sequence also stops at the model's positions)")
    p.add_argument("--seed", type=whole(0, MAX_SEED, "seed"), default=0, help="random seed for weights and inputs")
    add_plot_options(p, "MODEL-max-batch.png")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..agents import get_planner
    from ..capacity import largest_sizes, planned_speeds, sizes_between
    from ..cost import get_profile
    from ..limits import MemoryLimit
    from ..plots import capacity_plot
    from ..recorder import record_trace
    from ..user_code import load_workload
    from ..planners import check_options_apply, settings_from

    limit = MemoryLimit.parse(args.memory)
    if limit.kind != "bytes":
        raise ValueError(f"--memory {args.memory}: give the GPU's memory as a size with a unit (16GiB), not a "
                         "share of an iteration that is not recorded yet")
    memory = int(limit.value)
    if args.batch_size != 1 and not args.seq_len:
        raise ValueError("--batch-size goes with --seq-len (without it the batch size is what is searched)")
    check_options_apply([args.planner], given_flags(args))
    plot = plot_path(args, f"{args.model.replace(':', '_').replace('/', '_')}-max-batch.png")
    profile = get_profile(args.profile)
    cap = args.cap
    if args.seq_len:
        cap = min(cap, _positions(args.model))

    def say(line: str) -> None:  # progress on standard error: the answer alone goes to standard output
        print(f"dqn-swap max-batch: {line}", file=sys.stderr, flush=True)

    def record(n: int):
        batch, seq = (args.batch_size, n) if args.seq_len else (n, None)
        w = load_workload(args.model, batch, "meta", args.seed, seq_len=seq)
        return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta", profile=profile,
                            meta={"model": args.model, "batch_size": batch, "seq_len": seq})

    found = largest_sizes(record, memory, cap=cap, say=say)
    planner = get_planner(args.planner, **settings_from(args.planner,
                                                       {"time_limit": SECONDS_PER_SIZE} | planner_values(args)))
    sizes = sizes_between(found["unplanned"], found["any_plan"], args.points)
    with showing_progress():
        rows = planned_speeds(record, sizes, memory, lambda trace, lim: planner.plan(trace, lim, profile),
                              traces=found["traces"], say=say,
                              items=(lambda n: n * args.batch_size) if args.seq_len else (lambda n: n))
    planned = [r["size"] for r in rows if r["fits"] in ("planned", "unplanned")]
    what = "sequence length" if args.seq_len else "batch size"
    answer = {
        "model": args.model, "memory_bytes": memory, "profile": profile.name, "searched": what,
        **({"batch_size": args.batch_size} if args.seq_len else {}),
        "largest_unplanned": found["unplanned"], "largest_any_plan": found["any_plan"],
        "largest_planned": max(planned) if planned else None, "planner": args.planner,
        "capped_at": cap if found["capped"] else None, "recordings": len(found["traces"]),
        "speeds": rows,
    }
    if plot is not None:
        capacity_plot(answer, plot)
        answer["plot"] = str(plot)
    if args.json:
        print_json(answer)
    else:
        show(answer)
    return 0


def _positions(model: str) -> int:
    if not model.startswith("hf:"):
        raise ValueError(f"--seq-len: {model} is not a Hugging Face language model (hf:NAME)")
    from ..models.hf import config_of, positions_of

    return positions_of(config_of(model[3:]))


def show(answer: dict) -> None:
    what = answer["searched"]
    unit = "tokens/s" if what == "sequence length" else "samples/s"
    capped = f" (the search stopped at {answer['capped_at']})" if answer["capped_at"] else ""
    print_table([
        ("model", answer["model"] + (f", batch size {answer['batch_size']}" if "batch_size" in answer else "")),
        ("memory", human("bytes", answer["memory_bytes"])),
        (f"largest {what}, unplanned", str(answer["largest_unplanned"] or "none fits")),
        (f"largest {what}, planned ({answer['planner']})", str(answer["largest_planned"] or "none found")
         + " (of the sizes below)"),
        (f"largest {what} any plan allows", str(answer["largest_any_plan"] or "none fits")
         + " (the minimum-memory bound)" + capped),
        *([("plot", answer["plot"])] if answer.get("plot") else [])])
    if answer["speeds"]:
        print()
        print(f"{what:>16}  {'fits':>13}  {'iteration':>10}  {unit:>11}  {'slower by':>9}  planner")
        for r in answer["speeds"]:
            t = human("_s", r["planned_time_s"]) if r["planned_time_s"] is not None else "-"
            rate = f"{r['items_per_s']:.1f}" if r["items_per_s"] else "-"
            over = f"{r['overhead'] * 100:.1f} %" if r["overhead"] is not None else "-"
            print(f"{r['size']:>16}  {r['fits']:>13}  {t:>10}  {rate:>11}  {over:>9}  {r['planner'] or '-'}")
