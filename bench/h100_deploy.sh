#!/bin/sh
# The deployment wave's GPU figures (issues 26-28), one section per device call, back to back:
#   sh bench/h100_deploy.sh SECTION     SECTION: runtime | trace | tune_runtime | tune | serve | serve_v2 | phases | small | cpu_only
# runtime: autohet.load's stream against the run it serves (hand-written configs CONFIGS, default
# "single mixed", IMAGES each, default 20000, ROUNDS of run and stream by turns, default 1; no Ray: fits the
# call that stages the first wheel part). trace: every piece of those configs' streams (CONFIGS, default
# "mixed"; REPEAT steady streams of each input kind, default 6) and GPU 0's clock (bench.lane_trace).
# tune_runtime: a default tune of resnet18 next to its peers
# (torch.compile, CUDA graph), then that tune's config through autohet.load (IMAGES a stream, default
# 20000) and JPEGS (default 5000) JPEGs through `run --input`. serve: that config behind `autohet serve` at saturation, a batch-1 latency config
# over HTTP, and a replica killed mid-load. serve_v2: the tuned config (CONFIG) at saturation through the Open
# Inference Protocol v2, tritonclient's HTTP then gRPC clients (wheels + tritonclient's under /root/site), each
# followed by perf_analyzer where PERF_ANALYZER names its binary. phases: serve_load runs of one config (CONFIG, RUNS), each
# printing where a request's time went (Server-Timing) and the replica's stream. small: cifarnet's
# peers and a default tune (issue 26's small, fast model). tune: tune_runtime's peers and default tune
# alone. cpu_only: the CPU executor's OpenVINO settings next to the peer (bench.cpu_executor_sweep, SWEEP
# models), then CPU-only tunes on cores 1-15 next to their peers (bench.cpu_peers, MODELS). Wheels (ray[tune,serve], optuna, mlflow) under
# /root/site for tune_runtime and serve. Logs and JSON go to $OUT (packed into one tarball).
cd "$(dirname "$0")/.."
. bench/_h100_common.sh
configs() {  # resnet18 configs written by hand (their runs are measured in the same call)
  python3 - "$W" <<'EOF'
import sys
from pathlib import Path
from autohet.config import RunConfig, write_config
from autohet.executors import ExecutorSpec
from autohet.core.models import ModelSpec
from autohet.pool import PoolSpec
out = Path(sys.argv[1])
gpu = dict(name="gpu0", kind="gpu", cores=(0,), gpu=0, batch=256, precision="fp16", channels_last=True)
single = PoolSpec("gpu", [ExecutorSpec(**{**gpu, "backend": "cudagraphs"})])
write_config(RunConfig(ModelSpec("resnet18"), single, "single", {"executor": 0}, images=20000), out / "single.yaml")
mixed = PoolSpec("mixed", [ExecutorSpec(**{**gpu, "backend": "cudagraphs"}),
                           ExecutorSpec("cpu0", "cpu", tuple(range(1, 16)), batch=16, backend="onnxruntime")])
write_config(RunConfig(ModelSpec("resnet18"), mixed, "fast_split",
                       {"unit": "batches", "w_s": 2, "r": 0.8, "threshold": 1}, images=20000), out / "mixed.yaml")
latency = PoolSpec("gpu", [ExecutorSpec(**{**gpu, "batch": 1, "backend": "inductor"})])
write_config(RunConfig(ModelSpec("resnet18"), latency, "single", {"executor": 0}, images=50, objective="latency"),
             out / "latency.yaml")
EOF
}
case "$1" in
  runtime)
    configs
    for c in ${CONFIGS:-single mixed}; do
      log "autohet.load stream vs the measured run: $c"
      t timeout -k 10 ${RT_TIMEOUT:-150} python3 -m bench.runtime_load --config "$W/$c.yaml" --images ${IMAGES:-20000} \
        --rounds ${ROUNDS:-1} --out "$W/runtime_$c.json" > "$W/runtime_$c.log" 2>&1; tail -3 "$W/runtime_$c.log"
    done ;;
  trace)
    configs
    for c in ${CONFIGS:-mixed}; do
      log "every piece of $c's streams: ${REPEAT:-6} steady float32 then pixels streams, GPU 0's clock"
      t timeout -k 10 ${RT_TIMEOUT:-240} python3 -m bench.lane_trace --config "$W/$c.yaml" --images ${IMAGES:-20000} \
        --repeat ${REPEAT:-6} --out "$W/trace_$c.json" > "$W/trace_$c.log" 2>&1; grep "^stream" "$W/trace_$c.log"
    done ;;
  tune_runtime)
    stop_ray
    log "GPU-marked tests (engine, executors, channels, runtime)"
    t timeout -k 10 ${TESTS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine_jobs.py \
      tests/test_executors.py tests/test_channels.py tests/test_runtime.py > "$W/gpu_tests.log" 2>&1
    tail -3 "$W/gpu_tests.log"; stop_ray
    work=/tmp/deploy; mkdir -p $work
    log "peers of resnet18 (eager, torch.compile, CUDA graph) and a default autohet tune (--time-budget ${TUNE_BUDGET:-90})"
    t timeout -k 10 ${PEERS_TIMEOUT:-300} python3 -m bench.peers --models resnet18 --max-mode "${MAX_MODE:-}" --no-b1-compile \
      --time-budget ${TUNE_BUDGET:-90} --work $work --out "$W/peers.json" > "$W/peers.log" 2>&1
    tail -6 "$W/peers.log"; cp $work/*.log "$W/" 2>/dev/null
    best=$work/runs/peers-resnet18/best.yaml; cp $best "$W/tuned.yaml" 2>/dev/null; stop_ray
    log "the tuned config through autohet.load, and ${JPEGS:-5000} JPEGs through run --input"
    t timeout -k 10 ${RT_TIMEOUT:-150} python3 -m bench.runtime_load --config $best --images ${IMAGES:-20000} \
      --jpegs ${JPEGS:-5000} --out "$W/runtime_tuned.json" > "$W/runtime_tuned.log" 2>&1
    tail -4 "$W/runtime_tuned.log" ;;
  tune)
    stop_ray; work=/tmp/deploy; mkdir -p $work
    log "peers of resnet18 and a default autohet tune (--time-budget ${TUNE_BUDGET:-600})"
    t timeout -k 10 ${PEERS_TIMEOUT:-900} python3 -m bench.peers --models resnet18 --max-mode "${MAX_MODE:-}" --no-b1-compile \
      --time-budget ${TUNE_BUDGET:-600} --work $work --out "$W/peers.json" > "$W/peers.log" 2>&1
    tail -6 "$W/peers.log"; cp $work/*.log "$W/" 2>/dev/null
    cp $work/runs/peers-resnet18/best.yaml "$W/tuned.yaml" 2>/dev/null; cp $work/runs/mlflow.db "$W/" 2>/dev/null; stop_ray ;;
  cpu_only)
    stop_ray; work=/tmp/cpuw; mkdir -p $work
    for m in ${SWEEP:-resnet18}; do
      log "the CPU executor's OpenVINO settings next to the peer: $m, cores 1-15"
      t timeout -k 10 ${SWEEP_TIMEOUT:-400} python3 -m bench.cpu_executor_sweep --model $m --cores 1-15 --rounds 3 \
        ${SWEEP_ARGS:-} --out "$W/sweep_$m.json" > "$W/sweep_$m.log" 2>&1; tail -12 "$W/sweep_$m.log"
    done
    log "CPU-only tunes on cores 1-15 next to their peers: ${MODELS:-resnet18,mobilenet_v2}"
    t timeout -k 10 ${PEERS_TIMEOUT:-1500} python3 -m bench.cpu_peers --models ${MODELS:-resnet18,mobilenet_v2} --cores 1-15 \
      --time-budget ${TUNE_BUDGET:-300} --no-inductor --seconds 6 --rerun-s 10 --ab-rounds 3 --work $work \
      --out "$W/cpu_peers.json" > "$W/cpu_peers.log" 2>&1
    tail -8 "$W/cpu_peers.log"; cp $work/*.log "$W/" 2>/dev/null
    for d in $work/runs/cpu-peers-*; do cp $d/best.yaml "$W/$(basename $d)_best.yaml" 2>/dev/null; done
    cp $work/runs/mlflow.db "$W/" 2>/dev/null; stop_ray ;;
  serve)
    stop_ray
    configs
    best=/tmp/deploy/runs/peers-resnet18/best.yaml; [ -f $best ] || best=$W/single.yaml
    log "serve the tuned config at saturation (${SERVE_SECONDS:-20} s), uint8 pixel requests"
    t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config $best --clients 64 --client-procs 4 \
      --npy-batch 64 --pixels --seconds ${SERVE_SECONDS:-20} --out "$W/serve_pixels.json" > "$W/serve_pixels.log" 2>&1
    tail -8 "$W/serve_pixels.log"; stop_ray
    log "the GPU + 15-core fast_split config, its fastest replica killed after 8 s"
    t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config "$W/mixed.yaml" --clients 64 \
      --npy-batch 32 --pixels --seconds ${SERVE_SECONDS:-20} --kill-replica-after 8 --out "$W/serve_fault.json" \
      > "$W/serve_fault.log" 2>&1
    tail -8 "$W/serve_fault.log"; stop_ray
    log "the batch-1 latency config (inductor, captured), one client"
    t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config "$W/latency.yaml" --clients 1 \
      --npy-batch 1 --seconds 12 --out "$W/serve_latency.json" > "$W/serve_latency.log" 2>&1
    tail -8 "$W/serve_latency.log"; stop_ray ;;
  serve_v2)  # issue 48: the tuned config through the Open Inference Protocol v2 (tritonclient), HTTP then gRPC
    stop_ray; cfg=${CONFIG:-bench/results/h100_deploy/v7/tune_runtime/tuned.yaml}
    for p in ${PROTOCOLS:-v2-http v2-grpc}; do
      log "serve $cfg at saturation through $p (tritonclient, binary tensors): 64 clients in 8 processes, 64-image uint8 tensors, ${SERVE_SECONDS:-15} s"
      t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config "$cfg" --clients 64 --client-procs 8 \
        --npy-batch 64 --pixels --protocol $p --seconds ${SERVE_SECONDS:-15} ${SERVE_ARGS:-} --out "$W/serve_$p.json" > "$W/serve_$p.log" 2>&1
      tail -12 "$W/serve_$p.log"; stop_ray
      [ -n "${PERF_ANALYZER:-}" ] || continue  # Triton's C++ load generator (tritonclient 2.60's wheel) as the clients
      log "the same through $p with perf_analyzer: 64 requests in flight, 64-image uint8 tensors, windows of ${SERVE_SECONDS:-15} s"
      t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config "$cfg" --clients 64 --npy-batch 64 --pixels \
        --protocol $p --seconds ${SERVE_SECONDS:-15} --perf-analyzer "$PERF_ANALYZER" ${SERVE_ARGS:-} \
        --out "$W/serve_${p}_pa.json" > "$W/serve_${p}_pa.log" 2>&1
      tail -12 "$W/serve_${p}_pa.log"; stop_ray
    done ;;
  phases)  # where a served request's time goes: serve_load runs of one config, RUNS="clients:procs:images ..."
    stop_ray; cfg=${CONFIG:-bench/results/h100_deploy/v7/tune_runtime/tuned.yaml}
    for run in ${RUNS:-64:4:64 128:4:64}; do
      c=${run%%:*}; n=${run##*:}; p=${run#*:}; p=${p%%:*}; f="$W/phases_${c}_${p}_${n}"
      log "serve $cfg: $c clients in $p processes, $n-image uint8 requests, ${SERVE_SECONDS:-15} s ${SERVE_ARGS:-}"
      t timeout -k 10 ${SERVE_TIMEOUT:-240} python3 -m bench.serve_load --config "$cfg" --clients $c --client-procs $p \
        --npy-batch $n --pixels --seconds ${SERVE_SECONDS:-15} ${SERVE_ARGS:-} --out "$f.json" > "$f.log" 2>&1
      tail -12 "$f.log"; stop_ray
    done ;;
  small)
    stop_ray; work=/tmp/small; mkdir -p $work
    log "a small fast model (cifarnet, 32x32): peers and a default tune (--time-budget ${TUNE_BUDGET:-120})"
    t timeout -k 10 ${PEERS_TIMEOUT:-300} python3 -m bench.peers --models cifarnet --max-mode "${MAX_MODE:-}" --no-b1-compile \
      --time-budget ${TUNE_BUDGET:-120} --work $work --out "$W/peers_small.json" > "$W/peers_small.log" 2>&1
    tail -6 "$W/peers_small.log"; cp $work/*.log "$W/" 2>/dev/null; stop_ray ;;
  *) echo "unknown section '$1': runtime, trace, tune_runtime, tune, serve, serve_v2, phases, small or cpu_only"; exit 2 ;;
esac
tar -czf "$OUT/$1.tgz" -C "$OUT" "$1" && rm -rf "$W"
