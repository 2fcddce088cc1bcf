"""Subgraph placement (seed 001): blocks of the model on CPU and GPU, placed by measurement, for latency.

The model is cut into blocks (``autohet.partition``); every block is timed on every device (mean of
``runs`` after warm-up); blocks are placed greedily along the critical path, then correction rounds
move a block when the measured end-to-end latency drops, stopping after ``x`` rounds without gain
(``autohet.placement``). The placed model then serves batch-1 requests, timed one by one, next to
the whole model on each device with the same backend: baselines measured in the same run.

The job runs in one process that owns the devices and the pool's CPU cores: a Ray actor when the
pool is on Ray (the pool's executors are idle meanwhile: trials never overlap), else in-process.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from autohet.errors import UserError
from autohet.params import Param
from autohet.strategies.base import Strategy

if TYPE_CHECKING:
    from autohet.measurement import Measurement
    from autohet.models import ModelSpec
    from autohet.pool import Pool
    from autohet.run import RunContext

__all__ = ["PlacementJob", "PlacementStrategy"]


def _latencies(fn: Any, images: np.ndarray, warmup: int = 3) -> tuple[list[float], np.ndarray]:
    import torch

    outs, times = [], []
    with torch.inference_mode():
        for i in range(warmup):
            fn(torch.from_numpy(images[i % len(images)][None]))
        for row in images:
            x = torch.from_numpy(row[None])
            start = time.perf_counter()
            y = fn(x)  # the placed model returns on the CPU: the time includes every transfer
            times.append(time.perf_counter() - start)
            outs.append(y.numpy())
    return times, np.concatenate(outs)


def _require_tuned(model: str, devices: list[str]) -> None:
    """Untuned TVM is 50-150x slower than PyTorch: a TVM trial needs `autohet compile` first."""
    from autohet.backends._tvm import database_tag, tune_dir, tvm_target

    for device in devices:
        _, key = tvm_target(device)
        if database_tag(tune_dir(model, key)) == "untuned":
            target = "cpu" if device == "cpu" else "cuda"
            raise UserError(f"no MetaSchedule database for {model} on {key}; run `autohet compile --model {model} "
                            f"--backend tvm --target {target} --trials N` first, or use backend torch")


class PlacementJob:
    """Plain class (a Ray actor under Ray): partition, measure, place, then time batch-1 requests."""

    def __init__(self, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))

    def run(self, model: ModelSpec, images: np.ndarray, devices: list[str], params: dict[str, Any]
            ) -> dict[str, Any]:
        from autohet.backends import PlacedModel, PlacementMeasure, measure_blocks, measure_links
        from autohet.partition import partition
        from autohet.placement import place, problem_from_graph, table_transfer

        backend = params["backend"]
        if backend == "tvm":
            _require_tuned(model.name, devices)
        graph = partition(model.name, batch=1, seed=model.seed)
        times = measure_blocks(graph, devices, backend, runs=params["runs"])
        transfer = table_transfer(measure_links(devices)) if len(devices) > 1 else None
        problem = problem_from_graph(graph, devices, times, transfer)
        result = place(problem, PlacementMeasure(graph, backend, runs=params["runs"]), x=params["x"])
        placed = PlacedModel(graph, result.assignment, backend)
        lat, outputs = _latencies(placed, images)
        baselines = {}
        for device in devices:
            whole = PlacedModel(graph, {b: device for b in graph.names}, backend)
            base, _ = _latencies(whole, images)
            baselines[f"{device}/{backend}"] = float(np.median(base)) * 1e3
        return {"times_s": lat, "outputs": outputs, "assignment": result.assignment, "greedy": result.greedy,
                "greedy_s": result.greedy_s, "placed_modelled_s": result.modelled_s, "rounds": result.rounds,
                "baselines_p50_ms": baselines, "blocks": [b.name for b in graph.blocks],
                "block_times_ms": {f"{b}@{d}": t * 1e3 for (b, d), t in times.items()}}


class PlacementStrategy(Strategy):
    name = "placement"
    family = "placement"
    objective = "latency"
    params: ClassVar[dict[str, Param]] = {
        "x": Param("x", "int", 2, 1, 20, help="correction rounds without gain before stopping"),
        "backend": Param("backend", "choice", "torch", choices=("torch", "tvm"),
                         help="block backend (tvm uses MetaSchedule databases from `autohet compile`)"),
        "runs": Param("runs", "int", 10, 1, 1000, help="timed runs per block / per assignment"),
    }

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:
        if pool.simulated:
            raise UserError("placement measures real blocks on real devices; use a pool without sim executors")

    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        from autohet.latency import latency_measurement
        from autohet.measurement import ExecutorReport
        from autohet.pool import RayPool

        self.check_pool(pool, params)
        devices = ["cpu"] + sorted({"cuda:0" for e in pool.spec.executors if e.kind == "gpu"})
        threads = sum(len(e.cores) for e in pool.spec.executors) or (os.cpu_count() or 1)
        images = np.ascontiguousarray(ctx.workload.rows(0, min(ctx.latency_runs, ctx.workload.images)))
        if isinstance(pool, RayPool):
            import ray

            # sees the GPU without claiming it: the pool's executors hold the devices but sit idle
            env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
            actor = ray.remote(PlacementJob).options(num_cpus=0, num_gpus=0, runtime_env=env).remote(threads)
            try:
                out = ray.get(actor.run.remote(ctx.model, images, devices, params))
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, UserError):
                    raise UserError(str(exc.cause)) from None  # the one-line message, not Ray's wrapper
                raise
            finally:
                ray.kill(actor)
        else:
            out = PlacementJob(threads).run(ctx.model, images, devices, params)
        times = out.pop("times_s")
        outputs = out.pop("outputs")
        report = [ExecutorReport("placed", "+".join(devices), len(times), float(sum(times)), 0.0)]
        m = latency_measurement(ctx, pool, self.name, params, times, outputs, report)
        m.extra.update(out)
        return m
