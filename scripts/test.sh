#!/usr/bin/env bash
# Install dqn-swap with its test tools, then run the test suite.
# Heavier runs are marked `slow` and left out; GPU tests skip without CUDA.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m gpu`.
#
# Without arguments the suite runs in two halves at once: the tests that start other processes
# (marked `subprocess`: commands, workers, distributed groups) spend most of their time waiting
# for their children, so they run in a second pytest beside the in-process tests, followed there by
# two in-process files (`beside` below).  On a 2-core machine the two halves together took 384 s
# where one after the other took 531 s.  The second half's report is printed after the first's, and
# the script fails if either does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
PY=.venv/bin/python
[[ -n "${VIRTUAL_ENV:-}" ]] && PY=python
if [[ $# -gt 0 ]]; then
  exec "$PY" -m pytest -q --durations=15 "$@"
fi
# One torch thread per half: the two halves share the machine's cores, and two-thread pools in both
# contended (an LSTM test took 95 s instead of about 8, and one run 487 s instead of about 390).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
log=$(mktemp "${TMPDIR:-/tmp}/dqn-swap-tests.XXXXXX")
# The in-process tests of these files run in the second half too, after the tests that start
# processes: alone, the in-process half took 474 s where the other took 241 s, its second core idle
# for the last four minutes. The demonstrations' tests joined them when the in-process half took
# 430 s and the other 358 s.
beside=(tests/runtime/test_runtime.py tests/runtime/test_runtime_memory.py tests/agents/test_dqn_demonstrations.py)
second_half() {
  local s=0
  "$PY" -m pytest -q -p no:cacheprovider --durations=5 -m "subprocess and not slow" || s=$?
  "$PY" -m pytest -q -p no:cacheprovider --durations=5 -m "not subprocess and not slow" "${beside[@]}" || s=$?
  return "$s"
}
second_half > "$log" 2>&1 &
second=$!
trap 'kill "$second" 2>/dev/null || true; rm -f "$log"' EXIT
# the slowest tests are listed after each summary, so that a suite growing slower shows where
status=0
"$PY" -m pytest -q --durations=15 -m "not subprocess and not slow" "${beside[@]/#/--ignore=}" || status=$?
wait "$second" || status2=$?
echo
echo "---- the tests that start processes, and ${beside[*]} (run beside the others) ----"
cat "$log"
if [[ $status -ne 0 ]]; then exit "$status"; fi
exit "${status2:-0}"
