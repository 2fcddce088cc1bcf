"""The pipeline on one node: every stage a device of one in-process engine, frames streamed through
the program so each device's worker runs its stage of successive frames (``FrameStream``).

Measured in the job, in this order: each block on each device at the micro-batch and the links
(greedy start only: the planner's inputs); each stage alone on its device with its queue kept full,
its moves in and out included (the bound); the pipelined run; the whole model on each device at
the same micro-batch (the single-device baseline).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.engine import EngineJob, EngineResult
from autohet.planners.stages import (
    StagePlan,
    StageProblem,
    boundary_bytes,
    boundary_values,
    plan_stages,
)
from autohet.platform.gc_control import Collections, settle
from autohet.strategies.pipeline._plan import (
    StagePrograms,
    default_depth,
    given_stage_plan,
    model_graph,
    stage_rows,
    value_shapes,
)

if TYPE_CHECKING:
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.engine import Engine, Program
    from autohet.partition import BlockGraph
    from autohet.planners import TransferFn

__all__ = ["PipelineJob", "Staged", "StepSpans", "measure_stage", "pipeline_result", "stage_programs",
           "steady_frame_seconds"]


class StepSpans:
    """``program`` with each compute step's calls recorded (wall-clock start and end on its worker):
    the run's timeline, one unit per frame per stage. Only on CPU-only programs, where a step's call
    is its compute; a GPU step returns once its work is queued, and timing its stream would
    synchronise it (no timeline then)."""

    def __init__(self, engine: Engine, program: Program) -> None:
        from dataclasses import replace

        from autohet.engine import Program

        self.calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.on = not any(engine[s.device].on_gpu for s in program.steps)  # the host runs no steps
        self.steps = [s for s in program.steps if s.fn is not None]
        self.program = program if not self.on else Program(
            [replace(s, fn=self._timed(s.name, s.fn)) if s.fn is not None else s for s in program.steps],
            program.inputs, program.output)

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*xs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*xs)
            self.calls[name].append((start, time.perf_counter()))
            return out
        return run

    def units(self, images: int, batch: int, warmup: int) -> list[dict[str, Any]]:
        """Work units (``autohet.core.measurement.WorkUnit`` fields) of the frames after ``warmup``: a
        worker runs its steps in frame order, so a step's k-th call is frame k."""
        if not self.on:
            return []
        timed = {s.name: self.calls[s.name][warmup:] for s in self.steps}
        starts = [c[0][0] for c in timed.values() if c]
        if not starts:
            return []
        t0 = min(starts)
        out = []
        for step in self.steps:
            for k, (begin, end) in enumerate(timed[step.name]):
                out.append({"executor": step.device, "start_image": k * batch, "size": min(batch, images - k * batch),
                            "start_s": begin - t0, "end_s": end - t0, "compute_s": end - begin})
        return sorted(out, key=lambda u: (u["start_s"], u["executor"]))


def steady_frame_seconds(stream: Callable[[int], float], min_seconds: float = 0.3, min_frames: int = 6,
                         max_frames: int = 4000) -> float:
    """Seconds per frame of a stream in its steady state: ``stream(n)`` runs ``n`` frames and returns
    its wall seconds. A warm-up pass first (first launches, the pinned staging buffers a GPU's
    copies cycle through: a few frames alone would time the allocator), then enough frames for
    ``min_seconds`` of work, at least ``min_frames``."""
    estimate = stream(3) / 3
    if estimate * 20 < min_seconds:
        estimate = stream(20) / 20
    frames = int(min(max_frames, max(min_frames, min_seconds / max(estimate, 1e-9))))
    return stream(frames) / frames


@dataclass
class Staged:
    """A pipeline built on an engine: the block graph, its programs, the plan and the program that
    runs it; ``times`` and ``links`` are what planning measured (empty for a given plan)."""

    graph: BlockGraph
    programs: StagePrograms
    plan: StagePlan
    program: Program
    times: dict[tuple[str, str], float] = field(default_factory=dict)
    links: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


class PipelineJob(EngineJob):
    """Plan (or take) the stages, measure the bound, stream the workload, measure the baselines."""

    def __init__(self, model: ModelSpec, workload: Workload, devices: list[str], params: dict[str, Any]) -> None:
        self.model, self.workload, self.devices, self.params = model, workload, devices, params

    def run(self, engine: Engine) -> EngineResult:
        """Every measurement reads pinned host frames where a GPU is in the engine (``pinned_host``), so
        the stages alone and the pipelined run move frames the same way."""
        from autohet.engine import pinned_host

        with pinned_host(self.workload.bank) as pinned:
            out = self._run(engine, pinned)
        out.report["pinned_frames"] = pinned
        return out

    def stages(self, engine: Engine) -> Staged:
        """The stages on the engine's devices: given, or planned from block and link times measured
        here (greedy); the program that streams frames through them."""
        from autohet.engine.blocks import measure_links
        from autohet.planners import table_transfer

        params, devices = self.params, self.devices
        graph = model_graph(self.model, params["batch"])
        names = graph.names
        programs = StagePrograms(engine, graph, "torch", params["graphs"])
        sizes = boundary_bytes(graph)
        times: dict[tuple[str, str], float] = {}
        links: dict[tuple[str, str], tuple[float, float]] = {}
        if params["start"] == "given":
            plan = given_stage_plan(params, names, devices, sizes)
        else:
            times = programs.block_times(devices, runs=params["runs"], warmup=1)
            links = measure_links(engine, devices)
            problem = StageProblem(names, devices, times, sizes, _in_dtype(table_transfer(links), engine),
                                   payer=lambda src, dst: _issuer(engine, src, dst))
            plan = plan_stages(problem)
        return Staged(graph, programs, plan, programs.program(plan.assignment(names)), times, links)

    def _run(self, engine: Engine, pinned: bool) -> EngineResult:
        from autohet.engine import stream_frames

        params, batch = self.params, self.params["batch"]
        staged = self.stages(engine)
        graph, plan, program, times, links = staged.graph, staged.plan, staged.program, staged.times, staged.links
        names = graph.names
        shapes = value_shapes(graph)
        depth = params["depth"] or default_depth(len(plan.stages))
        # each stage alone with as many frames in flight as the run
        measured = {k: measure_stage(engine, alone, shapes, params["runs"], depth, pinned)
                    for k, alone in enumerate(stage_programs(engine, program, plan, names, boundary_values(graph)))}
        loads: dict[str, float] = defaultdict(float)
        for k, stage in enumerate(plan.stages):
            loads[stage.device] += measured[k]["frame_s"]
        recorder = StepSpans(engine, program)
        with Collections() as collections:
            wall, outputs = stream_frames(engine, recorder.program, self.workload.rows, self.workload.images,
                                          batch, depth, warmup=2, pinned=pinned)
        timeline = recorder.units(self.workload.images, batch, warmup=2)
        singles = self._baselines(engine, pinned)
        out = pipeline_result(outputs, wall, params, plan, names, self.workload.images, measured, dict(loads), singles)
        out.timeline = timeline
        out.report.update({"gc": collections.to_dict(), "runtime": "engine",
                           "block_times_ms": {f"{b}@{d}": t * 1e3 for (b, d), t in times.items()},
                           "links": {f"{a}->{b}": {"latency_us": lat * 1e6, "gb_per_s": bw / 1e9}
                                     for (a, b), (lat, bw) in links.items()}})
        return out

    def _baselines(self, engine: Engine, pinned: bool) -> dict[str, float]:
        """The whole model on each device, frames of the same micro-batch (a CUDA graph on a GPU)."""
        import torch

        from autohet.core.models import build_model
        from autohet.engine import stream_frames, whole_model_program

        batch = self.params["batch"]
        example = torch.from_numpy(np.ascontiguousarray(self.workload.rows(0, 1))).expand(batch, -1, -1, -1)
        module = build_model(self.model)
        out = {}
        for device in self.devices:
            program = whole_model_program(engine, module, device, example.contiguous(), self.params["graphs"])
            frame_s = steady_frame_seconds(lambda n, p=program: stream_frames(
                engine, p, self.workload.rows, n * batch, batch, depth=2, warmup=0, pinned=pinned)[0])
            out[device] = batch / frame_s
        return out


def pipeline_result(outputs: np.ndarray, wall_s: float, params: dict[str, Any], plan: StagePlan, names: list[str],
                    images: int, measured: dict[int, dict[str, float]], loads: dict[str, float],
                    singles: dict[str, float]) -> EngineResult:
    """What both runtimes return: the outputs and wall seconds; each device's frame time and each device
    alone; the bound (the slowest device's frames); the depth and, where the params left them open, the
    cut and stage devices the run took; the plan and each stage's figures as reported."""
    from autohet.engine import EngineResult

    batch = params["batch"]
    depth = params["depth"] or default_depth(len(plan.stages))
    bottleneck = max(loads, key=lambda d: loads[d])
    best = max(singles, key=lambda d: singles[d])
    ran = {"depth": depth} | ({"cuts": plan.cuts, "stages": plan.order} if params["start"] == "given" else {})
    report = {"batch": batch, "depth": depth, "frames": -(-images // batch), "cuts": plan.cuts, "order": plan.order,
              "stages": stage_rows(plan, names, batch, measured), "blocks": list(names),
              "device_frame_ms": {d: t * 1e3 for d, t in loads.items()},
              "bound_ips": batch / loads[bottleneck], "bottleneck_device": bottleneck,
              "single_ips": singles, "best_single": {"device": best, "ips": singles[best]}, "start": params["start"],
              "modelled_bound_ips": plan.throughput(batch) if params["start"] != "given" else None}
    return EngineResult(outputs, wall_s=wall_s, frame_ms=dict(report["device_frame_ms"]), alone_ips=singles,
                        bound_ips=batch / loads[bottleneck], ran=ran, devices_used=[s.device for s in plan.stages],
                        batch=batch, frames=-(-images // batch), report=report)


def _issuer(engine: Engine, src: str, dst: str) -> str:
    """The device whose worker issues a move (its load carries it), as the engine decides."""
    from autohet.engine.program import transfer_worker_name

    return transfer_worker_name(engine.devices, src, dst)


def _in_dtype(transfer: TransferFn, engine: Engine) -> TransferFn:
    """Boundary bytes are fp32 figures; a value moves in its producer's dtype (half on bf16/fp16)."""
    def fn(nbytes: int, src: str, dst: str) -> float:
        return transfer(nbytes * engine[src].dtype.itemsize // 4, src, dst)
    return fn


def stage_programs(engine: Engine, program: Program, plan: StagePlan, names: list[str],
                   crossing: list[tuple[str, ...]]) -> list[Program]:
    """Each stage's step of ``program`` as a program of its own, input from the host and output to
    it. On one node that is where a CPU stage's input and output are anyway (a CPU-to-CPU move is a
    reference), and a GPU stage's copies run on its own worker in both; between two GPUs the copy
    in is timed from the host."""
    from autohet.engine import Step, with_transfers

    out = []
    for stage in plan.stages:
        segment = f"{stage.device}:{names[stage.first]}..{names[stage.end - 1]}"  # BlockPrograms' step name
        step = next(s for s in program.steps if s.name == segment)
        inputs = tuple(v.removesuffix(f"@{stage.device}") for v in step.inputs)
        alone = Step(step.name, step.device, inputs, step.outputs, step.fn)
        out.append(with_transfers([alone], inputs, crossing[stage.end][0], engine.devices))
    return out


def measure_stage(engine: Engine, program: Program, shapes: dict[str, tuple[int, ...]], runs: int,
                  depth: int = 2, pinned: bool = False) -> dict[str, float]:
    """One stage alone with its queue kept full (``depth`` frames in flight, as in the pipeline):
    ``frame_s``, the seconds per frame it cannot beat inside the pipeline (``steady_frame_seconds``),
    and medians of its compute and its moves in and out from ``runs`` frames timed step by step
    (a separate pass: timing a GPU step synchronises its stream). ``pinned``: the inputs in pinned
    memory, as the run's frames are when their bank could be pinned."""
    import torch

    from autohet.engine import HOST

    gen = torch.Generator().manual_seed(0)
    feeds = {v: torch.randn(shapes[v], generator=gen) for v in program.inputs}
    if pinned:  # as the run's frames (``pinned_host``): a GPU's move in is a DMA
        feeds = {v: t.pin_memory() for v, t in feeds.items()}

    def stream(frames: int, timings: list[Any] | None = None) -> float:
        pending: list[Any] = []  # FrameStream's loop, with step timings when asked
        start = time.perf_counter()
        for _ in range(frames):
            if len(pending) >= depth:
                engine.output(pending.pop(0))
            pending.append(engine.submit(program, feeds, timings))
        for future in pending:
            engine.output(future)
        return time.perf_counter() - start

    settle()  # as the pipelined run (``stream_frames``) does before its clock starts
    frame_s = steady_frame_seconds(stream)
    timings: list[Any] = []
    stream(max(3, runs), timings)
    by_step: dict[str, list[float]] = defaultdict(list)
    for t in timings:
        by_step[t.step].append(t.seconds)
    med = {name: statistics.median(v) for name, v in by_step.items()}
    kinds = {s.name: (s.kind, s.to) for s in program.steps}
    return {"frame_s": frame_s,
            "compute_s": sum(t for n, t in med.items() if kinds[n][0] != "transfer"),
            "in_s": sum(t for n, t in med.items() if kinds[n][0] == "transfer" and kinds[n][1] != HOST),
            "out_s": sum(t for n, t in med.items() if kinds[n][0] == "transfer" and kinds[n][1] == HOST)}
