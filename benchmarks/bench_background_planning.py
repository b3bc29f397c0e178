#!/usr/bin/env python
"""What planning off the training thread buys: ``autoplan(..., planning="background")`` against
``"inline"`` in a loop whose batches come in several shapes (each a signature of its own, each
recorded and planned once), with the default planner.

Per mode: the loop's wall time, the longest step (inline, the step that ends a recording waits
for its plan), the steps run in safe mode while their plan was being made, the planning CPU
seconds, and whether training is the unplanned loop's bit for bit (every parameter, the
optimizer's state and every loss).  The modes run one after the other on the same machine;
the planner has the machine's other core.

    python benchmarks/bench_background_planning.py --json benchmarks/results/background_planning_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dqn_swap.files import write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))


class Net(nn.Module):
    """A residual MLP with dropout, called the way Hugging Face models are (keywords, a dict out)."""

    def __init__(self, width: int = 256, depth: int = 6) -> None:
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                                  nn.Dropout(0.1), nn.Linear(2 * width, width)) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.inp(features)
        for block in self.blocks:
            x = x + block(x)
        return {"loss": F.cross_entropy(self.head(x), labels)}


def batches(steps: int, sizes: list[int], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"features": torch.randn(n, 64, generator=g), "labels": torch.randint(0, 10, (n,), generator=g)}
            for n in (sizes[i % len(sizes)] for i in range(steps))]


def train(data: list[dict[str, torch.Tensor]], planning: str | None, limit: str, planner: str,
          depth: int) -> dict[str, Any]:
    from dqn_swap import autoplan

    torch.manual_seed(0)
    model = Net(depth=depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    planned = (autoplan(model, limit, planner=planner, optimizer=opt, verbose=False, shapes="exact", planning=planning)
               if planning else None)
    step_s, losses = [], []
    start = time.perf_counter()
    for batch in data:
        t0 = time.perf_counter()
        with planned.step() if planned is not None else nullcontext():
            loss = model(**batch)["loss"]
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item())
    wall = time.perf_counter() - start
    out: dict[str, Any] = {"wall_s": round(wall, 3), "max_step_s": round(max(step_s), 3),
                           "median_step_s": round(statistics.median(step_s), 4), "losses": losses,
                           "state": {k: v.clone() for k, v in model.state_dict().items()},
                           "opt": opt.state_dict()}
    if planned is not None:
        planned.remove()
        kinds = [line for line in planned.log]
        out.update(plans=len(planned.entries), waiting_steps=planned.waiting_steps, safe_steps=planned.safe_steps,
                   planning_cpu_s=round(planned.planning_seconds, 2), log_lines=len(kinds))
    return out


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a["losses"] != b["losses"] or a["state"].keys() != b["state"].keys():
        return False
    if not all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"]):
        return False
    sa, sb = a["opt"]["state"], b["opt"]["state"]
    return all(torch.equal(v, sb[i][k]) if isinstance(v, torch.Tensor) else v == sb[i][k]
               for i, st in sa.items() for k, v in st.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--sizes", default="192,256,384", help="batch sizes, in turn (each a signature)")
    p.add_argument("--limit", default="20%")
    p.add_argument("--planner", default="auto")
    p.add_argument("--depth", type=int, default=16, help="residual blocks of the network")
    p.add_argument("--json", help="write the figures here (and a .md beside)")
    args = p.parse_args(argv)
    from machine import commit, machine, relative_paths

    torch.set_num_threads(1)
    data = batches(args.steps, [int(s) for s in args.sizes.split(",")])
    base = train(data, None, args.limit, args.planner, args.depth)
    # A first run pays once for what any long run pays once (the simulator's kernels compiled, the
    # agent read): left out, so that the two modes plan in the same warm process.
    train(data[:4], "inline", args.limit, args.planner, args.depth)
    rows = {}
    for mode in ("inline", "background"):
        r = train(data, mode, args.limit, args.planner, args.depth)
        r["bit_identical"] = same(base, r)
        rows[mode] = {k: v for k, v in r.items() if k not in ("losses", "state", "opt")}
        print(mode, rows[mode], file=sys.stderr, flush=True)
    result = {"machine": machine(), **commit(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python", "benchmarks/bench_background_planning.py", *(argv or sys.argv[1:])]),
              "steps": args.steps, "sizes": args.sizes, "limit": args.limit, "planner": args.planner,
              "depth": args.depth,
              "unplanned": {"wall_s": base["wall_s"], "max_step_s": base["max_step_s"],
                            "median_step_s": base["median_step_s"]},
              "modes": rows,
              "background_over_inline_wall": round(rows["background"]["wall_s"] / rows["inline"]["wall_s"], 3)}
    print(json.dumps(result, indent=1))
    if args.json:
        write_text(Path(args.json), json.dumps(relative_paths(result), indent=1) + "\n", overwrite=True)
        lines = [f"Command: `{result['command']}`", "", f"Commit: {result['commit']}", "",
                 f"Machine: {result['machine']}; torch with one intra-op thread; the planner on a second thread of the same process, which shares Python's interpreter lock with the training thread.",
                 "", f"{args.steps} steps of a residual MLP of {args.depth} blocks, batch sizes {args.sizes} in turn "
                 f"(each its own signature), limit {args.limit}, planner {args.planner}; a first run in the same "
                 "process compiled the simulator's kernels and read the agent.", "",
                 "| mode | loop wall s | longest step s | median step s | plans | steps waiting in safe mode | "
                 "planning CPU s | bit-identical |", "|---|---|---|---|---|---|---|---|",
                 f"| unplanned | {base['wall_s']} | {base['max_step_s']} | {base['median_step_s']} | - | - | - | - |"]
        for mode, r in rows.items():
            lines.append(f"| {mode} | {r['wall_s']} | {r['max_step_s']} | {r['median_step_s']} | {r['plans']} | "
                         f"{r['waiting_steps']} | {r['planning_cpu_s']} | {'yes' if r['bit_identical'] else 'NO'} |")
        write_text(Path(args.json).with_suffix(".md"), "\n".join(lines) + "\n", overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
