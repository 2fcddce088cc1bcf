#!/usr/bin/env bash
# Creates .venv and installs autohet with its test tools. Safe to rerun.
# torch is installed first and pinned so that nothing else pulls a different (CUDA) build;
# PyPI's torchvision wheel is installed without its dependencies for the same reason.
# Override for a CUDA machine, e.g.: TORCH_SPEC="torch==2.11.0" TORCHVISION_SPEC="torchvision==0.26.0"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
pip install -q --disable-pip-version-check --no-deps "${TORCHVISION_SPEC:-torchvision==0.28.0}"
pip install -q --disable-pip-version-check pillow
pip install -q --disable-pip-version-check -e ".[dev]"
echo "autohet installed in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
