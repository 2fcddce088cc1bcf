"""Subgraph placement (seed 001): blocks of the model on CPU and GPU, placed by measurement, for latency.

The model is cut into blocks (``autohet.partition``); every block is timed on every device (mean of
``runs`` after warm-up); blocks are placed greedily along the critical path, then correction rounds
move a block when the measured end-to-end latency drops, stopping after ``x`` rounds without gain
(``autohet.placement``). With ``start=given`` the greedy step is skipped: ``assignment`` (one device
index per block, in ``partition(model, batch=1).blocks`` order, into ``["cpu", "cuda:0"]``) is the
starting point, so a tuner can search placements greedy would never reach; ``x=0`` measures it as
given. The placed model then serves batch-1 requests, timed one by one, next to
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

__all__ = ["PlacementJob", "PlacementStrategy", "check_vector", "devices_of", "start_assignment"]


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
    from autohet.backends._tvm import tvm_target

    ready = tvm_ready(model, devices)
    for device in (d for d in devices if d not in ready):
        _, key = tvm_target(device)
        target = "cpu" if device == "cpu" else "cuda"
        raise UserError(f"no MetaSchedule database for {model} on {key}; run `autohet compile --model {model} "
                        f"--backend tvm --target {target} --trials N` first, or use backend torch")


def tvm_ready(model: str, devices: list[str]) -> list[str]:
    """Devices with a MetaSchedule database for ``model``: where TVM is worth measuring at all."""
    from autohet.backends._tvm import database_tag, tune_dir, tvm_target

    return [d for d in devices if database_tag(tune_dir(model, tvm_target(d)[1])) != "untuned"]


def devices_of(pool: Pool) -> list[str]:
    """The devices a placement vector indexes: the CPU, then ``cuda:0`` when the pool has a GPU executor."""
    return ["cpu"] + sorted({"cuda:0" for e in pool.spec.executors if e.kind == "gpu"})


def check_vector(params: dict[str, Any], devices: list[str]) -> None:
    """What can be checked without partitioning the model (the length is checked in the job)."""
    from autohet.placement import valid_indices

    vector = params.get("assignment")
    if params.get("start", "greedy") != "given":
        if vector is not None:
            raise UserError("placement: assignment is only used with start=given; add --set start=given")
        return
    if vector is None:
        if len(devices) > 1:
            raise UserError(f"placement: start=given needs assignment, one device index per block "
                            f"(valid: {valid_indices(devices)})")
        return  # one device: the only vector is all-CPU (the tuner suggests none then)
    bad = [i for i in vector if not 0 <= int(i) < len(devices)]
    if bad:
        raise UserError(f"placement: assignment has device index {bad[0]}; valid: {valid_indices(devices)}")


def start_assignment(params: dict[str, Any], blocks: list[str], devices: list[str]) -> dict[str, str] | None:
    """None for the greedy start; else the given vector decoded (all-CPU on a one-device pool without one)."""
    from autohet.placement import decode

    if params.get("start", "greedy") != "given":
        return None
    vector = params.get("assignment")
    if vector is None and len(devices) == 1:
        vector = [0] * len(blocks)
    check_vector({**params, "assignment": vector}, devices)
    return decode(list(vector), blocks, devices)


class PlacementJob:
    """Plain class (a Ray actor under Ray): partition, measure, place, then time batch-1 requests."""

    def __init__(self, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))

    def run(self, model: ModelSpec, images: np.ndarray, devices: list[str], params: dict[str, Any]
            ) -> dict[str, Any]:
        from autohet.backends import PlacedModel, PlacementMeasure, measure_blocks, measure_links
        from autohet.partition import partition
        from autohet.placement import encode, place, problem_from_graph, table_transfer

        backend = params["backend"]
        graph = partition(model.name, batch=1, seed=model.seed)
        start = start_assignment(params, graph.names, devices)  # before any timing: a bad vector fails fast
        if backend == "tvm":  # per_block measures both: an untuned TVM cell just loses to torch there
            _require_tuned(model.name, devices)
        # per_block: each (block, device) runs with whichever backend measured faster there; TVM is only
        # measured on devices with a MetaSchedule database (untuned it is 50-150x slower: minutes of timing)
        on = {k: devices for k in (("torch", "tvm") if backend == "per_block" else (backend,))}
        if backend == "per_block":
            on["tvm"] = tvm_ready(model.name, devices)
        kinds = tuple(k for k in on if on[k])
        by_kind = {k: measure_blocks(graph, on[k], k, runs=params["runs"]) for k in kinds}
        choice = {cell: min((k for k in kinds if cell in by_kind[k]), key=lambda k, c=cell: by_kind[k][c])
                  for cell in by_kind[kinds[0]]}
        times = {cell: by_kind[choice[cell]][cell] for cell in choice}
        chosen: str | dict = backend if backend != "per_block" else choice
        transfer = table_transfer(measure_links(devices)) if len(devices) > 1 else None
        problem = problem_from_graph(graph, devices, times, transfer)
        result = place(problem, PlacementMeasure(graph, chosen, runs=params["runs"]), x=params["x"], start=start)
        block_backend = {b: choice[(b, d)] for b, d in result.assignment.items()}
        placed = PlacedModel(graph, result.assignment, block_backend)
        lat, outputs = _latencies(placed, images)
        baselines = {}
        for device in devices:
            for kind in (k for k in kinds if device in on[k]):  # whole model, each device x measured backend
                whole = PlacedModel(graph, {b: device for b in graph.names}, kind)
                base, _ = _latencies(whole, images)
                baselines[f"{device}/{kind}"] = float(np.median(base)) * 1e3
        greedy = result.start == "greedy"
        return {"times_s": lat, "outputs": outputs, "assignment": result.assignment,
                "assignment_vector": encode(result.assignment, graph.names, devices), "start": result.start,
                "start_assignment": result.greedy, "start_vector": encode(result.greedy, graph.names, devices),
                "start_s": result.greedy_s,
                "greedy": result.greedy if greedy else None, "greedy_s": result.greedy_s if greedy else None,
                "placed_modelled_s": result.modelled_s, "rounds": result.rounds, "devices": devices,
                "baselines_p50_ms": baselines, "blocks": [b.name for b in graph.blocks],
                "block_backend": block_backend,
                "block_times_ms": {f"{b}@{d}/{k}": t * 1e3 for k in kinds for (b, d), t in by_kind[k].items()}}


class PlacementStrategy(Strategy):
    name = "placement"
    family = "placement"
    objective = "latency"
    params: ClassVar[dict[str, Param]] = {
        "x": Param("x", "int", 2, 0, 20, help="correction rounds without gain before stopping (0: none)"),
        "backend": Param("backend", "choice", "torch", choices=("torch", "tvm", "per_block"),
                         help="block backend; per_block: torch or tvm per (block, device), the faster measured "
                              "(tvm needs MetaSchedule databases from `autohet compile`; per_block uses "
                              "them where they exist)"),
        "runs": Param("runs", "int", 10, 1, 1000, help="timed runs per block / per assignment"),
        "start": Param("start", "choice", "greedy", choices=("greedy", "given"),
                       help="start the correction rounds from the greedy placement or from `assignment`"),
        "assignment": Param("assignment", "int_list", None,
                            help="with start=given: one device index per block (0 cpu, 1 cuda:0)"),
    }

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:
        if pool.simulated:
            raise UserError("placement measures real blocks on real devices; use a pool without sim executors")
        check_vector(params, devices_of(pool))

    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        from autohet.latency import latency_measurement
        from autohet.measurement import ExecutorReport
        from autohet.pool import RayPool

        self.check_pool(pool, params)
        devices = devices_of(pool)
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
        if params.get("start") == "given" and params.get("assignment") is None:
            params = {**params, "assignment": out["start_vector"]}  # the exported config names the vector run
        report = [ExecutorReport("placed", "+".join(devices), len(times), float(sum(times)), 0.0)]
        m = latency_measurement(ctx, pool, self.name, params, times, outputs, report)
        m.extra.update(out)
        return m
