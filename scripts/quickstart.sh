#!/usr/bin/env bash
# The main job, on a fresh machine: install, record ResNet-50 (batch 64) on the
# meta device, print its summary and memory plot, then plan it at four memory
# limits with every planner (the DQN agent shipped for ResNet-50, the baselines of the
# papers and the exact planner, given a minute a limit) and print the comparison, every
# plan measured against the certified bound.  Output goes to out/quickstart/ (replaced on
# each run; it is this script's own folder).
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
    --time-limit 60 -o "$out/compare" --force
