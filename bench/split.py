"""Intra-layer split (seed 003) and CoEdge (seed 004's baseline) on the in-process engine, batch-1
latency, one run per model on one engine (every figure measured side by side):

- per chain and per CPU share of its rows 0.0..1.0 (step 0.1): the CPU part, the GPU part, the
  join/sync and the chain's total, next to the chain on the GPU alone (CUDA graph) and on the CPU
  alone (shares 0.0 and 1.0);
- the whole model on each device alone (the GPU as one CUDA graph), the split strategy planned
  (seed 003's search) and at the sweep's best ratio per chain, CoEdge per layer, each with its
  output check against the unsplit fp32 model; with ``--throughput-batch`` also both in throughput
  mode (frames in flight) against the limit, the devices' standalone throughputs summed.

    python -m bench.split --models vgg16,resnet18 --throughput-batch 16   # GPU machine: the GPU + a CPU group
    python -m bench.split --models resnet18 --sms 66           # the GPU limited to a 66-SM green context
    python -m bench.split --smoke --out /tmp/split.json        # CPU: lenet on two CPU groups (CI)
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main"]


def make_devices(smoke: bool, sms: int | None, precision: str) -> list[Any]:
    """Two CPU groups (smoke, or no GPU), else one CPU group of every core but one and the GPU
    (or a green-context partition of ``sms`` of its SMs)."""
    import torch

    from autohet.engine import CpuDevice, GpuDevice

    cores = sorted(os.sched_getaffinity(0))
    if smoke or not torch.cuda.is_available():
        half = max(1, len(cores) // 2)
        return [CpuDevice("cpu0", tuple(cores[:half])), CpuDevice("cpu1", tuple(cores[half:]) or tuple(cores))]
    factory = None
    if sms:
        from autohet.executors.green import sm_partitions

        part = sm_partitions(0, [sms])[0]

        def factory() -> Any:
            return part.stream
    cpu = CpuDevice("cpu", tuple(cores[1:]) or tuple(cores))
    return [cpu, GpuDevice("gpu", 0, precision, stream_factory=factory, sms=sms)]


def chain_sweep(engine: Any, model: str, names: list[str], runs: int, max_windows: int) -> list[dict[str, Any]]:
    """Per chain, per share of device 0 (the CPU) 0.0..1.0: each side, the join and the total (ms)."""
    import torch

    from autohet.core.models import build_model, input_shape
    from autohet.engine import step_seconds
    from autohet.strategies.split import DeviceModel, StagePrograms, capture, spatial_graph

    module = build_model(model)
    x = torch.randn((1, *input_shape(model)), generator=torch.Generator().manual_seed(0))
    graph = spatial_graph(module, x, max_windows)
    rest = names[-1]  # the GPU joins (the second CPU group in the smoke run)
    programs = StagePrograms(engine, graph, names, rest, 1, graphs=True)
    feeds_all = capture(graph, DeviceModel(graph, engine["host"]), x, {v for c in graph.chains for v in c.inputs})
    rows = []
    for c, stage in enumerate(graph.chains):
        feeds = {v: feeds_all[v] for v in stage.inputs}
        for r in [k / 10 for k in range(11)]:
            program, tags = programs.chain_program(c, (r, 1.0 - r))
            per, wall = step_seconds(engine, program, feeds, tags, runs)
            side = [per.get(("side", str(c), d), 0.0) * 1e3 for d in names]
            rows.append({"model": model, "chain": c, "layers": f"{stage.nodes[0].name}..{stage.nodes[-1].name}",
                         "height": graph.height(stage.outputs[0]), "cpu_share": r,
                         f"{names[0]}_ms": side[0], f"{names[1]}_ms": side[1],
                         "join_ms": per.get(("join", str(c)), 0.0) * 1e3, "total_ms": wall * 1e3})
    return rows


def check(module: Any, images: np.ndarray, outputs: np.ndarray, precision: str) -> tuple[bool, float]:
    import torch

    from autohet.context import TOLERANCE

    with torch.inference_mode():
        ref = module(torch.from_numpy(images)).numpy()
    diff = float(np.max(np.abs(outputs - ref)))
    return diff <= TOLERANCE[precision] * max(float(np.max(np.abs(ref))), 1e-6), diff


def run_model(engine: Any, model: str, names: list[str], gpus: list[int], args: argparse.Namespace,
              sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """The split strategy planned and at the sweep's best ratios, and CoEdge, next to each device alone."""
    from autohet.context import tolerance_for
    from autohet.core.models import ModelSpec, build_model, input_shape
    from autohet.core.objectives import RunMode
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.strategies.split.coedge import CoEdgeJob, CoEdgeStrategy
    from autohet.strategies.split.strategy import SplitJob, SplitStrategy

    images = np.ascontiguousarray(Workload.from_spec(WorkloadSpec(args.requests, input_shape(model)))
                                  .rows(0, args.requests))
    spec = ModelSpec(model)
    module = build_model(spec)
    precision = tolerance_for([engine[d].precision for d in names])
    cpus = any(not engine[d].on_gpu for d in names)
    common = {"batch": 1, "runs": args.runs, "max_windows": args.max_windows}
    out: dict[str, Any] = {"model": model}
    planned = SplitJob(spec, RunMode.LATENCY, images, names, gpus, cpus,
                       SplitStrategy().validate(common)).run(engine)
    best: dict[int, tuple[float, float]] = {}
    for row in (r for r in sweep if r["model"] == model):
        if row["chain"] not in best or row["total_ms"] < best[row["chain"]][1]:
            best[row["chain"]] = (row["cpu_share"], row["total_ms"])
    ratios = [best[c][0] for c in sorted(best)]
    swept = SplitJob(spec, RunMode.LATENCY, images, names, gpus, cpus,
                     SplitStrategy().validate({**common, "start": "given", "ratios": ratios})).run(engine)
    coedge = CoEdgeJob(spec, RunMode.LATENCY, images, names, gpus, cpus,
                       CoEdgeStrategy().validate({"batch": 1, "runs": args.runs})).run(engine)
    base = planned.report["baselines"]
    out["alone_p50_ms"] = {d: b["p50_ms"] for d, b in base.items()}
    single = min(out["alone_p50_ms"].values())
    for label, got in (("split_planned", planned), ("split_swept", swept), ("coedge", coedge)):
        ok, diff = check(module, images, got.outputs, precision)
        p50 = float(np.median(got.times_s)) * 1e3
        out[label] = {"p50_ms": p50, "over_best_single": p50 / single, "output_ok": ok, "max_abs_diff": diff,
                      "ratios": got.report["ratios"], "rest": got.report["rest"]}
    if args.throughput_batch:
        n = (8 if args.smoke else args.throughput_frames) * args.throughput_batch  # a steady rate, not the fill
        workload = Workload.from_spec(WorkloadSpec(n, input_shape(model)))
        for label, cls, strategy in (("split", SplitJob, SplitStrategy), ("coedge", CoEdgeJob, CoEdgeStrategy)):
            params = strategy().validate({"batch": args.throughput_batch, "runs": args.runs,
                                          **({"max_windows": args.max_windows} if label == "split" else {})})
            got = cls(spec, RunMode.THROUGHPUT, workload, names, gpus, cpus, params).run(engine)
            ok, diff = check(module, workload.rows(0, n), got.outputs, precision)
            limit = sum(got.alone_ips.values())
            out[f"{label}_throughput"] = {"ips": n / got.wall_s, "limit_ips": limit,
                                          "efficiency": n / got.wall_s / limit, "output_ok": ok,
                                          "max_abs_diff": diff, "ratios": got.report["ratios"],
                                          "alone_ips": dict(got.alone_ips)}
    out["split_chain_table"] = planned.report["chain_table"]
    out["coedge_layers"] = coedge.report["layer_table"]
    out["temperature"] = planned.temperature
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="lenet on two CPU groups (CI)")
    parser.add_argument("--models", default="vgg16,resnet18")
    parser.add_argument("--requests", type=int, default=30, help="batch-1 requests per measured configuration")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per chain and ratio")
    parser.add_argument("--max-windows", type=int, default=4, help="split's chain cut (0: whole chains)")
    parser.add_argument("--sms", type=int, help="limit the GPU to a green-context partition of this many SMs")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16", "bf16"], help="the GPU's")
    parser.add_argument("--throughput-batch", type=int, default=0,
                        help="also run split and coedge in throughput mode, frames of this many images (0: no)")
    parser.add_argument("--throughput-frames", type=int, default=40, help="frames per throughput run")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    from autohet.engine import Engine
    from bench._common import describe_machine, emit

    if args.smoke:
        args.requests, args.runs = min(args.requests, 8), min(args.runs, 2)
        args.throughput_batch = args.throughput_batch or 8
    devices = make_devices(args.smoke, args.sms, args.precision)
    names = [d.name for d in devices]
    gpus = [d.index for d in devices if d.on_gpu]
    models = ["lenet"] if args.smoke else [m.strip() for m in args.models.split(",") if m.strip()]
    engine = Engine(devices)
    sweep, results = [], []
    try:
        for model in models:
            rows = chain_sweep(engine, model, names, args.runs, args.max_windows)
            sweep += rows
            results.append(run_model(engine, model, names, gpus, args, rows))
    finally:
        engine.close()
    for r in results:
        alone = "  ".join(f"{d} alone {ms:.3f}" for d, ms in r["alone_p50_ms"].items())
        print(f"\n{r['model']}: batch-1 p50 ms  {alone}")
        for label in ("split_planned", "split_swept", "coedge"):
            s = r[label]
            print(f"  {label:14s} {s['p50_ms']:.3f} ms ({s['over_best_single']:.3f} x the best single)  "
                  f"output_ok {s['output_ok']}  ratios {s['ratios']}")
        for label in ("split_throughput", "coedge_throughput"):
            if label in r:
                t = r[label]
                print(f"  {label:18s} {t['ips']:.1f} img/s of limit {t['limit_ips']:.1f} (efficiency "
                      f"{t['efficiency']:.3f}; alone {t['alone_ips']})  output_ok {t['output_ok']}  "
                      f"ratios {t['ratios']}")
        print("  coedge per layer (ms: compute | halo)")
        for layer in r["coedge_layers"]:
            cells = "  ".join(f"{d} {layer['compute_ms'][d]:.3f} | {layer['halo_ms'][d]:.3f}" for d in names)
            print(f"    {layer['layer']:24s} h {layer['height']:4d}  {cells}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"bench": "split", "machine": describe_machine(), "devices": names,
                                              "sms": args.sms, "rows": sweep, "results": results},
                                             indent=1, default=float))
    emit("split: per chain and CPU share (ms)", sweep,
         ["model", "chain", "height", "cpu_share", f"{names[0]}_ms", f"{names[1]}_ms", "join_ms", "total_ms"], None)


if __name__ == "__main__":
    main()
