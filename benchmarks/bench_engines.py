"""Agreement of the two simulation engines on random (trace, plan) pairs.

Runs the comparison of ``tests/test_simulator_engines.py`` (every figure compared exactly,
floats with ``==``, plus the schedule, the memory need and the ignored actions) on ``--pairs``
random pairs (seeds 0..N-1: random training-like traces, plans that swap, remove or mix, tight,
loose and infeasible limits, duplex and single-engine profiles, overcommit on and off), counts
the disagreements and the kinds of runs covered, and prints one JSON object.

    PYTHONPATH=. python benchmarks/bench_engines.py -o benchmarks/results/simulator_engines_agreement.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dqn_swap.files import write_text  # noqa: E402
from tests.test_simulator_engines import differences, random_pair  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=10_000, help="random (trace, plan) pairs to compare")
    ap.add_argument("-o", "--output", type=Path, help="also write the JSON report here")
    args = ap.parse_args(argv)
    if args.pairs <= 0:
        ap.error("--pairs must be positive")

    kinds: collections.Counter[str] = collections.Counter()
    disagreements: dict[int, list[str]] = {}
    t0 = time.thread_time()
    for seed in range(args.pairs):
        sim, ref, actions, overcommit = random_pair(seed)
        a, b = ref.run(actions, overcommit=overcommit), sim.run(actions, overcommit=overcommit)
        diff = differences(a, b)
        if diff:
            disagreements[seed] = diff
        kinds["feasible" if a.feasible else "overcommitted" if overcommit else "stuck"] += 1
        kinds["duplex" if sim.profile.duplex else "single copy engine"] += 1
        kinds["with prefetches"] += bool(a.bytes_h2d)
        kinds["with re-runs"] += bool(a.recompute_ops)
        kinds["with ignored duplicates"] += bool(a.ignored_actions)
        kinds["actions"] += len(actions)

    from common import provenance

    report = {**provenance(),
              "pairs": args.pairs, "disagreements": len(disagreements),
              "first_disagreements": {str(k): v for k, v in list(disagreements.items())[:10]},
              "runs": dict(kinds), "cpu_seconds": time.thread_time() - t0}
    print(json.dumps(report, indent=1))
    if args.output:
        write_text(args.output, json.dumps(report, indent=1) + "\n", overwrite=True)
    return 1 if disagreements else 0


if __name__ == "__main__":
    raise SystemExit(main())
