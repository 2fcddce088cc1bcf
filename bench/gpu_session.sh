#!/bin/sh
# Everything measured on the GPU machine in one call after the wheels are installed.
# Usage there: sh bench/gpu_session.sh WHAT   (WHAT: tests | actor | dp | tune)
set -u
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
case "$1" in
  tests) python3 -m pytest -q -m gpu tests/test_executors.py 2>&1 | tail -5
         python3 -m pytest -q tests/test_schedulers.py tests/test_contract.py 2>&1 | tail -2 ;;
  actor) python3 -m bench.actor_path --out "$OUT/actor_path.json" 2>&1 | grep -v "^{" ;;
  dp)    python3 -m bench.data_parallel --out "$OUT/data_parallel.json" 2>&1 | grep -v "^{" ;;
  tune)  python3 -m bench.tune_speed --model resnet18 --trials 30 --out "$OUT/tune_speed.json" 2>&1 | tail -40 ;;
esac
