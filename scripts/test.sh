#!/usr/bin/env bash
# Install dqn-swap with its test tools, then run the test suite.
# Heavier runs are marked `slow` and left out; GPU tests skip without CUDA.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
PY=.venv/bin/python
[[ -n "${VIRTUAL_ENV:-}" ]] && PY=python
if [[ $# -eq 0 ]]; then set -- -m "not slow"; fi
# the slowest tests are listed after the summary, so that a suite growing slower shows where
exec "$PY" -m pytest -q --durations=15 "$@"
