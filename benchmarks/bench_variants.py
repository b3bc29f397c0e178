#!/usr/bin/env python
"""Iterations that never repeat: plan the variants as they come, plan the first alone, or run every
step in safe mode.  Which serves better?

wav2vec2 + CTC from a small config with 6 layers, with Hugging Face's defaults for training: a
layerdrop of 0.1 (each step drops its own random set of layers) and time masking (random spans,
whose count changes the shapes of the masked ops): iterations of one signature rarely repeat.  Three policies train the same 40 steps of the same batches, each measured from one
allocator timeline over the run (as ``bench_varying_loops.py`` does):

- ``variants``: ``autoplan``'s default: a step that leaves every plan runs in safe mode from there,
  the next ones are recorded, and a new variant is planned (at most ``max_variants`` = 8 of them);
- ``first only``: ``max_variants=1``: the first plan, every step that leaves it in safe mode;
- ``safe mode``: no plan at all, every saved activation on the host until backward needs it.

Per policy: CPU seconds of the training thread for the 40 steps (recording and planning included),
the steps that followed a plan to the end, the other steps (safe mode, whole or part; warm-up and
recording), the steps above the limit (the byte limit of the first plan made), and whether training
is unplanned training bit for bit.  CPU time here says little of a GPU, where safe mode's copies go
over PCIe: the simulated seconds give each step that followed a plan its plan's makespan and every
other step an estimate of a safe-mode step on the same profile (its ops, plus every saved byte
copied back on demand, nothing prefetched).

    python benchmarks/bench_variants.py --json benchmarks/results/variants_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loop_zoo as z  # noqa: E402
from common import provenance, publish  # noqa: E402


def workload(layers: int, layerdrop: float) -> z.Workload:
    base = z.wav2vec2_ctc()

    def build() -> torch.nn.Module:
        tf = z._tf()
        torch.manual_seed(z.SEED)
        return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
            vocab_size=32, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4, pad_token_id=0, ctc_loss_reduction="mean", layerdrop=layerdrop))

    return z.Workload("wav2vec2-ctc-layerdrop", "audio", build, base.make, pads=True)


class SafeThroughout:
    """Every step in safe mode: the planned side ``run_loop`` drives, with no plan."""

    last, last_entry = "safe", None

    def __init__(self, model: torch.nn.Module) -> None:
        from dqn_swap.runtime import HostOffload

        self.device = next(model.parameters()).device
        self.persistent = {p.untyped_storage()._cdata for p in model.parameters()}
        self.HostOffload = HostOffload

    @contextlib.contextmanager
    def step(self) -> Any:
        hooks = self.HostOffload(self.device, self.persistent)
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            yield self


def measure(w: z.Workload, policy: str, limit: str, steps: int) -> tuple[z.Run, Any, float]:
    from dqn_swap import autoplan

    def planned(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
        if policy == "safe mode":
            return SafeThroughout(model)
        return autoplan(model, limit, planner="dqn", optimizer=opt, verbose=False,
                        max_variants=1 if policy == "first only" else 8)

    start = time.thread_time()
    run, side = z.run_loop(w, "plain", "fp32", steps, planned if policy != "unplanned" else None)
    return run, side, time.thread_time() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--layerdrop", type=float, default=0.1)
    p.add_argument("--limit", default="40%")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    w = workload(args.layers, args.layerdrop)
    # A first short run pays once for what any long run pays once (the simulator's kernels compiled,
    # the agent read), so that every policy is measured in the same warm process.
    measure(w, "first only", args.limit, 4)
    ref, _, ref_cpu = measure(w, "unplanned", args.limit, args.steps)
    rows = {}
    first_limit = 0
    runs = {}
    for policy in ("variants", "first only", "safe mode"):
        run, side, cpu = measure(w, policy, args.limit, args.steps)
        runs[policy] = run
        if policy == "variants":
            first = next(iter(side.entries.values()))
            first_limit = int(first.plan.memory_limit)
        kinds = [s.kind for s in run.steps]
        entries = list(side.entries.values()) if hasattr(side, "entries") else []
        followed = sum(e.followed for e in entries)
        # simulated seconds on the profile's GPU: a step that followed a plan to the end takes its plan's
        # makespan; any other (warm-up, recording, safe mode whole or part) the safe-mode estimate
        simulated = sum(e.followed * float(e.plan.figures["makespan"]) for e in entries)
        rows[policy] = {
            "cpu_s": round(cpu, 2),
            "followed": followed,
            "safe_whole_or_part": len(run.steps) - followed,
            "_simulated_planned": simulated,
            "plans": len(entries),
            "planning_cpu_s": round(getattr(side, "planning_seconds", 0.0), 2),
            "identical": run.losses == ref.losses and not z.differences(ref.state, run.state),
            "kinds": {k: kinds.count(k) for k in sorted(set(kinds))},  # autoplan's kind of each step
        }
        print(policy, rows[policy], file=sys.stderr, flush=True)
    # Safe mode's step, estimated in the simulator's terms on the first plan's trace: its ops' time,
    # plus every saved byte copied back on demand as backward unpacks it (not overlapped: nothing is
    # prefetched); the copies out overlap the forward pass and are left out.
    from dqn_swap.cost import profile_of

    trace = first.trace
    prof = profile_of(trace)
    saved = int(trace.tensor_nbytes[trace.saved].sum()) if len(trace.saved) else 0
    safe_step_s = float(trace.compute_time) + float(prof.transfer_time(saved, "h2d"))
    for policy, r in rows.items():
        planned_s = r.pop("_simulated_planned")
        r["simulated_s"] = round(planned_s + r["safe_whole_or_part"] * safe_step_s, 4)
    for policy, run in runs.items():
        # each step's peak as bench_varying_loops judges it: bytes alive since before the model was built,
        # the batch made inside the step included, against the plan's limit (the steps after the first two)
        peaks = [s.peak - s.start for s in run.steps[2:]]
        over = [s.peak - first_limit for s in run.steps[2:] if s.peak > first_limit]
        rows[policy]["steps_over_first_limit"] = len(over)
        rows[policy]["worst_over_bytes"] = max(over) if over else 0
        rows[policy]["peak_above_start_max"] = max(peaks)
    result = {**provenance(), "steps": args.steps, "layers": args.layers, "layerdrop": args.layerdrop,
              "limit": args.limit, "first_limit_bytes": first_limit, "unplanned_cpu_s": round(ref_cpu, 2),
              "profile": prof.name, "unplanned_simulated_step_s": round(float(trace.compute_time), 6),
              "safe_step_simulated_s": round(safe_step_s, 6), "policies": rows}
    lines = [f"# Iterations that never repeat ({args.steps} steps, wav2vec2 + CTC, {args.layers} layers, layerdrop "
             f"{args.layerdrop}, limit {args.limit}, planner dqn)", "",
             f"Unplanned: {round(ref_cpu, 2)} CPU s on this machine; a step {trace.compute_time * 1e3:.3f} ms simulated "
             f"on {prof.name}, a safe-mode step {safe_step_s * 1e3:.3f} ms (estimated: its ops and every saved "
             f"byte copied back on demand). Limit of the first plan: {first_limit} bytes.", "",
             "| policy | CPU s | simulated s | plans | planning CPU s | steps followed to the end | steps not (safe "
             "mode whole or part, warm-up and recording) | steps over the first plan's limit | bit-identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for policy, r in rows.items():
        lines.append(f"| {policy} | {r['cpu_s']} | {r['simulated_s']} | {r['plans']} | {r['planning_cpu_s']} | "
                     f"{r['followed']} | "
                     f"{r['safe_whole_or_part']} | {r['steps_over_first_limit']} | {'yes' if r['identical'] else 'NO'} |")
    publish(result, "\n".join(lines) + "\n", args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
