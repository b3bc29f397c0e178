#!/usr/bin/env bash
# Install dqn-swap with its test tools, then run the test suite.
# Heavier runs are marked `slow` and left out; GPU tests skip without CUDA.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m gpu`.
#
# Without arguments the suite runs in two halves at once: the tests that start other processes
# (marked `subprocess`: commands, workers, distributed groups) spend most of their time waiting
# for their children, so they run in a second pytest beside the in-process tests.  On a 2-core
# machine the two together took 384 s where one after the other took 531 s.  The second half's
# report is printed after the first's, and the script fails if either does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
PY=.venv/bin/python
[[ -n "${VIRTUAL_ENV:-}" ]] && PY=python
if [[ $# -gt 0 ]]; then
  exec "$PY" -m pytest -q --durations=15 "$@"
fi
log=$(mktemp "${TMPDIR:-/tmp}/dqn-swap-tests.XXXXXX")
"$PY" -m pytest -q -p no:cacheprovider --durations=5 -m "subprocess and not slow" > "$log" 2>&1 &
second=$!
trap 'kill "$second" 2>/dev/null || true; rm -f "$log"' EXIT
# the slowest tests are listed after each summary, so that a suite growing slower shows where
status=0
"$PY" -m pytest -q --durations=15 -m "not subprocess and not slow" || status=$?
wait "$second" || status2=$?
echo
echo "---- the tests that start processes (run beside the others) ----"
cat "$log"
if [[ $status -ne 0 ]]; then exit "$status"; fi
exit "${status2:-0}"
