#!/usr/bin/env bash
# Create ./.venv and install fedcxr with its test, NVIDIA FLARE and differential-privacy (Opacus) extras. Safe to re-run.
# PyTorch goes in first: the CPU wheel (torch==2.13.0) where it is available, otherwise
# whatever `pip install torch` gives on this platform (a CUDA build on Linux GPU hosts).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -c "import torch" 2>/dev/null || pip install -q "torch==2.13.0" || pip install -q torch
# nvflare comes through fedcxr's `flare` extra, never nvflare[pt] (that pulls torchvision)
pip install -q -e ".[test,flare,dp${FEDCXR_EXTRAS:+,$FEDCXR_EXTRAS}]"
echo "fedcxr installed in $(pwd)/.venv"
