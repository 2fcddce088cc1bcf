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
# pip byte-compiles what it installs one file at a time (77 of its 185 s on the 2-core box); it installs
# here without compiling, and compileall then compiles on every core. Compiled they must be: with
# PYTHONDONTWRITEBYTECODE set (as on these machines) every process would compile what it imports.
PIP="pip install -q --disable-pip-version-check --no-compile"
$PIP "${TORCH_SPEC:-torch==2.13.0}"
$PIP --no-deps "${TORCHVISION_SPEC:-torchvision==0.28.0}"
# The rest through uv, which downloads in parallel: 12 s on the 2-core box with an empty cache, where pip took
# about three minutes, for the same versions. torch stays pip's above (pip's configuration picks its wheel);
# uv keeps it, as it satisfies every requirement. Where uv cannot be installed or fails, pip does it.
if $PIP uv && python -m uv pip install -q --python "$PWD/.venv/bin/python" pillow -e ".[dev]"; then
  :
else
  echo "setup: uv unavailable or failed; installing with pip" >&2
  $PIP pillow
  $PIP -e ".[dev]"
fi
# a file that does not compile (another Python's syntax in a package's test data) is left as pip leaves it
python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  > /dev/null || true
echo "autohet installed in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
