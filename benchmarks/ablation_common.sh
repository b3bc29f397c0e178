# Sourced by the ablation scripts (benchmarks/ablation_*.sh), after they set default_out:
# strict mode, the repository root as the working folder, the Python to run (the project's .venv
# unless one is active), the output folder OUT_DIR (the script's first argument, else
# $default_out), one thread a run, and two helpers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
[[ -n "${VIRTUAL_ENV:-}" ]] && PY=python
out="${1:-$default_out}"
mkdir -p "$out"
export OMP_NUM_THREADS=1

networks() {  # the names of the generator's networks of split $1, $2 of each family (gen:FAMILY:SEED ...)
  "$PY" -c "from dqn_swap.models.generator import corpus
print(' '.join(s.name for s in corpus('$1', $2)))"
}

plus() {  # the agent files $out/NAME.pt of the names given, joined by '+' (an ensemble arm)
  local IFS=+ files=()
  for name in "$@"; do files+=("$out/$name.pt"); done
  echo "${files[*]}"
}
