"""The pipeline across Ray nodes: one actor per stage, placed on its executor's node, frames passed
through the object store (each frame's tensor put once per hop: a stage's return value is the next
stage's argument, fetched by the next node straight from the node that made it).

Measured as on one node: each block on each actor's device at the micro-batch and each hop (the
driver and every actor to every actor, two sizes: latency and bandwidth, a task's own overhead
included since every frame pays it) feed the same planner; each stage is then fed back to back
with inputs already on the previous stage's node (its own queue kept full: the bound); the
pipelined run; the whole model on each actor's device (the single-device baseline).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.core.errors import UserError
from autohet.engine import EngineResult, fit_link
from autohet.planners.stages import StageProblem, boundary_bytes, boundary_values, plan_stages
from autohet.platform.gc_control import settle
from autohet.strategies.pipeline._plan import (
    StagePrograms,
    default_depth,
    given_stage_plan,
    model_graph,
    sub_graph,
    value_shapes,
)

if TYPE_CHECKING:
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.executors import ExecutorSpec

__all__ = ["StageActor", "run_on_nodes"]

HOP_SIZES = (4096, 4 << 20)


class StageActor:
    """Plain class (``ray.remote`` at use): one executor's device on its node (cores, threads,
    precision, layout from its spec), the model's blocks at the micro-batch, one stage of them."""

    def __init__(self, spec: ExecutorSpec, model: ModelSpec, batch: int, graphs: bool) -> None:
        from autohet.engine import build_engine

        self.spec, self.model, self.batch, self.graphs = spec, model, batch, graphs
        self.engine = build_engine([spec])
        self.graph = model_graph(model, batch)
        self.programs = StagePrograms(self.engine, self.graph, "torch", graphs)
        self.stage: Any = None
        self.compute_s: list[float] = []

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def block_times(self, runs: int) -> dict[str, float]:
        times = self.programs.block_times([self.spec.name], runs=runs, warmup=1)
        return {block: t for (block, _), t in times.items()}

    def make(self, nbytes: int) -> np.ndarray:
        """An object of ``nbytes`` made on this node (a hop's source)."""
        return np.ones(max(1, nbytes // 4), dtype=np.float32)

    def touch(self, x: np.ndarray) -> int:
        """Receives an object (a hop's destination)."""
        return int(x.nbytes)

    def boundary_value(self, boundary: int) -> np.ndarray:
        """A random value of the shape crossing ``boundary``, made on this node (a stage's input)."""
        value = boundary_values(self.graph)[boundary][0]
        rng = np.random.default_rng(boundary)
        return rng.standard_normal(value_shapes(self.graph)[value], dtype=np.float32)

    def set_stage(self, first: int, end: int) -> str:
        """Blocks ``first..end-1`` become this actor's stage (one program on its device)."""
        graph = sub_graph(self.graph, first, end)
        programs = StagePrograms(self.engine, graph, "torch", self.graphs)
        program = programs.program(dict.fromkeys(graph.names, self.spec.name))
        self.stage = (program, graph.input_name)
        settle()  # the frames of the run and of the bound meet a settled collector in this process
        return graph.input_name

    def run(self, x: np.ndarray) -> np.ndarray:
        """One frame through this stage: host memory in, host memory (fp32) out."""
        import torch

        program, name = self.stage
        start = time.perf_counter()
        out = self.engine.run(program, {name: torch.from_numpy(np.require(x, requirements="W"))})
        self.compute_s.append(time.perf_counter() - start)
        return out.float().numpy()

    def stage_compute(self) -> list[float]:
        """Seconds of each frame's stage run so far (from input in memory to output in memory)."""
        out, self.compute_s = self.compute_s, []
        return out

    def whole_model_ips(self, workload: Workload) -> float:
        """The whole model on this actor's device, frames of the micro-batch (the baseline)."""
        import torch

        from autohet.core.models import build_model
        from autohet.engine import stream_frames, whole_model_program
        from autohet.strategies.pipeline._job import steady_frame_seconds

        batch = self.batch
        example = torch.from_numpy(np.ascontiguousarray(workload.rows(0, 1))).expand(batch, -1, -1, -1)
        program = whole_model_program(self.engine, build_model(self.model), self.spec.name, example.contiguous(),
                                      self.graphs)
        frame_s = steady_frame_seconds(lambda n: stream_frames(self.engine, program, workload.rows, n * batch, batch,
                                                               depth=2, warmup=0)[0])
        return batch / frame_s

    def close(self) -> None:
        self.engine.close()


def _actor_options(spec: ExecutorSpec) -> dict[str, Any]:
    """On the executor's node; no Ray CPUs or GPUs claimed (the engine device pins its cores, and
    the pool's own actors may hold the Ray resources), every GPU visible as for the engine actor."""
    from autohet.pool.actors import actor_options

    opts = actor_options(spec, reserve_cpus=False)
    opts.update(num_gpus=0, runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}})
    return opts


def _hop_seconds(src: Any, dst: Any, nbytes: int, runs: int) -> float:
    """Median seconds for ``dst`` (an actor, or None: the driver) to receive an object of ``nbytes``
    made by ``src`` (an actor, or None: put by the driver); each run moves a fresh object."""
    import ray

    if src is None:
        refs = [ray.put(np.ones(max(1, nbytes // 4), dtype=np.float32)) for _ in range(runs + 1)]
    else:
        refs = [src.make.remote(nbytes) for _ in range(runs + 1)]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
    seconds = []
    for ref in refs:  # the first warms the connection up
        start = time.perf_counter()
        ray.get(ref if dst is None else dst.touch.remote(ref))
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds[1:]))


def measure_hops(actors: dict[str, Any], runs: int = 3) -> dict[tuple[str, str], tuple[float, float]]:
    """(latency s, bytes/s) of every hop between the driver (``host``) and the actors."""
    ends: dict[str, Any] = {"host": None, **actors}
    out = {}
    for a, src in ends.items():
        for b, dst in ends.items():
            if a != b:
                out[(a, b)] = fit_link(HOP_SIZES, [_hop_seconds(src, dst, n, runs) for n in HOP_SIZES])
    return out


def _stage_frame(actor: Any, prev: Any, boundary: int, frames: int, last: bool, batch_input: np.ndarray
                 ) -> float:
    """Seconds per frame of one stage fed back to back with fresh inputs already on the previous
    stage's node (the driver's for the first stage); the last stage's outputs reach the driver."""
    import ray

    def inputs(n: int) -> list[Any]:
        if prev is None:
            return [ray.put(batch_input.copy()) for _ in range(n)]
        refs = [prev.boundary_value.remote(boundary) for _ in range(n)]
        ray.wait(refs, num_returns=n, fetch_local=False)
        return refs

    ray.get(actor.run.remote(inputs(1)[0]))  # warm-up
    ready = inputs(frames)
    settle()
    start = time.perf_counter()
    outs = [actor.run.remote(r) for r in ready]
    ray.wait(outs, num_returns=len(outs), fetch_local=last)
    if last:
        ray.get(outs)
    return (time.perf_counter() - start) / frames


def _stream(stages: list[Any], workload: Workload, images: int, batch: int, depth: int, warmup: int = 2
            ) -> tuple[float, np.ndarray]:
    """``stream_frames`` through the chain of stage actors: a frame is put once, each stage's output
    is the next stage's argument, at most ``depth`` frames in flight."""
    import ray

    def frame(start: int) -> tuple[np.ndarray, int]:
        n = min(batch, images - start)
        x = np.ascontiguousarray(workload.rows(start, n), dtype=np.float32)
        if n < batch:
            x = np.concatenate([x, np.zeros((batch - n, *x.shape[1:]), dtype=np.float32)])
        return x, n

    def submit(x: np.ndarray) -> Any:
        ref = ray.put(x)
        for actor in stages:
            ref = actor.run.remote(ref)
        return ref

    for _ in range(warmup):
        ray.get(submit(frame(0)[0]))
    pending: deque[Any] = deque()
    outs, sizes = [], []
    settle()
    start = time.perf_counter()
    for offset in range(0, images, batch):
        x, n = frame(offset)
        sizes.append(n)
        while len(pending) >= depth:
            outs.append(ray.get(pending.popleft()))
        pending.append(submit(x))
    outs += ray.get(list(pending))
    wall = time.perf_counter() - start
    return wall, np.concatenate([o[:n] for o, n in zip(outs, sizes, strict=True)])


def run_on_nodes(specs: list[ExecutorSpec], model: ModelSpec, workload: Workload, params: dict[str, Any]
                 ) -> EngineResult:
    """The pipeline with one Ray actor per chosen executor on its node: the engine job's result, with each
    actor's node in its report."""
    import ray

    from autohet.strategies.pipeline._job import pipeline_result

    batch, devices = params["batch"], [s.name for s in specs]
    graph = model_graph(model, batch)
    names = graph.names
    sizes = boundary_bytes(graph)
    if any(len(v) != 1 for v in boundary_values(graph)):
        raise UserError(f"{model.name}: stages across nodes need one tensor per cut (use the default partition)")
    actors = {s.name: ray.remote(StageActor).options(**_actor_options(s)).remote(s, model, batch, params["graphs"])
              for s in specs}
    try:
        nodes = dict(zip(devices, ray.get([a.node_id.remote() for a in actors.values()]), strict=True))
        times: dict[tuple[str, str], float] = {}
        hops: dict[tuple[str, str], tuple[float, float]] = {}
        if params["start"] == "given":
            plan = given_stage_plan(params, names, devices, sizes)
        else:
            measured = ray.get([a.block_times.remote(params["runs"]) for a in actors.values()])
            times = {(b, d): t for d, per in zip(devices, measured, strict=True) for b, t in per.items()}
            hops = measure_hops(actors)
            plan = plan_stages(StageProblem(names, devices, times, sizes, _table(hops)))
        chain = [actors[s.device] for s in plan.stages]
        ray.get([a.set_stage.remote(s.first, s.end) for a, s in zip(chain, plan.stages, strict=True)])
        first_input = np.ascontiguousarray(workload.rows(0, 1)).repeat(batch, axis=0)
        frames = max(8, 2 * params["runs"])
        figures: dict[int, dict[str, float]] = {}
        for k, (actor, stage) in enumerate(zip(chain, plan.stages, strict=True)):
            frame_s = _stage_frame(actor, chain[k - 1] if k else None, stage.first, frames, k == len(chain) - 1,
                                   first_input)
            compute = ray.get(actor.stage_compute.remote())
            compute_s = float(np.median(compute[1:] or compute))
            figures[k] = {"frame_s": frame_s, "compute_s": compute_s, "in_s": max(0.0, frame_s - compute_s)}
        loads: dict[str, float] = {}
        for k, stage in enumerate(plan.stages):
            loads[stage.device] = loads.get(stage.device, 0.0) + figures[k]["frame_s"]
        depth = params["depth"] or default_depth(len(plan.stages))
        wall, outputs = _stream(chain, workload, workload.images, batch, depth)
        ray.get([a.stage_compute.remote() for a in chain])
        shared = ray.put(workload)
        singles = {d: ray.get(a.whole_model_ips.remote(shared)) for d, a in actors.items()}
        out = pipeline_result(outputs, wall, params, plan, names, workload.images, figures, loads, singles)
        out.report.update({"runtime": "ray-actors", "nodes": nodes,
                           "block_times_ms": {f"{b}@{d}": t * 1e3 for (b, d), t in times.items()},
                           "links": {f"{a}->{b}": {"latency_us": lat * 1e6, "gb_per_s": bw / 1e9}
                                     for (a, b), (lat, bw) in hops.items()}})
        return out
    finally:
        for actor in actors.values():
            ray.kill(actor)


def _table(hops: dict[tuple[str, str], tuple[float, float]]) -> Any:
    from autohet.planners import table_transfer

    return table_transfer(hops)
