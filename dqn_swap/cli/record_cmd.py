"""``dqn-swap record``: run one training iteration and save its memory trace."""

from __future__ import annotations

import argparse

from ..cost import DEFAULT_PROFILE, PROFILES
from ..user_code import load_workload
from .common import MAX_SEED, batch_size, check_host_memory, human, print_json, print_table, whole


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..models import MODEL_NAMES

    p = sub.add_parser(
        "record", help="record one training iteration of a network as a memory trace",
        description="Run one real training iteration (forward, backward, optimizer step) and save "
                    "every GPU memory operation (malloc, write, read, free) to a trace file. "
                    "On --device meta nothing is allocated, so networks far larger than this "
                    "machine's memory record in seconds; op times then come from --profile.",
        epilog="Example: dqn-swap record --model resnet50 --batch-size 64 --device meta "
               "--profile v100-pcie3 -o r50.trace")
    p.add_argument("--model", required=True,
                   help=f"a zoo network ({', '.join(MODEL_NAMES)}); hf:NAME, a Hugging Face architecture "
                        "(hf:gpt2, hf:llama, hf:bert, hf:vit, hf:PATH/config.json); gen:FAMILY:SEED, a network "
                        "drawn from a family of dqn_swap.models.generator (gen:mlp_mixer:3); or your own, as "
                        "'package.module:function' where function(batch_size, device) returns a "
                        "dqn_swap.models.Workload")
    p.add_argument("--batch-size", type=batch_size, default=32, help="batch size (default 32)")
    p.add_argument("--device", default="meta", choices=["meta", "cpu", "cuda"],
                   help="meta (no memory, times from the profile; default), cpu, or cuda "
                        "(times measured with CUDA events)")
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"device profile for op and transfer times: {', '.join(PROFILES)} "
                        f"(default {DEFAULT_PROFILE}); 'measured' measures the local GPU")
    p.add_argument("--seed", type=whole(0, MAX_SEED, "seed"), default=0, help="random seed for weights and inputs")
    p.add_argument("--inputs-released", action="store_true",
                   help="the training loop hands the batch to the model and keeps no reference to it "
                        "until backward is over (the runtime owns it, as in the papers): plans may then "
                        "swap the input batch; by default the loop holds it and no plan counts on moving it")
    p.add_argument("-o", "--output", help="trace file to write (default MODEL-bBATCH.trace)")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..cost import measure_profile
    from ..recorder import record_trace

    from ..plots import check_output

    output = check_output(args.output if args.output is not None else
                          f"{args.model.replace(':', '_')}-b{args.batch_size}.trace", args.force)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA GPU is available here (record on cpu, or on meta with a "
                             "device profile)")
    profile = measure_profile(args.device) if args.profile == "measured" else args.profile
    if isinstance(profile, str) and profile not in PROFILES:
        raise ValueError(f"unknown device profile {profile!r}; choose one of: {', '.join(PROFILES)}")
    if args.device == "cpu":
        check_host_memory(lambda device: load_workload(args.model, args.batch_size, device, args.seed), args.model,
                          args.batch_size)
    workload = load_workload(args.model, args.batch_size, args.device, args.seed)
    trace = record_trace(workload.model, workload.example_inputs, workload.loss_fn,
                         workload.make_optimizer, device=args.device, profile=profile,
                         inputs="released" if args.inputs_released else "held",
                         meta={"model": args.model, "batch_size": args.batch_size, "seed": args.seed})
    trace.save(output, overwrite=args.force)
    summary = {"trace": str(output), **trace.summary()}
    if args.json:
        print_json(summary)
    else:
        print_table([(k, human(k, v)) for k, v in summary.items()])
    return 0
