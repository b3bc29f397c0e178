"""Recording and trace-loading performance: ResNet-50 b64, ResNet-1001 and ResNet-1517 at b256.

Each case records in a fresh subprocess, so its peak host memory (ru_maxrss)
is its own; times are CPU seconds of that process, on one thread.  Prints a
markdown table, or JSON with --json; writes nothing unless -o is given (then the
table too, beside it as .md).

    python benchmarks/bench_record.py                       # the default cases
    python benchmarks/bench_record.py --case resnet50:64 --json
    python benchmarks/bench_record.py -o benchmarks/results/record.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance  # noqa: E402
from machine import relative_paths  # noqa: E402

from dqn_swap.files import write_text  # noqa: E402

CASES = ["resnet50:64", "resnet1001:256", "resnet1517:256"]

CHILD = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(1)
from dqn_swap.models import build_workload
from dqn_swap.recorder import record_trace
from dqn_swap.trace import Trace
name, batch, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0 = time.process_time()
w = build_workload(name, batch, "meta")
trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta")
record_s = time.process_time() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
trace.save(path, overwrite=True)
loads = []
for _ in range(5):
    t0 = time.process_time(); Trace.load(path); loads.append(time.process_time() - t0)
loads.sort()
print(json.dumps({"case": f"{name}:{batch}", "events": trace.n_events, "ops": trace.n_ops,
                  "record_s": record_s, "peak_host_bytes": rss, "trace_file_bytes": __import__("os").path.getsize(path),
                  "load_s_median": loads[2], "peak_trace_bytes": trace.peak_bytes}))
"""


def run_case(case: str) -> dict:
    name, batch = case.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", CHILD, name, batch, str(Path(tmp) / "t.trace")],
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{case}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="MODEL:BATCH (repeatable); default: " + ", ".join(CASES))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-o", "--output", help="also write the JSON results here")
    args = ap.parse_args()
    rows = [run_case(c) for c in args.case or CASES]
    result = {**provenance(), "results": rows}
    lines = [f"machine: {result['machine']}", "",
             "| case (meta) | events | ops | record (CPU s) | peak host memory (MiB) | file (MiB) | load (ms) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['events']} | {r['ops']} | {r['record_s']:.2f} | {r['peak_host_bytes'] / 2**20:.0f} | "
              f"{r['trace_file_bytes'] / 2**20:.2f} | {r['load_s_median'] * 1e3:.1f} |" for r in rows]
    table = "\n".join(lines) + "\n"
    if args.output:
        write_text(Path(args.output), json.dumps(relative_paths(result), indent=1) + "\n", overwrite=True)
        write_text(Path(args.output).with_suffix(".md"), table, overwrite=True)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(table, end="")


if __name__ == "__main__":
    main()
