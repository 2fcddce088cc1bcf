"""Two green-context partitions of one GPU as two executors (issues 12 and 16), side by side in one run:

- the whole GPU alone, and each partition alone (standalone images/s), their sum against the whole;
- the two partitions together under ``fast_split`` (the group actor that hosts both partitions of
  the GPU in one process), with output_ok, throughput and efficiency against the summed limit;
- with ``--with-cpu``, the same with one CPU group next to them;
- the in-process strategies over the two partitions as two devices (placement, split, channels,
  pipeline when registered): output_ok and their figure, a stand-in for two GPUs.

    python -m bench.partitions --models resnet18,vgg16       # GPU machine (Ray needed)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autohet.context import RunContext
from autohet.core.models import ModelSpec, input_shape
from autohet.core.objectives import RunMode
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec
from autohet.executors.green import equal_share
from autohet.platform.ray_cluster import init_ray
from autohet.pool import LocalPool, PoolSpec, RayPool, StandaloneCache
from autohet.strategies import STRATEGIES
from autohet.strategy_run import run_strategy
from bench._common import emit


def pool_spec(sms: list[int] | None, batch: int, cpu: bool) -> PoolSpec:
    gpus = ([ExecutorSpec(f"gpu0p{k}", "gpu", (k,), 0, batch=batch, precision="fp16", channels_last=True, sms=n)
             for k, n in enumerate(sms)] if sms else
            [ExecutorSpec("gpu0", "gpu", (0,), 0, batch=batch, precision="fp16", channels_last=True)])
    cpus = [ExecutorSpec("cpu0", "cpu", tuple(range(4, 12)), batch=16)] if cpu else []
    return PoolSpec("partitions" if sms else "whole", gpus + cpus)


def measure(model: str, images: int, batch: int, cpu: bool, seconds: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    half = equal_share(0, 2)  # 64 of an H100's 132: the driver's alignment
    workload = Workload.from_spec(WorkloadSpec(images, input_shape(model)))
    cache = StandaloneCache()
    for label, sms, strategies in (("whole GPU", None, ["single"]),
                                   (f"2 x {half} SMs", [half, half], ["single", "fast_split"])):
        spec = pool_spec(sms, batch, cpu)
        pool = RayPool(spec)
        try:
            ctx = RunContext(ModelSpec(model), workload, check_images=16, standalone_seconds=seconds,
                             standalone_provider=lambda p, share, used: cache.measure(p, seconds, share, used=used))
            pool.start(ctx.model, workload)
            standalone = ctx.standalone(pool)
            for strategy in strategies:
                params = {"unit": "batches", "w_s": 2, "r": 0.8, "threshold": 1} if strategy == "fast_split" else {}
                m = run_strategy(strategy, params, pool, ctx)
                rows.append({"model": model, "pool": label, "strategy": strategy, "output_ok": m.output_ok,
                             "throughput_ips": m.throughput_ips, "limit_ips": m.limit_ips,
                             "efficiency": m.efficiency, "standalone": [round(s) for s in standalone],
                             "standalone_sum": sum(standalone[: len(sms or [0])])})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            pool.shutdown()
    return rows


def in_process(model: str, half: int) -> list[dict[str, Any]]:
    """The engine strategies over two partitions as two devices."""
    rows = []
    spec = PoolSpec("parts", [ExecutorSpec(f"gpu0p{k}", "gpu", (k,), 0, precision="fp16", sms=half) for k in range(2)])
    for strategy in [s for s in ("placement", "split", "channels", "pipeline") if s in STRATEGIES]:
        from autohet.strategies import get_strategy

        for mode in get_strategy(strategy).modes:
            workload = Workload.from_spec(WorkloadSpec(RunMode(mode).pick(32, 512), input_shape(model)))
            ctx = RunContext(ModelSpec(model), workload, check_images=16, mode=mode, latency_runs=20)
            try:
                m = run_strategy(strategy, {"devices": [0, 1]}, LocalPool(spec), ctx)
                row = {"model": model, "pool": "2 partitions (engine)", "strategy": f"{strategy}/{mode}",
                       "output_ok": m.output_ok, "throughput_ips": m.throughput_ips,
                       "latency_p50_ms": m.latency_ms.get("p50"), "efficiency": m.efficiency}
            except Exception as exc:  # reported, the next strategy still runs
                row = {"model": model, "strategy": f"{strategy}/{mode}", "error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18,vgg16")
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--with-cpu", action="store_true")
    parser.add_argument("--engine", action="store_true", help="also the in-process strategies on two partitions")
    parser.add_argument("--out")
    args = parser.parse_args()
    init_ray()
    rows = []
    for model in args.models.split(","):
        rows += measure(model, args.images, args.batch, args.with_cpu, args.seconds)
        if args.engine:
            rows += in_process(model, equal_share(0, 2))
    emit("partitions", rows, ["model", "pool", "strategy", "output_ok", "throughput_ips", "limit_ips", "efficiency",
                              "standalone_sum", "latency_p50_ms"], args.out)
    if args.out:
        Path(args.out).with_suffix(".rows.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
