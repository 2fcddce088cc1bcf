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
- ``pipeline, CPU stage on K cores``: the CPU group cut to ``--small-group`` cores;
- ``pipeline, collector unsettled``: the run without ``autohet.platform.gc_control.settle`` before its clock (as
  every run was before it): Python's collector may then walk all of the process's objects in the
  run, with the GIL held.

``--repeats N`` runs each pipelined variant N times; every run reports the collections it met.

Each pipelined run also records CUDA events around every GPU stage step (no synchronisation in the
run): the GPU's compute per frame and the period between frames' starts, so a slower GPU stage
(its work got slower) is told apart from a starved one (gaps between frames). Run with
``OMP_WAIT_POLICY=PASSIVE`` in the environment for the OpenMP variant.

    python -m bench.pipeline_probe --models resnet18,mobilenet_v2     # GPU machine
    python -m bench.pipeline_probe --models mobilenet_v2 --sms 8 --tail 3 --depth 6 --repeats 3
    python -m bench.pipeline_probe --models lenet --cpu-only           # any box (two CPU groups)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from autohet.core.models import ModelSpec, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.engine import CpuDevice, Engine, GpuDevice, Program, pinned_host, stream_frames
from autohet.planners.stages import boundary_bytes, boundary_values
from autohet.platform.gc_control import Collections, settle
from autohet.strategies.pipeline import (
    StagePrograms,
    given_stage_plan,
    measure_stage,
    model_graph,
    stage_programs,
    steady_frame_seconds,
    value_shapes,
)


class GpuSteps:
    """CUDA events around each GPU compute step of a program, recorded on the worker's stream."""

    def __init__(self, engine: Engine, program: Program) -> None:
        self.marks: list[tuple[Any, Any]] = []
        steps = []
        for step in program.steps:
            if step.fn is not None and engine[step.device].on_gpu:
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


def build(cpu_cores: tuple[int, ...], cpu_only: bool, sms: int | None = None) -> Engine:
    """The whole GPU (or a green-context partition of ``sms`` SMs) in fp16 channels_last (a CPU core
    in its place with ``cpu_only``) and a CPU group."""
    first: Any
    if cpu_only:
        first = CpuDevice("gpu0", (0,))
    else:
        from autohet.executors.green import sm_partitions

        part = sm_partitions(0, [sms])[0] if sms else None
        first = GpuDevice("gpu0", 0, "fp16", True, (lambda: part.stream) if part else None, sms)
    return Engine([first, CpuDevice("cpu0", cpu_cores)])


@contextmanager
def unsettled(on: bool) -> Iterator[None]:
    """``stream_frames`` without its ``settle()`` (and the collector unfrozen) while on."""
    import autohet.engine.runs as runs

    if not on:
        yield
        return
    gc.unfreeze()
    runs.settle = lambda: None
    try:
        yield
    finally:
        runs.settle = settle


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
    variants = [("pipeline", rest, "", args.depth), ("pipeline, collector unsettled", rest, "", args.depth),
                ("pipeline, GPU worker pinned", rest, "shared", args.depth),
                (f"pipeline, depth {2 * args.depth}", rest, "", 2 * args.depth)]
    if len(rest) > 1:
        variants.append(("pipeline, driver on its own core", rest[1:], "own", args.depth))
    if args.small_group and args.small_group < len(rest):
        variants.append((f"pipeline, CPU stage on {args.small_group} cores", rest[: args.small_group], "",
                         args.depth))
    if args.variants:
        wanted = args.variants.split(",")
        variants = [v for v in variants if any(v[0] == w if w == "pipeline" else w in v[0] for w in wanted)]
    main_affinity = os.sched_getaffinity(0)
    for k, (label, group, pin, depth) in enumerate(variants):
        engine = build(group, args.cpu_only, args.sms)
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
                images = min(workload.images, args.images)
                for repeat in range(args.repeats):
                    timed = GpuSteps(engine, program)
                    with unsettled(label.endswith("unsettled")), Collections() as collections:
                        wall, _ = stream_frames(engine, timed.program, workload.rows, images, batch, depth, warmup=2,
                                                pinned=pinned)
                    rows.append({"model": model, "variant": label, "repeat": repeat,
                                 "frame_ms": wall / (images / batch) * 1e3, "pinned_bank": pinned,
                                 "cpu_cores": len(group), **timed.summary(skip=8),
                                 "gen2_collections": collections.count[2], "gc_ms": sum(collections.ms)})
        finally:
            os.sched_setaffinity(0, main_affinity)
            engine.close()
    gc.unfreeze()
    start = time.perf_counter()
    gc.collect()
    rows.append({"model": model, "variant": f"a full collection in this process ({len(gc.get_objects())} objects)",
                 "frame_ms": (time.perf_counter() - start) * 1e3})
    settle()
    for r in rows:
        print(f"{r['model']:14s} b{batch:<4d} {r['variant']:45s} {r['frame_ms']:8.3f} ms/frame  "
              + "  ".join(f"{k} {v:.3f}" for k, v in r.items() if k.endswith("_ms") and k != "frame_ms"
                          and isinstance(v, float)), flush=True)
    return rows


def thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's threads: id -> (name, user + system CPU seconds so far), from /proc."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    named = {t.native_id: t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = named.get(int(tid), "native")  # a Python thread's name; OpenMP's and the driver's are native
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def run_pool_first(model: str, args: argparse.Namespace) -> None:
    """What bench.pipeline runs before its pipeline row: an in-process pool of a GPU (or partition)
    fed by core 0 and a CPU group of the other cores, its standalone figures and two runs."""
    from autohet.context import RunContext
    from autohet.pool import LocalPool, PoolSpec
    from autohet.strategy_run import run_strategy
    from bench.pipeline import machine_specs

    ns = argparse.Namespace(smoke=False, gpu_batch=64, precision="fp16", cpu_batch=8)
    pool = LocalPool(PoolSpec("probe", machine_specs(ns, args.sms)))
    try:
        workload = Workload.from_spec(WorkloadSpec(2048, input_shape(model)))
        pool.start(ModelSpec(model), workload)
        print("pool standalone img/s:", [round(v, 1) for v in pool.standalone_ips(0.5)], flush=True)
        ctx = RunContext(ModelSpec(model), workload, check_images=16, standalone_seconds=0.3)
        for strategy, params in [("single", {"executor": 0}), ("fast_split", {"w_s": 1, "r": 0.5, "threshold": 1,
                                                                               "unit": "batches"})]:
            m = run_strategy(strategy, params, pool, ctx)
            print(f"pool {strategy}: {m.throughput_ips:.1f} img/s", flush=True)
    finally:
        pool.shutdown()


def cpu_trace(model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The CPU stage alone (the model's last ``--tail`` blocks on the CPU group), frame by frame, three
    ways in turn and the first again: called directly on the device's worker thread (no engine), one
    engine frame at a time, the engine with ``--depth`` frames in flight. Each: median, 10th and 90th
    percentile ms per frame, and the medians of its first and last tenth (a drift over the run)."""
    import numpy as np

    spec = ModelSpec(model)
    cores = tuple(sorted(os.sched_getaffinity(0))[1:])
    graph = model_graph(spec, args.batch)
    names = graph.names
    engine = Engine([CpuDevice("gpu0", (0,)), CpuDevice("cpu0", cores)])
    rows: list[dict[str, Any]] = []
    try:
        programs = StagePrograms(engine, graph, "torch", True)
        plan = given_stage_plan({"cuts": [len(names) - args.tail], "stages": [0, 1]}, names, ["gpu0", "cpu0"],
                                boundary_bytes(graph))
        program = programs.program(plan.assignment(names))
        alone = stage_programs(engine, program, plan, names, boundary_values(graph))[1]
        shapes = value_shapes(graph)
        feeds = {v: torch.randn(shapes[v]) for v in alone.inputs}
        step = next(s for s in alone.steps if s.fn is not None)
        frames = args.frames

        def direct() -> list[float]:
            def loop() -> list[float]:
                out = []
                with torch.inference_mode():
                    for _ in range(frames):
                        t0 = time.perf_counter()
                        step.fn(*[feeds[v] for v in alone.inputs])
                        out.append(time.perf_counter() - t0)
                return out
            return engine["cpu0"].call(loop)

        def one_by_one() -> list[float]:
            out = []
            for _ in range(frames):
                t0 = time.perf_counter()
                engine.run(alone, feeds)
                out.append(time.perf_counter() - t0)
            return out

        def streamed() -> list[float]:
            pending, done = [], []
            for _ in range(frames):
                if len(pending) >= args.depth:
                    engine.output(pending.pop(0))
                    done.append(time.perf_counter())
                pending.append(engine.submit(alone, feeds))
            for f in pending:
                engine.output(f)
                done.append(time.perf_counter())
            return list(np.diff(done))

        direct()  # warm-up
        if args.after_pool:  # the data-parallel rows of bench.pipeline ran in this process first
            before_pool = thread_cpu()
            run_pool_first(model, args)
            busy = {k: v[1] - before_pool.get(k, (v[0], 0.0))[1] for k, v in thread_cpu().items()}
            print("threads after the pool:", len(busy), flush=True)
        for label, fn in [("direct on the worker", direct), ("engine, one frame at a time", one_by_one),
                          (f"engine, depth {args.depth}", streamed), ("direct on the worker, again", direct)]:
            settle()
            seen = thread_cpu()
            ms = np.array(fn()) * 1e3
            now = thread_cpu()
            used = sorted(((v[1] - seen.get(k, (v[0], 0.0))[1], v[0], k) for k, v in now.items()), reverse=True)
            print(f"  {label}: CPU s by thread ({len(now)} threads): "
                  + ", ".join(f"{name}/{tid} {sec:.2f}" for sec, name, tid in used[:24] if sec > 0.005), flush=True)
            tenth = max(1, len(ms) // 10)
            rows.append({"model": model, "variant": f"CPU stage ({args.tail} blocks, {len(cores)} cores): {label}",
                         "frame_ms": float(np.median(ms)), "p10_ms": float(np.percentile(ms, 10)),
                         "p90_ms": float(np.percentile(ms, 90)), "first_ms": float(np.median(ms[:tenth])),
                         "last_ms": float(np.median(ms[-tenth:]))})
            print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else str(v) for k, v in rows[-1].items()),
                  flush=True)
    finally:
        engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18")
    parser.add_argument("--batches", default="32", help="micro-batches to probe, comma-separated")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--tail", type=int, default=1, help="blocks at the end of the model on the CPU group")
    parser.add_argument("--sms", type=int, help="the GPU stage on a green-context partition of this many SMs")
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--small-group", type=int, default=2)
    parser.add_argument("--cpu-only", action="store_true", help="the first device a CPU group too (no GPU)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each pipelined variant")
    parser.add_argument("--cpu-trace", action="store_true", help="only the CPU stage, frame by frame (cpu_trace)")
    parser.add_argument("--frames", type=int, default=100, help="frames per --cpu-trace series")
    parser.add_argument("--after-pool", action="store_true", help="--cpu-trace after an in-process pool ran "
                        "(run_pool_first), with --sms its GPU partition")
    parser.add_argument("--variants", help="only these pipelined variants, e.g. pipeline,unsettled,depth")
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            args.batch = batch
            rows += [{**r, "batch": batch} for r in (cpu_trace if args.cpu_trace else probe)(model, args)]
    from bench._common import emit

    emit(f"pipeline probe (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})", rows,
         ["model", "batch", "variant", "frame_ms", "gpu_compute_ms", "gpu_period_ms", "cpu_cores", "gen2_collections",
          "gc_ms", "p10_ms", "p90_ms", "first_ms", "last_ms"], args.out)


if __name__ == "__main__":
    main()
