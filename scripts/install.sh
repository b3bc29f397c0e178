#!/usr/bin/env bash
# Install dqn-swap into ./.venv (or the active virtual environment).
#
# torch: a torch already importable is kept (a GPU user's CUDA build included;
# the venv sees system packages).  Otherwise a machine with an NVIDIA GPU gets
# a CUDA build and a machine without one gets the CPU build of torch 2.13.0:
# from PyTorch's CPU index when it can be reached (PyPI's Linux wheels bundle
# CUDA), else from the package index configured for pip (the CPU wheel on these
# CPU machines); set TORCH_INDEX_URL to take it from another index.  It never pulls a
# multi-GB CUDA build onto a machine without a GPU through our dependencies:
# pyproject.toml asks for a range the installed torch already satisfies.
#
# Usage: bash scripts/install.sh [--test]     (--test adds pytest, hypothesis and transformers)
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test,hf]"  # the tests train Hugging Face models too

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  [[ -x .venv/bin/python ]] || python3 -m venv --system-site-packages .venv
  PY=.venv/bin/python
else
  PY=python
fi
pip=("$PY" -m pip install --quiet --disable-pip-version-check)
CPU_INDEX="${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}"

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "install: NVIDIA GPU found, installing a CUDA build of torch" >&2
    "${pip[@]}" "torch>=2.4"
  elif [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    "${pip[@]}" --index-url "$TORCH_INDEX_URL" "torch==2.13.0"
  elif "$PY" -c "import urllib.request; urllib.request.urlopen('$CPU_INDEX/torch/', timeout=5)" 2>/dev/null; then
    # PyPI's Linux torch wheels pull several GB of CUDA libraries: take the CPU build from PyTorch's index.
    echo "install: no GPU found, installing the CPU build of torch 2.13.0 from $CPU_INDEX" >&2
    "${pip[@]}" --index-url "$CPU_INDEX" --extra-index-url https://pypi.org/simple "torch==2.13.0"
  else
    # No route to PyTorch's index (a machine that only reaches its package mirror, which holds the CPU wheel).
    echo "install: no GPU found, installing torch 2.13.0 from the configured package index" >&2
    "${pip[@]}" "torch==2.13.0"
  fi
fi
"${pip[@]}" -e ".$extras"
echo "install: done ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")'))" >&2
