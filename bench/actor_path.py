"""Goal 1: a GPU executor driven through its Ray actor by a scheduler vs. the same model, batch and
precision run in-process with inputs already in pinned memory. Prints the ratio per model.

    python -m bench.actor_path                       # GPU machine: resnet18, vgg16, mobilenet_v2, alexnet
    python -m bench.actor_path --smoke               # CPU: lenet on one core (in-process vs actor)
"""

from __future__ import annotations

import argparse
import time

import torch

from autohet.context import RunContext
from autohet.core.models import ModelSpec, build_model, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec
from autohet.executors.gpu import DTYPES
from autohet.platform.ray_cluster import init_ray
from autohet.pool import PoolSpec, RayPool
from autohet.strategy_run import run_strategy
from bench._common import emit


def in_process_ips(model_name: str, spec: ExecutorSpec, workload: Workload, images: int) -> float:
    """A plain loop: pinned host batches -> device -> model -> pinned host outputs, one stream."""
    model = build_model(model_name)
    shape = workload.shape
    batch = spec.batch
    if spec.is_gpu:
        dev = torch.device("cuda", spec.gpu or 0)
        tf32 = spec.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
        dtype = DTYPES[spec.precision]
        fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
        model = model.to(dev, dtype).to(memory_format=fmt)
        bank = torch.from_numpy(workload.bank).to(dtype).pin_memory()
        out = torch.empty((batch, 1000 if shape[0] == 3 else 10), pin_memory=True)
        rows = bank.shape[0] - batch

        def step(i: int) -> None:
            start = (i * batch) % rows
            x = bank[start : start + batch].to(dev, non_blocking=True).contiguous(memory_format=fmt)
            out[: batch].copy_(model(x), non_blocking=True)

        sync = torch.cuda.synchronize
    else:
        torch.set_num_threads(max(1, len(spec.cores)))
        bank = torch.from_numpy(workload.bank)
        rows = bank.shape[0] - batch

        def step(i: int) -> None:
            start = (i * batch) % rows
            model(bank[start : start + batch])

        def sync() -> None:
            return None

    steps = max(1, images // batch)
    with torch.inference_mode():
        for i in range(3):
            step(i)
        sync()
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        sync()
    return steps * batch / (time.perf_counter() - t0)


def actor_ips(model: ModelSpec, spec: ExecutorSpec, workload: Workload, strategy: str,
              params: dict) -> tuple[float, float]:
    """Throughput through the actor, and its ratio to the executor's standalone figure (same run)."""
    pool = RayPool(PoolSpec("bench", [spec]))
    try:
        ctx = RunContext(model, workload, check_images=8, standalone_seconds=0.2)
        m = run_strategy(strategy, params, pool, ctx)
        assert m.output_ok, m.failures
        return m.throughput_ips, m.efficiency
    finally:
        pool.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="CPU only, lenet, small: checks the script runs")
    parser.add_argument("--models", default="resnet18,vgg16,mobilenet_v2,alexnet")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=4.0, help="target seconds per measurement")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    init_ray()
    rows = []
    if args.smoke:
        models, spec = ["lenet"], ExecutorSpec("cpu0", "cpu", (0,), batch=64)
        args.seconds = 0.5  # the script's path, not its figures
    else:
        models = args.models.split(",")
        spec = ExecutorSpec("gpu0", "gpu", (0,), 0, batch=args.batch, precision=args.precision, channels_last=True)
    for name in models:
        model = ModelSpec(name)
        shape = input_shape(name)
        probe = Workload.from_spec(WorkloadSpec(max(spec.batch * 4, 64), shape))
        rough = in_process_ips(name, spec, probe, spec.batch * 8)
        images = int(rough * args.seconds) // spec.batch * spec.batch or spec.batch
        workload = Workload.from_spec(WorkloadSpec(images, shape))
        base = in_process_ips(name, spec, workload, images)
        unit = spec.batch * 8
        single, single_eff = actor_ips(model, spec, workload, "single", {})
        fifo, _ = actor_ips(model, spec, workload, "fifo", {"c": unit})
        rows.append({"model": name, "precision": spec.precision, "batch": spec.batch, "images": images,
                     "in_process_ips": base, "actor_single_ips": single, f"actor_fifo{unit}_ips": fifo,
                     "ratio_single": single / base, "ratio_fifo": fifo / base,
                     "single_vs_standalone": single_eff})
        print(rows[-1], flush=True)
    unit_col = f"actor_fifo{spec.batch * 8}_ips"
    emit("actor path vs in-process", rows, ["model", "precision", "batch", "images", "in_process_ips",
                                             "actor_single_ips", unit_col, "ratio_single", "ratio_fifo",
                                             "single_vs_standalone"], args.out)


if __name__ == "__main__":
    main()
