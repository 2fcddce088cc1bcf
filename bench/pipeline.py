"""Pipelining (seed 002) side by side with the best data-parallel point and the best single
executor, measured in one run per model and GPU shape.

On a GPU and one CPU group of the other cores (one core feeds the GPU), for each model: with the
whole GPU and, with ``--sms N``, with a green-context partition of N SMs next to the CPU (the GPU
device built on ``autohet.executors.green.sm_partitions``' stream): the pipeline on the in-process
engine (planned stages: each stage's blocks, device and standalone time per frame, the bound,
efficiency = throughput / bound, the whole model on each device at the same micro-batch), then
``single`` on the executor with the best standalone speed and a small data-parallel grid on the
pool's executors (the same specs, so the same partition), over a workload sized to ``--seconds``
of the pool's work. ``--in-process``: those executors as threads (a box without Ray); the stored
H100 results were taken so. ``--smoke``: lenet on two CPU groups, in-process.

    python -m bench.pipeline --sms 66 --out bench/results/h100_pipeline.json            # GPU machine
    python -m bench.pipeline --in-process --sms 66 --out bench/results/h100_pipeline.json
    python -m bench.pipeline --smoke --out /tmp/pipeline.json                          # CPU box
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from autohet.context import RunContext, tolerance_for
from autohet.core.models import ModelSpec, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.engine import CpuDevice, Engine, GpuDevice
from autohet.executors import ExecutorSpec
from autohet.pool import LocalPool, PoolSpec, RayPool, detect_executors, load_pool
from autohet.strategies import get_strategy
from autohet.strategies.pipeline import PipelineJob
from autohet.strategies.pipeline.strategy import default_batch
from autohet.strategy_run import run_strategy
from bench._common import emit

DATA_PARALLEL = {"fast_split": [{"w_s": 1, "r": 0.5, "threshold": 1, "unit": "batches"}],
                 "hat": [{"s": 32}], "fifo": [{"c": 4, "unit": "batches"}]}
SMOKE_GRID = {"fast_split": [{"w_s": 64}], "fifo": [{"c": 128}]}


def machine_specs(args: argparse.Namespace, sms: int | None) -> list[ExecutorSpec]:
    """A GPU (or a partition of it) fed by one core and one CPU group of the other cores; two CPU
    groups for the smoke run."""
    if args.smoke:
        return load_pool("actors/cpu2.yaml").executors
    import torch

    cores = sorted(os.sched_getaffinity(0))
    gpu = {"batch": args.gpu_batch, "precision": args.precision, "channels_last": True, "sms": sms}
    settings = {"cpu_group_size": max(1, len(cores) - 1), "max_cpu_groups": 1, "gpu": gpu,
                "cpu": {"batch": args.cpu_batch}}
    return detect_executors(cores, min(1, torch.cuda.device_count()), settings)


def engine_for(specs: list[ExecutorSpec]) -> Engine:
    """The engine devices of the specs; a partitioned GPU runs on its green context's stream."""
    from autohet.executors.green import sm_partitions

    devices = []
    for spec in specs:
        if spec.is_gpu:
            part = sm_partitions(spec.gpu or 0, [spec.sms])[0] if spec.sms else None
            factory = (lambda p=part: p.stream) if part is not None else None
            devices.append(GpuDevice(spec.name, spec.gpu or 0, spec.precision, spec.channels_last, factory, spec.sms))
        else:
            devices.append(CpuDevice(spec.name, spec.cores, spec.precision, spec.channels_last))
    return Engine(devices)


def pipeline_row(name: str, specs: list[ExecutorSpec], ctx: RunContext, args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline on a hand-built engine: planned stages, bound, efficiency, output check."""
    batch = args.batch or (None if args.smoke else 32)
    given = {"batch": batch} if batch else {}
    params = get_strategy("pipeline").validate({**given, "graphs": args.graphs, "runs": args.runs})
    params["batch"] = params["batch"] or default_batch(specs, ctx.workload.images)
    engine = engine_for(specs)
    try:
        result = PipelineJob(ctx.model, ctx.workload, [s.name for s in specs], params).run(engine)
        out = result.report
    finally:
        engine.close()
    images = ctx.workload.images
    ok, diff, _, problems = ctx.check(result.outputs, np.ones(images, dtype=np.int32),
                                      tolerance_for([s.precision for s in specs]), False)
    ips = images / (result.wall_s or float("nan"))
    print(f"  pipeline batch {out['batch']} depth {out['depth']}: {ips:.1f} img/s, bound {out['bound_ips']:.1f} "
          f"(modelled {out['modelled_bound_ips'] or float('nan'):.1f}), efficiency {ips / out['bound_ips']:.3f}, "
          f"output {'ok' if ok else 'FAILED ' + '; '.join(problems)}; collector in the run: "
          f"{out['gc']['collections']} collections, {out['gc']['total_ms']:.1f} ms", flush=True)
    for s in out["stages"]:
        print(f"    stage {s['stage']} on {s['device']:8s} {s['blocks'][0]} .. {s['blocks'][-1]} ({len(s['blocks'])} "
              f"blocks): {s['frame_ms']:.3f} ms/frame alone (compute {s['compute_ms'] or 0:.3f}, in "
              f"{s['in_ms'] or 0:.3f}, out {s['out_ms'] or 0:.3f}; modelled {s['modelled_frame_ms'] or 0:.3f})",
              flush=True)
    return {"model": name, "kind": "pipeline", "params": {"batch": out["batch"], "depth": out["depth"],
                                                          "cuts": out["cuts"], "order": out["order"]},
            "throughput_ips": ips, "limit_ips": out["bound_ips"], "efficiency": ips / out["bound_ips"],
            "output_ok": ok, "max_abs_diff": diff, "stages": out["stages"], "single_ips_same_batch": out["single_ips"],
            "modelled_bound_ips": out["modelled_bound_ips"], "links": out["links"],
            "block_times_ms": out["block_times_ms"], "gc": out["gc"]}


def pool_rows(name: str, specs: list[ExecutorSpec], args: argparse.Namespace, in_process: bool
              ) -> tuple[RunContext, list[dict[str, Any]]]:
    """``single`` on the executor with the best standalone speed and the data-parallel grid, on the
    pool's executors; the workload is sized from the standalone speeds (``--seconds`` of work for the
    whole pool), and the pipeline then runs the same workload."""
    spec = PoolSpec("bench", specs)
    pool = LocalPool(spec) if in_process else RayPool(spec)
    rows: list[dict[str, Any]] = []
    try:
        probe = Workload.from_spec(WorkloadSpec(args.images, input_shape(name)))
        pool.start(ModelSpec(name), probe)
        speeds = pool.standalone_ips(0.5)
        images = min(args.images, max(args.min_images, int(sum(speeds) * args.seconds)))
        ctx = RunContext(ModelSpec(name), Workload(probe.bank, images), check_images=16, standalone_seconds=0.3)
        grid = SMOKE_GRID if args.smoke else DATA_PARALLEL
        points = [("single", {"executor": int(np.argmax(speeds))})]
        points += [(s, p) for s, ps in grid.items() for p in ps]
        print(f"  standalone img/s: {', '.join(f'{e.name} {v:.1f}' for e, v in zip(specs, speeds, strict=True))}; "
              f"{images} images", flush=True)
        for strategy, params in points:
            m = run_strategy(strategy, params, pool, ctx)
            print(f"  {strategy} {params}: {m.throughput_ips:.1f} img/s, limit {m.limit_ips:.1f}, efficiency "
                  f"{m.efficiency:.3f}, output {'ok' if m.output_ok else 'FAILED'}", flush=True)
            rows.append({"model": name, "kind": "single" if strategy == "single" else "data-parallel",
                         "strategy": strategy, "params": params, "throughput_ips": m.throughput_ips,
                         "limit_ips": m.limit_ips, "efficiency": m.efficiency, "output_ok": m.output_ok})
    finally:
        pool.shutdown()
    return ctx, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--models", default="vgg16,resnet18,mobilenet_v2")
    parser.add_argument("--images", type=int, default=8192, help="at most this many images per run")
    parser.add_argument("--min-images", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=3.0, help="work per run for the whole pool (sizes it)")
    parser.add_argument("--sms", type=int, help="also run on a green-context partition of this many SMs")
    parser.add_argument("--skip-whole", action="store_true", help="with --sms: only the partition")
    parser.add_argument("--batch", type=int, help="the pipeline's micro-batch (default: 32 with a GPU, else the "
                        "strategy's)")
    parser.add_argument("--gpu-batch", type=int, default=64)
    parser.add_argument("--cpu-batch", type=int, default=8)
    parser.add_argument("--precision", default="fp16", help="the GPU's precision (the CPU runs fp32)")
    parser.add_argument("--graphs", default=True, type=lambda v: v.lower() in ("1", "on", "true", "yes"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--in-process", action="store_true", help="data-parallel on in-process executors")
    parser.add_argument("--out")
    args = parser.parse_args()
    in_process = args.in_process or args.smoke
    if not in_process:
        from autohet.platform.ray_cluster import init_ray

        init_ray()
    models = ["lenet"] if args.smoke else args.models.split(",")
    if args.smoke:
        args.images, args.min_images = 512, 512
    shapes = [None] if args.smoke or not args.sms else ([args.sms] if args.skip_whole else [None, args.sms])
    rows: list[dict[str, Any]] = []
    for sms in shapes:
        specs = machine_specs(args, sms)
        gpu = "cpu only" if args.smoke else ("whole GPU" if sms is None else f"{sms}-SM partition")
        print(f"devices ({gpu}): " + ", ".join(f"{s.name} {s.device} batch {s.batch} {s.precision}" for s in specs),
              flush=True)
        for name in models:
            print(f"\n{name} / {gpu}", flush=True)
            ctx, rows_pool = pool_rows(name, specs, args, in_process)
            group = [pipeline_row(name, specs, ctx, args), *rows_pool]
            singles = [r for r in group if r["kind"] == "single" and r["output_ok"]]
            best_single = max(r["throughput_ips"] for r in singles) if singles else float("nan")
            for r in group:
                r["gpu"] = gpu
                r["vs_best_single"] = r["throughput_ips"] / best_single
            best = {}
            for r in group:
                if r["output_ok"] and r["throughput_ips"] > best.get(r["kind"], {}).get("throughput_ips", -1):
                    best[r["kind"]] = r
            for kind, r in best.items():
                r["best_of_kind"] = True
                print(f"  BEST {kind}: {r['throughput_ips']:.1f} img/s ({r['vs_best_single']:.3f} x the best "
                      "single)", flush=True)
            rows += group
    emit("pipeline vs data-parallel vs single", [r for r in rows if r.get("best_of_kind")] + [
        r for r in rows if not r.get("best_of_kind")],
        ["model", "gpu", "kind", "params", "throughput_ips", "limit_ips", "efficiency", "vs_best_single", "output_ok"],
        args.out)


if __name__ == "__main__":
    main()
