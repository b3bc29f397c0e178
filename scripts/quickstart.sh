#!/usr/bin/env bash
# The main job, on a fresh machine: install, record ResNet-50 (batch 64) on the
# meta device, print its summary and memory plot, then plan it at four memory
# limits with every planner (the default, auto; the DQN agent shipped for ResNet-50, the
# baselines of the papers and the exact planner) and print the comparison, every plan measured
# against the certified bound.  To finish in about two minutes after the install, the exact
# planner gets 10 CPU seconds a limit, and auto and dqn-search 10 seconds a plan: the bounds are
# then looser than the exact planner's full comparison (60 CPU seconds a cell on the
# comparison grid: python benchmarks/bench_optimal.py grid --time-limit 60, benchmarks/results/optimal_grid_60s.md).
# Output goes to out/quickstart/ (replaced on each run; it is this script's own folder).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=.venv/bin/python
[[ -n "${VIRTUAL_ENV:-}" ]] && PY=python
out=out/quickstart
mkdir -p "$out"
dqn() { "$PY" -m dqn_swap "$@"; }
# inspect prints the trace's summary (with its memory plot): record's own copy of it is not shown
dqn record --model resnet50 --batch-size 64 --device meta --profile v100-pcie3 -o "$out/resnet50.trace" --force >/dev/null
dqn inspect "$out/resnet50.trace" --plot "$out/resnet50-memory.png"
dqn compare "$out/resnet50.trace" --memory-limits 90%,70%,50%,30% --planners all --agent checkpoints/grid/resnet50.pt \
    --time-limit 10 -o "$out/compare" --force
