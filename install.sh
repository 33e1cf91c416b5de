#!/usr/bin/env bash
# Create ./.venv and install fedcxr with its test, NVIDIA FLARE, differential-privacy (Opacus) and homomorphic-encryption
# (TenSEAL, for secure aggregation) extras. Safe to re-run.
# PyTorch goes in first: the CPU wheel (torch==2.13.0) where it is available, otherwise
# whatever `pip install torch` gives on this platform (a CUDA build on Linux GPU hosts).
# Each step says what it does before it starts (the two pip installs take minutes).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
EXTRAS="test,flare,dp,he${FEDCXR_EXTRAS:+,$FEDCXR_EXTRAS}"
step() { echo "[$1/4] $2" ; }
if [ -x .venv/bin/python ]; then
    step 1 "using the existing virtual environment $(pwd)/.venv"
else
    step 1 "creating a virtual environment in $(pwd)/.venv ($("$PY" --version 2>&1))"
    "$PY" -m venv .venv
fi
. .venv/bin/activate
step 2 "upgrading pip"
python -m pip install -q --upgrade pip >/dev/null
if python -c "import torch" 2>/dev/null; then
    step 3 "PyTorch $(python -c 'import torch; print(torch.__version__)') is already installed: kept"
else
    step 3 "installing PyTorch (the CPU wheel torch==2.13.0 where available; a few minutes)"
    pip install -q "torch==2.13.0" || { echo "      no torch==2.13.0 CPU wheel here: installing this platform's torch"; pip install -q torch; }
fi
# nvflare comes through fedcxr's `flare` extra, never nvflare[pt] (that pulls torchvision)
step 4 "installing fedcxr with its extras [$EXTRAS] (MONAI, NVIDIA FLARE, Opacus, TenSEAL, ...; a few minutes)"
pip install -q -e ".[$EXTRAS]"
echo "fedcxr installed in $(pwd)/.venv: activate it (source .venv/bin/activate, once per shell; the README's commands assume it), then try fedcxr demo (under a minute on 2 idle cores) or fedcxr --help"
