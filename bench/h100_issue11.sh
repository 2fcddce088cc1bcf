#!/bin/sh
# Issue 11's figures on the GPU box, one call: profile (timed), the default tune, then GPU smoke items.
# Logs under $OUT. Stale Ray processes of earlier commands on the machine are stopped first.
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
t() { s=$(date +%s); "$@"; rc=$?; echo "wall $(( $(date +%s) - s )) s (exit $rc)"; }
echo "== profile resnet18 (auto pool)" > $OUT/issue11.log
t timeout 150 python3 -m autohet.cli profile --model resnet18 >> $OUT/issue11.log 2>&1
python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
echo "== tune resnet18 --time-budget 240 (auto pool)" >> $OUT/issue11.log
t timeout 330 python3 -m autohet.cli tune --model resnet18 --time-budget 240 >> $OUT/issue11.log 2>&1
cp runs/resnet18/best.yaml $OUT/tune_best.yaml 2>/dev/null
echo "== gpu smoke" >> $OUT/issue11.log
t timeout ${SMOKE_S:-100} python3 -m bench.gpu_smoke --skip "executor" --out $OUT/smoke.json >> $OUT/issue11.log 2>&1
