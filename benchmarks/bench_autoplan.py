#!/usr/bin/env python
"""What ``dqn_swap.autoplan`` costs per step once its plan exists, on the CPU.

Three copies of one model train side by side, their steps interleaved so that they share
the machine's noise: unplanned; :class:`~dqn_swap.runtime.PlannedExecution` following the
plan ``autoplan`` made; and ``autoplan`` itself (its signature per step, its hooks and the
same runtime).  A second run does the same with the empty plan (planner ``none``), against
unplanned.  Each step is timed in CPU seconds of the one thread (``time.thread_time``,
``torch.set_num_threads(1)``); the figures are medians over the steps and their ratios.

    python benchmarks/bench_autoplan.py --json benchmarks/results/autoplan_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import copy
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


class MLP(nn.Module):
    def __init__(self, width: int = 512, depth: int = 8) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.layers(x))
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


def workloads() -> dict[str, Any]:
    def mlp() -> tuple[nn.Module, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        return MLP(), {"x": torch.randn(1024, 512, generator=g), "labels": torch.randint(0, 10, (1024,), generator=g)}

    def gpt2() -> tuple[nn.Module, dict[str, torch.Tensor]]:
        import transformers

        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, n_positions=256,
                                         bos_token_id=0, eos_token_id=0)
        ids = torch.randint(0, 2048, (8, 128), generator=torch.Generator().manual_seed(0))
        return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}

    return {"mlp": mlp, "gpt2": gpt2}


def loss_of(out: Any) -> torch.Tensor:
    return out["loss"] if isinstance(out, dict) else out.loss


def measure(name: str, planner: str, limit: str, steps: int, warmup: int) -> dict[str, Any]:
    from dqn_swap import autoplan
    from dqn_swap.runtime import PlannedExecution

    build = workloads()[name]
    base, batch = build()
    models = {"unplanned": base, "planned_execution": copy.deepcopy(base), "autoplan": copy.deepcopy(base)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    planned = autoplan(models["autoplan"], limit, planner=planner, optimizer=opts["autoplan"], verbose=False)
    runtime = None
    times: dict[str, list[float]] = {k: [] for k in models}
    for step in range(warmup + steps):
        for method, model in models.items():
            if method == "planned_execution" and runtime is None:
                entry = planned.last_entry or next(iter(planned.entries.values()), None)
                if entry is None:
                    continue
                runtime = PlannedExecution(model, entry.plan, entry.trace)
            ctx = {"unplanned": nullcontext(), "planned_execution": runtime,
                   "autoplan": planned.step()}[method]
            opt = opts[method]
            start = time.thread_time()
            with ctx:
                loss = loss_of(model(**batch))
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            elapsed = time.thread_time() - start
            if step >= warmup and (method != "autoplan" or planned.last == "planned"):
                times[method].append(elapsed)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    entry = planned.last_entry
    return {"model": name, "planner": planner, "limit": limit, "steps": steps,
            "swaps": entry.plan.n_swap if entry else 0, "recomputes": entry.plan.n_recompute if entry else 0,
            "median_step_s": med,
            "autoplan_over_planned_execution": med["autoplan"] / med["planned_execution"],
            "planned_execution_over_unplanned": med["planned_execution"] / med["unplanned"],
            "autoplan_over_unplanned": med["autoplan"] / med["unplanned"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,gpt2")
    p.add_argument("--planner", default="lru")
    p.add_argument("--limit", default="50%")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=4, help="steps left out: warm-up, recording, first planned")
    p.add_argument("--json", help="write the figures here (and a .md beside)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from machine import commit, machine, relative_paths

    rows = []
    for name in args.models.split(","):
        for planner, limit in ((args.planner, args.limit), ("none", "100%")):
            row = measure(name, planner, limit, args.steps, args.warmup)
            rows.append(row)
            print(f"[bench] {name} {planner} {limit}: autoplan / PlannedExecution "
                  f"{row['autoplan_over_planned_execution']:.4f}, PlannedExecution / unplanned "
                  f"{row['planned_execution_over_unplanned']:.4f}, autoplan / unplanned "
                  f"{row['autoplan_over_unplanned']:.4f}", file=sys.stderr, flush=True)
    result = {"machine": machine(), **commit(), "command": " ".join(["python", "benchmarks/bench_autoplan.py", *sys.argv[1:]]),
              "rows": rows}
    md = ["| model | planner | limit | swaps | recomputes | unplanned (ms) | PlannedExecution (ms) | autoplan (ms) "
          "| autoplan / PlannedExecution | autoplan / unplanned |", "|---|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['planner']} | {r['limit']} | {r['swaps']} | {r['recomputes']} | "
           f"{r['median_step_s']['unplanned'] * 1e3:.2f} | {r['median_step_s']['planned_execution'] * 1e3:.2f} | "
           f"{r['median_step_s']['autoplan'] * 1e3:.2f} | {r['autoplan_over_planned_execution']:.4f} | "
           f"{r['autoplan_over_unplanned']:.4f} |" for r in rows]
    if args.json:
        write_text(Path(args.json), json.dumps(relative_paths(result), indent=1) + "\n", overwrite=True)
        write_text(Path(args.json).with_suffix(".md"),
            f"Command: `{result['command']}`\n\nCommit: {result['commit']}"
            + (f" (modified: {', '.join(result['modified'])})" if result["modified"] else "")
            + f"\n\nMachine: {result['machine']}, one thread; median CPU seconds of the thread per step, the three "
            "methods' steps interleaved\n\n" + "\n".join(md) + "\n", overwrite=True)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
