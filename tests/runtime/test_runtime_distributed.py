"""Planned training under data-parallel and sharded setups, on the CPU (gloo).

* DistributedDataParallel, 2 processes: swap, recompute and mixed plans give, on every
  rank, the losses, whole model state and optimizer state of unplanned DDP training bit
  for bit.  The trace is recorded on the unwrapped module; DDP's own work before the
  module's forward (buffer broadcasts) does not shift the runtime's op numbering, which
  starts at the module calls the trace records.
* FSDP2 (``fully_shard``): ``tests/runtime/test_runtime_fsdp.py``.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODELS_AND_BATCHES = (("resnet_tiny", 2), ("gpt_tiny", 2))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    try:
        _ddp_case(rank, world, port)
    except BaseException:  # noqa: BLE001 - reported to the parent through a file
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _ddp_case(rank: int, world: int, port: int) -> None:
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace
    from dqn_swap.planners import manual_plan, recomputable_activations, saved_activations
    from dqn_swap.runtime import PlannedExecution

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for name, batch in MODELS_AND_BATCHES:
            # Every rank trains its own batch (seed + rank); the model starts the same everywhere.
            base = build_workload(name, batch, "cpu", seed=0)
            data = build_workload(name, batch, "cpu", seed=10 + rank)
            trace = record_trace(copy.deepcopy(base.model), data.example_inputs, data.loss_fn,
                                 base.make_optimizer, device="cpu")
            acts, rec = saved_activations(trace), recomputable_activations(trace)
            plans = {"swap": manual_plan(trace, swap=acts),
                     "recompute": manual_plan(trace, recompute=rec),
                     "mixed": manual_plan(trace, swap=[t for t in acts if t not in rec[1::2]], recompute=rec[1::2])}

            def run(plan):  # noqa: ANN001, ANN202
                model = DDP(copy.deepcopy(base.model))
                opt = base.make_optimizer(model.parameters())
                rt = PlannedExecution(model, plan, trace) if plan is not None else None
                torch.manual_seed(1234 + rank)
                losses = []
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    if rt is None:
                        loss = data.loss_fn(model(*data.example_inputs))
                        loss.backward()
                    else:
                        with rt:
                            loss = data.loss_fn(model(*data.example_inputs))
                            loss.backward()
                    opt.step()
                    losses.append(loss.detach().clone())
                return losses, model.module.state_dict(), opt.state_dict(), rt

            ref_losses, ref_state, ref_opt, _ = run(None)
            for kind, plan in plans.items():
                losses, state, opt_state, rt = run(plan)
                label = f"rank {rank}, {name}, {kind} plan"
                assert all(torch.equal(a, b) for a, b in zip(ref_losses, losses)), f"{label}: losses differ"
                for key in ref_state:
                    assert torch.equal(ref_state[key], state[key]), f"{label}: state_dict[{key!r}] differs"
                for pid, entry in ref_opt["state"].items():
                    for k, v in entry.items():
                        other = opt_state["state"][pid][k]
                        same = torch.equal(v, other) if isinstance(v, torch.Tensor) else v == other
                        assert same, f"{label}: optimizer state {pid}/{k} differs"
                assert rt.stats.swapped + rt.stats.held_inputs_skipped == plan.n_swap, label  # inputs held: not copied
                assert rt.stats.recomputed == plan.n_recompute, label
    finally:
        dist.destroy_process_group()


@pytest.mark.subprocess
def test_ddp_two_processes_bit_identical_on_every_rank() -> None:
    world = 2
    with tempfile.TemporaryDirectory() as out_dir:
        try:
            mp.spawn(_worker, args=(world, _free_port(), out_dir), nprocs=world, join=True)
        except Exception:  # noqa: BLE001 - show the worker's own traceback
            errors = [open(os.path.join(out_dir, f)).read() for f in sorted(os.listdir(out_dir))]
            pytest.fail("\n".join(errors) or "a DDP worker failed")
