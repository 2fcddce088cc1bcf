#!/bin/sh
# The architecture wave's GPU figures (issues 11-15), one section per device call:
#   sh bench/h100_wave.sh SECTION       SECTION: probe | split | issue11 | energy | engine | pipeline | peers |
#                                                latency_single | pipeline_inproc | gpu_tests
# Each item runs under its own timeout so a slow or failing one leaves the next its time; logs and
# JSON go to $OUT (at most 8 files come back: the section's files are packed into one tarball).
# Wheels (ray, optuna, mlflow) must be installed under /root/site for every section but probe, split,
# engine, latency_single and pipeline_inproc, which run in-process alone (so they fit the call that
# stages the first part).
cd "$(dirname "$0")/.."
. bench/_h100_common.sh
case "$1" in
  split)
    for m in resnet18 vgg16; do
      frames=40; [ "$m" = vgg16 ] && frames=12
      log "split $m whole GPU"; t timeout -k 10 150 python3 -m bench.split --models $m --throughput-batch 16 \
        --throughput-frames $frames --runs 3 --out "$W/split_${m}_whole.json" > "$W/split_${m}_whole.log" 2>&1
      log "split $m 8-SM partition"; t timeout -k 10 150 python3 -m bench.split --models $m --throughput-batch 16 \
        --throughput-frames $frames --runs 3 --sms 8 --out "$W/split_${m}_sms8.json" > "$W/split_${m}_sms8.log" 2>&1
    done ;;
  probe)
    for n in 64 8; do
      log "green-context partitions, layer by layer, $n SMs"; t timeout -k 10 100 python3 -m bench.green_probe --sms $n \
        --seconds 1.5 > "$W/probe_sms$n.log" 2>&1; tail -1 "$W/probe_sms$n.log"
    done ;;
  issue11)
    stop_ray
    log "two green-context partitions under fast_split"
    t timeout -k 10 150 python3 -m bench.partitions --models resnet18 --out "$W/partitions.json" > "$W/partitions.log" 2>&1
    tail -15 "$W/partitions.log"; stop_ray
    log "profile resnet18 (auto pool)"; t timeout -k 10 150 python3 -m autohet.cli profile --model resnet18 > "$W/profile.log" 2>&1
    tail -12 "$W/profile.log"; stop_ray
    log "tune resnet18 --time-budget 240 (auto pool)"
    t timeout -k 10 360 python3 -m autohet.cli tune --model resnet18 --time-budget 240 > "$W/tune.log" 2>&1
    tail -30 "$W/tune.log"; cp runs/resnet18/best.yaml "$W/tune_best.yaml" 2>/dev/null; stop_ray ;;
  energy)
    stop_ray
    log "tune resnet18 --objective throughput,energy --trials 20"
    t timeout -k 10 390 python3 -m autohet.cli tune --model resnet18 --objective throughput,energy --trials 20 \
      --time-budget 330 --experiment resnet18-energy > "$W/tune.log" 2>&1
    tail -40 "$W/tune.log"; stop_ray
    log "export the two ends of the Pareto front and rerun each"
    t timeout -k 10 170 python3 -m bench.front_rerun --experiment resnet18-energy --out "$W/front_rerun.json" \
      > "$W/front_rerun.log" 2>&1; tail -12 "$W/front_rerun.log"; stop_ray ;;
  engine)
    log "placement resnet18,vgg16 on the engine"
    t timeout -k 10 150 python3 -m bench.placement --models resnet18,vgg16 --requests 50 --out "$W/placement.json" \
      > "$W/placement.log" 2>&1; tail -12 "$W/placement.log"
    log "channels whole GPU"; t timeout -k 10 150 python3 -m bench.channels --models resnet18,vgg16 --tune 0 --runs 5 \
      --out "$W/channels_whole.json" > "$W/channels_whole.log" 2>&1; tail -30 "$W/channels_whole.log"
    log "channels 8-SM partition"; t timeout -k 10 150 python3 -m bench.channels --models resnet18,vgg16 --tune 0 \
      --runs 5 --sms 8 --out "$W/channels_sms8.json" > "$W/channels_sms8.log" 2>&1; tail -30 "$W/channels_sms8.log" ;;
  pipeline)
    stop_ray
    log "pipeline vs data-parallel vs single, whole GPU and an 8-SM partition"
    t timeout -k 10 500 python3 -m bench.pipeline --sms 8 --out "$W/pipeline.json" > "$W/pipeline.log" 2>&1
    tail -40 "$W/pipeline.log" ;;
  peers)
    stop_ray
    log "peers: eager, torch.compile, CUDA graph, autohet tuned (throughput and batch-1 latency)"
    # PEERS_LATENCY=--latency adds each model's batch-1 latency tune, --latency-only makes it the only one
    work=/tmp/peers-$(date +%s)
    t timeout -k 10 ${PEERS_TIMEOUT:-560} python3 -m bench.peers --models ${PEERS_MODELS:-resnet18,vgg16} --max-mode "" \
      --time-budget ${PEERS_BUDGET:-150} ${PEERS_LATENCY:-} --work $work --out "$W/peers.json" > "$W/peers.log" 2>&1
    tail -12 "$W/peers.log"; cp $work/*.log "$W/" 2>/dev/null ;;
  gpu_tests)
    log "GPU-marked tests of the engine, the executors and channels"
    t timeout -k 10 ${TESTS_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine_jobs.py \
      tests/test_executors.py tests/test_channels.py > "$W/gpu_tests.log" 2>&1; tail -3 "$W/gpu_tests.log" ;;
  latency_single)
    log "batch-1 latency: autohet single (in-process, served on the GPU's thread) per backend, then the peers"
    # LAT_DUMP_S=N: every thread's stack to the run's log every N s (a run that does not return)
    for b in ${LAT_BACKENDS:-cudagraphs inductor}; do
      printf 'executors:\n  - {name: gpu0, kind: gpu, cores: [0], precision: fp16, channels_last: true, backend: %s}\n' \
        $b > /tmp/gpu_$b.yaml
      for m in $(echo ${LAT_MODELS:-resnet18,vgg16,mobilenet_v2,efficientnet_b0} | tr , ' '); do
        AUTOHET_STACK_DUMP_S=${LAT_DUMP_S:-0} timeout -k 10 ${LAT_TIMEOUT:-150} python3 -m autohet.cli run --model $m \
          --strategy single --objective latency --in-process \
          --pool /tmp/gpu_$b.yaml --json > "$W/latency_${b}_$m.json" 2> "$W/latency_${b}_$m.log"
        python3 -c 'import json,sys; m=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(sys.argv[2], sys.argv[3], round(m["latency_ms"]["p50"], 4), "ms p50, output ok:", m["output_ok"], m["extra"].get("served"))' \
          "$W/latency_${b}_$m.json" $b $m 2>&1 | tail -1
      done
    done
    [ "${LAT_PEERS:-1}" = 1 ] && t timeout -k 10 200 python3 -m bench.peers --latency-only --no-tune \
      --models ${LAT_MODELS:-resnet18,vgg16,mobilenet_v2,efficientnet_b0} --out "$W/peers_latency.json" \
      > "$W/peers_latency.log" 2>&1; tail -7 "$W/peers_latency.log" ;;
  pipeline_inproc)
    log "pipeline vs data-parallel vs single (in-process), whole GPU and an ${PIPE_SMS:-8}-SM partition"
    t timeout -k 10 ${PIPE_TIMEOUT:-500} python3 -m bench.pipeline --in-process --models ${PIPE_MODELS:-resnet18,mobilenet_v2} \
      --sms ${PIPE_SMS:-8} --out "$W/pipeline.json" > "$W/pipeline.log" 2>&1
    tail -40 "$W/pipeline.log" ;;
  *) echo "unknown section '$1': probe, split, issue11, energy, engine, pipeline, peers, latency_single, pipeline_inproc"\
       "or gpu_tests"
     exit 2 ;;
esac
tar -czf "$OUT/$1.tgz" -C "$OUT" "$1" && rm -rf "$W"
