"""Planned training under FSDP2, launched with torchrun: every rank records, plans and trains.

::

    torchrun --nproc-per-node 2 examples/fsdp_train.py --model gpt --memory-limit 50% --planner window

On a GPU node each rank trains on its own GPU (nccl); elsewhere on the CPU (gloo), as it is.
Each transformer layer and the root are sharded with ``fully_shard``.  Every rank:

1. records one iteration of its own shard of the work (``dqn_swap.record_trace``: FSDP's
   all-gathered parameters, collectives and reduce-scattered gradients are in the trace);
2. plans its saved activations under ``--memory-limit`` (``dqn_swap.get_planner``), with
   FSDP's memory fixed;
3. trains ``--steps`` steps following its plan (``PlannedExecution``), and prints its losses,
   its plan and its measured peak beside the plan's limit and prediction.

``--bf16`` shards with ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``.  See docs/fsdp.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F

VOCAB = 64


def build(name: str, seq: int) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """A small GPT (the library's) or Llama (Hugging Face), and the layers to shard one by one."""
    torch.manual_seed(0)  # every rank starts from the same weights
    if name == "gpt":
        from dqn_swap.models.transformer import GPT, GPTConfig

        model = GPT(GPTConfig(layers=2, d_model=64, heads=2, seq_len=seq, vocab=VOCAB))
        return model, list(model.blocks)
    import transformers

    from dqn_swap.models.hf import HFTraining

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                      max_position_embeddings=2 * seq, bos_token_id=0, eos_token_id=0)
    llama = transformers.LlamaForCausalLM(config)
    return HFTraining(llama, "input_ids"), list(llama.model.layers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt", "llama"), default="gpt")
    parser.add_argument("--batch-size", type=int, default=4, help="per rank")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--memory-limit", default="50%", help="per rank: bytes, '8GiB', '50%%' of the peak, ...")
    parser.add_argument("--planner", default="window", help="a dqn_swap.get_planner name")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--bf16", action="store_true", help="MixedPrecisionPolicy(param_dtype=torch.bfloat16)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print("fsdp_train.py: launch it with torchrun, e.g. torchrun --nproc-per-node 2 examples/fsdp_train.py",
              file=sys.stderr)
        return 2
    if args.steps < 1 or args.batch_size < 1 or args.seq_len < 2:
        print("fsdp_train.py: --steps and --batch-size must be at least 1, --seq-len at least 2", file=sys.stderr)
        return 2

    import dqn_swap
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from dqn_swap.meter import AllocatorTimeline
    from dqn_swap.runtime import PlannedExecution
    from dqn_swap.simulator import instant_copy_peak, simulate
    from dqn_swap.units import format_bytes

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    try:
        mesh = init_device_mesh(device.type, (world,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if args.bf16 else MixedPrecisionPolicy()
        model, layers = build(args.model, args.seq_len)
        model.to(device)
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        gen = torch.Generator().manual_seed(10 + rank)  # every rank its own batch
        x = torch.randint(0, VOCAB, (args.batch_size, args.seq_len), generator=gen).to(device)
        y = torch.randint(0, VOCAB, (args.batch_size, args.seq_len), generator=gen).to(device)
        if args.model == "gpt":
            inputs = (x,)

            def loss_fn(out: torch.Tensor) -> torch.Tensor:
                return F.cross_entropy(out.float().flatten(0, 1), y.flatten())
        else:
            inputs = (x, y)

            def loss_fn(out: object) -> torch.Tensor:
                return out.loss  # type: ignore[attr-defined]

        # 1. Record this rank's iteration (it trains the model: a warm-up and the recorded step).
        trace = dqn_swap.record_trace(model, inputs, loss_fn, optimizer, device=device)
        # 2. Plan it, FSDP's memory fixed.
        limit = dqn_swap.resolve_memory_limit(trace, args.memory_limit)
        plan = dqn_swap.get_planner(args.planner).plan(trace, limit)
        result = simulate(trace, plan)
        predicted = instant_copy_peak(trace, plan, result) if not cuda else result.peak_bytes
        # 3. Follow it.
        runtime = PlannedExecution(model, plan, trace, allow_infeasible=True)
        peaks, losses = [], []
        for _ in range(args.steps):
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
                start = torch.cuda.memory_allocated(device)
            timeline = AllocatorTimeline() if not cuda else nullcontext()
            with timeline:
                with runtime:
                    loss = loss_fn(model(*inputs))
                    loss.backward()
                optimizer.step()
            losses.append(loss.item())
            del loss
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated(device) - start)
            else:
                peaks.append(timeline.peak)  # type: ignore[union-attr]
        # On the CPU a free made on gloo's worker thread is not on the profiler's timeline, so a step's
        # timeline may read high: the least of the steps' peaks is reported (docs/fsdp.md).
        measured = trace.initial_bytes + min(peaks)
        # one write of the whole line: the ranks share the terminal, and print's separate write of the
        # newline lets another rank's line in between
        print(f"rank {rank}/{world} {device.type}: trace {trace.n_ops} ops, peak {format_bytes(trace.peak_bytes)}; "
              f"plan {plan.planner}: {plan.n_swap} swaps, {plan.n_recompute} recomputes, limit "
              f"{format_bytes(plan.memory_limit)}, feasible {bool(plan.figures.get('feasible'))}; planned peak "
              f"{format_bytes(predicted)}, measured {format_bytes(measured)}; losses "
              f"{' '.join(f'{v:.4f}' for v in losses)}\n", end="", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
