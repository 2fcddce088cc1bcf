#!/bin/sh
# Issue 46/49's figures on a machine of several GPUs, one section per device call, back to back:
#   sh bench/multi_gpu.sh SECTION     SECTION: scaling | models | stream | tune | serve
# scaling: resnet18 on one GPU and on every GPU (in-process executors) next to one torch.compile process per
# GPU (PEER=0: not), the N-GPU config through autohet.load (float32 and uint8 pixels; float32 again at each of
# COPY_THREADS staging threads, and the host's staging alone), and with an 8-core CPU group beside the GPUs
# (no wheels needed). models: vgg16 and efficientnet_b0 on one GPU and on every GPU (CUDA graphs), the
# two-GPU gpu-marked tests, a pipeline over two GPUs (resnet18, throughput) and a split of vgg16's convolutions
# over them (batch-1 latency) next to one GPU alone (MODELS: other models; ENGINE=0: the scaling alone).
# tune: a default 300 s `autohet tune --model resnet18` (TUNE_MODEL: another) on the auto pool next to the
# N-process torch.compile peer, its exported config rerun (needs the wheels: ray[tune,serve], optuna, mlflow under /root/site).
# stream: a fifo config over every GPU (units of 4 batches, BACKENDS: inductor cudagraphs; CPU_GROUP=8: also
# with an 8-core ONNX Runtime group beside them) through bench.runtime_load in a fresh process each (IMAGES,
# default 30000; ROUNDS: run and streams by turns): run, float32 stream, pixels stream, and each lane's images
# and busy time (no wheels needed; STACKS=1: every thread's stacks sampled, printed; PLAIN=0: only the config
# with the group; BASE=<folder holding another autohet package>: an A/B of a code change, each config's process
# on that package and then on this one, PAIRS times by turns).
# serve: that config (CONFIG) behind `autohet serve` at saturation against its offline stream, then a GPU
# replica killed mid-load (FAULT=0: not).
# Logs and JSON go to $OUT.
cd "$(dirname "$0")/.."
. bench/_h100_common.sh
nvidia-smi -L; nvidia-smi topo -m | head -4
pool2() {  # two whole GPUs, a feeding core each
  cat > /tmp/gpus2.yaml <<EOF
version: 1
executors:
  - {name: gpu0, kind: gpu, gpu: 0, cores: [0], batch: ${1:-64}, precision: fp16, channels_last: true, backend: cudagraphs}
  - {name: gpu1, kind: gpu, gpu: 1, cores: [1], batch: ${1:-64}, precision: fp16, channels_last: true, backend: cudagraphs}
EOF
  cat > /tmp/gpu1.yaml <<EOF
version: 1
executors:
  - {name: gpu0, kind: gpu, gpu: 0, cores: [0], batch: ${1:-64}, precision: fp16, channels_last: true, backend: cudagraphs}
EOF
}
case "$1" in
  scaling)
    log "resnet18: peers (torch.compile, one process per GPU), autohet on 1 and on every GPU, its stream, a CPU group beside"
    peer=""; [ "${PEER:-1}" = 0 ] && peer=--no-peer
    t timeout -k 10 ${SCALING_TIMEOUT:-330} python3 -m bench.multi_gpu --models resnet18 --backend inductor --seconds 4 \
      --cpu-group 8 $peer --copy-threads "${COPY_THREADS:-}" --out "$W/scaling.json" > "$W/scaling.log" 2>&1
    grep -v -i warn "$W/scaling.log" | tail -12 ;;
  stream)
    n=$(nvidia-smi -L | wc -l)
    for b in ${BACKENDS:-inductor cudagraphs}; do
     groups="0 ${CPU_GROUP:-}"; [ "${PLAIN:-1}" = 0 ] && groups=${CPU_GROUP:?PLAIN=0 needs CPU_GROUP}
     for g in $groups; do
      name=fifo${n}_$b; [ "$g" = 0 ] || name=${name}_cpu$g
      python3 - "$n" "$b" "$g" "$W/$name.yaml" <<'EOF'
import sys
from autohet.config import RunConfig, write_config
from autohet.core.models import ModelSpec
from autohet.executors import ExecutorSpec
from autohet.pool import PoolSpec
n, backend, group, path = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
execs = [ExecutorSpec(name=f"gpu{i}", kind="gpu", cores=(i,), gpu=i, batch=256, precision="fp16", channels_last=True,
                      backend=backend) for i in range(n)]
if group:  # an ONNX Runtime group on the next cores, beside the GPUs
    execs.append(ExecutorSpec("cpu_group", "cpu", tuple(range(n, n + group)), batch=16, backend="onnxruntime"))
write_config(RunConfig(ModelSpec("resnet18"), PoolSpec("gpus", execs), "fifo", {"c": 4, "unit": "batches"},
                       images=20000), path)
EOF
      for k in $(seq ${PAIRS:-1}); do
       for tree in ${BASE:+base} head; do
        run=$name; [ "${PAIRS:-1}" = 1 ] || run=${name}_$k; [ -n "${BASE:-}" ] && run=${name}_${tree}$k
        log "autohet.load of $name (fifo over $n GPUs, $b; cpuN: an N-core CPU group beside), a fresh process on the $tree package: its run, its streams, each lane"
        path=$PYTHONPATH; [ "$tree" = base ] && path=$(cd "$BASE" && pwd):$PYTHONPATH
        # PYTHONSAFEPATH: `-m` would put the current folder, this package, ahead of the path
        t env PYTHONSAFEPATH=1 PYTHONPATH="$path" timeout -k 10 ${STREAM_TIMEOUT:-200} python3 -m bench.runtime_load --config "$W/$name.yaml" \
          --images ${IMAGES:-30000} ${ROUNDS:+--rounds $ROUNDS} ${STACKS:+--stacks} --out "$W/stream_$run.json" \
          > "$W/stream_$run.log" 2>&1
        grep -v -i warn "$W/stream_$run.log" | tail -n ${STREAM_LINES:-8}
       done
      done
     done
    done ;;
  models)
    log "${MODELS:-vgg16,efficientnet_b0}: autohet on 1 and on every GPU (CUDA graphs)"
    t timeout -k 10 ${MODELS_TIMEOUT:-240} python3 -m bench.multi_gpu --models ${MODELS:-vgg16,efficientnet_b0} \
      --backend cudagraphs --seconds 3 --no-peer --no-stream --out "$W/models.json" > "$W/models.log" 2>&1
    grep -v -i warn "$W/models.log" | tail -5; [ "${ENGINE:-1}" = 0 ] && exit 0
    log "two-GPU gpu-marked tests"
    t timeout -k 10 ${TESTS_TIMEOUT:-120} python3 -m pytest -q -m gpu -p no:cacheprovider -k "two or gpu_to_gpu" \
      tests/test_runtime.py tests/test_executors.py tests/test_channels.py tests/test_pipeline.py > "$W/gpu_tests.log" 2>&1
    tail -3 "$W/gpu_tests.log"
    pool2 64
    log "a pipeline over two GPUs (resnet18, throughput), its efficiency against its bound"
    t timeout -k 10 ${ENGINE_TIMEOUT:-90} python3 -m autohet.cli run --in-process --model resnet18 --strategy pipeline \
      --pool /tmp/gpus2.yaml --images 20000 --json > "$W/pipeline.json" 2> "$W/pipeline.log"; tail -c 400 "$W/pipeline.json"; echo
    pool2 1
    log "vgg16 batch-1 latency: split over two GPUs, then one GPU alone"
    t timeout -k 10 ${ENGINE_TIMEOUT:-90} python3 -m autohet.cli run --in-process --model vgg16 --strategy split \
      --objective latency --pool /tmp/gpus2.yaml --json > "$W/split.json" 2> "$W/split.log"; tail -c 400 "$W/split.json"; echo
    t timeout -k 10 ${ENGINE_TIMEOUT:-90} python3 -m autohet.cli run --in-process --model vgg16 --strategy single \
      --objective latency --pool /tmp/gpu1.yaml --json > "$W/single_b1.json" 2> "$W/single_b1.log"; tail -c 300 "$W/single_b1.json"; echo ;;
  tune)
    [ -d /root/site/ray ] || sh .gpuwheels/part3/install.sh
    stop_ray; work=$PWD  # the tune runs from the project root (its conf, pool and search space files)
    peer=""; [ "${PEER:-1}" = 0 ] && peer=--no-peer
    log "the N-process torch.compile peer, a default autohet tune of ${TUNE_MODEL:-resnet18} (--time-budget ${TUNE_BUDGET:-300}) on every GPU, its config rerun"
    t timeout -k 10 ${TUNE_TIMEOUT:-560} python3 -m bench.multi_gpu --models ${TUNE_MODEL:-resnet18} --no-runs --no-stream --seconds 4 \
      $peer --tune ${TUNE_BUDGET:-300} --work $work --out "$W/tune.json" > "$W/tune.log" 2>&1
    grep -v -i warn "$W/tune.log" | tail -6; cp $work/multi-gpu-*.log $work/multi-gpu-*.yaml $work/runs/mlflow.db "$W/" 2>/dev/null
    mkdir -p /tmp/mgtune; cp $work/multi-gpu-*.yaml /tmp/mgtune/ 2>/dev/null; stop_ray ;;
  serve)
    stop_ray; cfg=${CONFIG:-/tmp/mgtune/multi-gpu-resnet18.yaml}
    log "serve $cfg at saturation: ${CLIENTS:-128} clients in ${PROCS:-16} processes, 64-image uint8 requests, ${SERVE_SECONDS:-15} s"
    t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config "$cfg" --clients ${CLIENTS:-128} \
      --client-procs ${PROCS:-16} --npy-batch 64 --pixels --seconds ${SERVE_SECONDS:-15} --offline-images 100000 \
      --out "$W/serve.json" > "$W/serve.log" 2>&1; tail -12 "$W/serve.log"; stop_ray
    [ "${FAULT:-1}" = 0 ] && exit 0
    log "the same, the fastest GPU replica killed after 6 s"
    t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config "$cfg" --clients ${CLIENTS:-128} \
      --client-procs ${PROCS:-16} --npy-batch 64 --pixels --seconds ${SERVE_SECONDS:-15} --offline-images 100000 \
      --kill-replica-after 6 --out "$W/serve_fault.json" > "$W/serve_fault.log" 2>&1; tail -12 "$W/serve_fault.log"
    stop_ray ;;
esac
