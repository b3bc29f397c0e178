#!/usr/bin/env bash
# One prepared run on a CUDA GPU (benchmarks/gpu_check.py): the CUDA tests, then planned training
# beside unplanned training, per-block checkpointing and save_on_cpu on ResNet-50, a Hugging Face
# Llama, a U-Net and GPT, with the simulator's time beside each. It ends within 8 minutes and
# writes gpu_check.json and gpu_check.md into the folder $GPU_CHECK_OUT.
#
# The machine needs no network: it uses its own Python and torch (2.11 or newer). A pure-Python
# dependency it lacks (gymnasium, farama-notifications) is installed from wheels in the folder
# $DQN_SWAP_WHEELS (default: .whl beside this checkout), and dqn-swap itself from this checkout.
#
#   GPU_CHECK_OUT=/tmp/report bash scripts/gpu_check.sh             # on the GPU machine
#   GPU_CHECK_OUT=/tmp/report bash scripts/gpu_check.sh --dry-run   # anywhere: tiny models, the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
out="${GPU_CHECK_OUT:-}"
if [[ -z "$out" ]]; then
    echo "gpu_check: set GPU_CHECK_OUT to the folder the report goes to" >&2
    exit 2
fi
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
    if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi
wheels="${DQN_SWAP_WHEELS:-.whl}"
if ! "$py" -c "import gymnasium" 2>/dev/null; then
    if ! compgen -G "$wheels/*.whl" > /dev/null; then
        echo "gpu_check: gymnasium is missing and there are no wheels in $wheels (DQN_SWAP_WHEELS)" >&2
        exit 2
    fi
    site="$(mktemp -d)"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$py" -c "import dqn_swap.env, dqn_swap.agents" 2>/dev/null; then
    # env/, agents/ and checkpoints/ install inside the package: an editable install maps them,
    # and needs no network with setuptools already there
    "$py" -m pip install -q --no-index --no-deps --no-build-isolation -e . >&2
fi
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # deterministic cuBLAS (bit-identity)
exec "$py" benchmarks/gpu_check.py --out "$out" "$@"
