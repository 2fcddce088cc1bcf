"""Where a pipeline loses against its bound: one model's two-stage pipeline (the model on the GPU
but its last ``--tail`` blocks, those on a CPU group), measured in one process under variants that
each remove one suspect, side by side:

- ``alone-fixed``: the GPU stage alone fed one pinned tensor over and over (how the job measures
  the bound);
- ``alone-bank``: the GPU stage alone fed the run's own frames (slices of the pinned workload bank);
- ``pipeline``: both stages, the frames of the run (what the job measures);
- ``pipeline, GPU worker pinned``: the GPU device's worker thread (and this thread) pinned to the
  feeder core, away from the CPU group's OpenMP team;
- ``pipeline, driver on its own core``: the GPU's worker on the feeder core, this thread (which
  submits the frames) on the next core, the CPU group on the rest;
- ``pipeline, depth 2D``: twice the frames in flight;
- ``pipeline, CPU stage on K cores``: the CPU group cut to ``--small-group`` cores.

Each pipelined run also records CUDA events around every GPU stage step (no synchronisation in the
run): the GPU's compute per frame and the period between frames' starts, so a slower GPU stage
(its work got slower) is told apart from a starved one (gaps between frames). Run with
``OMP_WAIT_POLICY=PASSIVE`` in the environment for the OpenMP variant.

    python -m bench.pipeline_probe --models resnet18,mobilenet_v2     # GPU machine
    python -m bench.pipeline_probe --models lenet --cpu-only           # any box (two CPU groups)
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from dataclasses import replace
from typing import Any

import torch

from autohet.engine import CpuDevice, Engine, GpuDevice, Program, pinned_host, stream_frames
from autohet.models import ModelSpec, input_shape
from autohet.planners.stages import boundary_bytes, boundary_values
from autohet.strategies.pipeline._job import measure_stage, stage_programs, steady_frame_seconds
from autohet.strategies.pipeline._plan import StagePrograms, given_stage_plan, model_graph, value_shapes
from autohet.workload import Workload, WorkloadSpec


class GpuSteps:
    """CUDA events around each GPU compute step of a program, recorded on the worker's stream."""

    def __init__(self, engine: Engine, program: Program) -> None:
        self.marks: list[tuple[Any, Any]] = []
        steps = []
        for step in program.steps:
            if step.fn is not None and engine[step.device].kind == "gpu":
                step = replace(step, fn=self._timed(step.fn))
            steps.append(step)
        self.program = Program(steps, program.inputs, program.output)

    def _timed(self, fn: Any) -> Any:
        def run(*xs: Any) -> Any:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = fn(*xs)
            end.record()
            self.marks.append((begin, end))
            return out
        return run

    def summary(self, skip: int) -> dict[str, float]:
        """Median GPU compute per frame and median period between frames' starts (ms)."""
        marks = self.marks[skip:]
        if len(marks) < 3:
            return {}
        marks[-1][1].synchronize()
        compute = [b.elapsed_time(e) for b, e in marks]
        period = [marks[k][0].elapsed_time(marks[k + 1][0]) for k in range(len(marks) - 1)]
        return {"gpu_compute_ms": statistics.median(compute), "gpu_period_ms": statistics.median(period),
                "gpu_period_mean_ms": statistics.fmean(period)}


def build(cpu_cores: tuple[int, ...], cpu_only: bool) -> Engine:
    """The whole GPU in fp16 channels_last (a CPU core in its place with ``cpu_only``) and a CPU group."""
    first: Any
    if cpu_only:
        first = CpuDevice("gpu0", (0,))
    else:
        first = GpuDevice("gpu0", 0, "fp16", True)
    return Engine([first, CpuDevice("cpu0", cpu_cores)])


def pin_here(cores: set[int]) -> None:
    os.sched_setaffinity(threading.get_native_id(), cores)


def probe(model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    spec = ModelSpec(model)
    cores = sorted(os.sched_getaffinity(0))
    feeder, rest = cores[0], tuple(cores[1:])
    workload = Workload.from_spec(WorkloadSpec(args.images, input_shape(model)))
    batch = args.batch
    graph = model_graph(spec, batch)
    names = graph.names
    cut = len(names) - args.tail
    rows: list[dict[str, Any]] = []
    variants = [("pipeline", rest, "", args.depth), ("pipeline, GPU worker pinned", rest, "shared", args.depth),
                (f"pipeline, depth {2 * args.depth}", rest, "", 2 * args.depth)]
    if len(rest) > 1:
        variants.append(("pipeline, driver on its own core", rest[1:], "own", args.depth))
    if args.small_group and args.small_group < len(rest):
        variants.append((f"pipeline, CPU stage on {args.small_group} cores", rest[: args.small_group], "",
                         args.depth))
    main_affinity = os.sched_getaffinity(0)
    for k, (label, group, pin, depth) in enumerate(variants):
        engine = build(group, args.cpu_only)
        try:
            programs = StagePrograms(engine, graph, "torch", True)
            plan = given_stage_plan({"cuts": [cut], "stages": [0, 1]}, names, ["gpu0", "cpu0"], boundary_bytes(graph))
            program = programs.program(plan.assignment(names))
            with pinned_host(workload.bank) as pinned:
                if k == 0:
                    alone = stage_programs(engine, program, plan, names, boundary_values(graph))
                    fixed = measure_stage(engine, alone[0], value_shapes(graph), 3, args.depth, pinned)
                    rows.append({"model": model, "variant": "GPU stage alone, fixed pinned feed",
                                 "frame_ms": fixed["frame_s"] * 1e3, "compute_ms": fixed["compute_s"] * 1e3,
                                 "in_ms": fixed["in_s"] * 1e3, "out_ms": fixed["out_s"] * 1e3})
                    cpu_alone = measure_stage(engine, alone[1], value_shapes(graph), 3, args.depth, pinned)
                    rows.append({"model": model, "variant": f"CPU stage alone ({len(group)} cores)",
                                 "frame_ms": cpu_alone["frame_s"] * 1e3, "compute_ms": cpu_alone["compute_s"] * 1e3})
                    timed = GpuSteps(engine, alone[0])
                    frame_s = steady_frame_seconds(lambda n, p=timed.program, e=engine: stream_frames(
                        e, p, workload.rows, n * batch, batch, args.depth, warmup=2)[0])
                    rows.append({"model": model, "variant": "GPU stage alone, the run's frames (bank)",
                                 "frame_ms": frame_s * 1e3, "pinned_bank": pinned, **timed.summary(skip=8)})
                if pin:  # the GPU's worker on the feeder core; this thread beside it or on the next core
                    engine["gpu0"].call(lambda: pin_here({feeder}))
                    pin_here({feeder} if pin == "shared" else {rest[0]})
                timed = GpuSteps(engine, program)
                images = min(workload.images, args.images)
                wall, _ = stream_frames(engine, timed.program, workload.rows, images, batch, depth, warmup=2)
                rows.append({"model": model, "variant": label, "frame_ms": wall / (images / batch) * 1e3,
                             "pinned_bank": pinned, "cpu_cores": len(group), **timed.summary(skip=8)})
        finally:
            os.sched_setaffinity(0, main_affinity)
            engine.close()
    for r in rows:
        print(f"{r['model']:14s} b{batch:<4d} {r['variant']:45s} {r['frame_ms']:8.3f} ms/frame  "
              + "  ".join(f"{k} {v:.3f}" for k, v in r.items() if k.endswith("_ms") and k != "frame_ms"
                          and isinstance(v, float)), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18")
    parser.add_argument("--batches", default="32", help="micro-batches to probe, comma-separated")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--tail", type=int, default=1, help="blocks at the end of the model on the CPU group")
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--small-group", type=int, default=2)
    parser.add_argument("--cpu-only", action="store_true", help="the first device a CPU group too (no GPU)")
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            args.batch = batch
            rows += [{**r, "batch": batch} for r in probe(model, args)]
    from bench._common import emit

    emit(f"pipeline probe (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})", rows,
         ["model", "batch", "variant", "frame_ms", "gpu_compute_ms", "gpu_period_ms", "cpu_cores"], args.out)


if __name__ == "__main__":
    main()
