"""What ``split`` and ``coedge`` share: the job that runs on the engine (trace, baselines, plan,
measure, temperatures) and the strategy around it (devices, measurement, report).

One job measures everything it compares in the same run on the same engine: each device alone
with the whole model (a CUDA graph on a GPU: the single-device baselines, and in a throughput run
the limit, the sum of their standalone throughputs), then the model split by rows at the planned
or given shares, batch-1 requests (latency) or frames of ``batch`` (throughput), with the device
temperatures read around the timed run.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from autohet.context import tolerance_for
from autohet.core.errors import UserError
from autohet.core.measurement import ExecutorReport
from autohet.core.objectives import RunMode
from autohet.core.params import BoolParam, FloatParam, IntParam, Param
from autohet.engine import EngineJob
from autohet.strategies._inprocess import DEVICES
from autohet.strategies.base import EngineStrategy

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.core.measurement import Measurement
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.engine import Engine, EngineResult, Program
    from autohet.executors import ExecutorSpec
    from autohet.pool import Pool
    from autohet.strategies.base import ServedBuild
    from autohet.strategies.split._chains import SpatialGraph
    from autohet.strategies.split._programs import StagePrograms

__all__ = ["COMMON_PARAMS", "Spatial", "SpatialJob", "SpatialStrategy", "shares_of"]

COMMON_PARAMS: dict[str, Param] = {
    "devices": DEVICES,
    "batch": IntParam("batch", None, low=1, high=4096,
                      help="images per frame in a throughput run (default: the chosen executors' smallest batch)"),
    "rest": IntParam("rest", None, low=0, high=1023,
                     help="index into devices of the device running the non-local layers and the joins (default: "
                          "the fastest whole-model baseline measured in the run)"),
    "graphs": BoolParam("graphs", True, help="run GPU steps as CUDA graphs (static shapes, captured once per step)"),
    "max_temp": FloatParam("max_temp", None, low=0.0, high=150.0,
                           help="°C: a run in which a device is measured above it is a violation (devices whose "
                                "temperature cannot be read are reported unavailable, not checked)"),
}


class SpatialJob(EngineJob):
    """Trace, baselines, plan (subclass), measure, report; runs where the engine is."""

    how: ClassVar[str] = "split"
    reports = True  # off (a served config): planning measures only what the plan needs, no tables

    def __init__(self, model: ModelSpec, mode: RunMode, images: np.ndarray | Workload, devices: list[str],
                 gpus: list[int], cpus: bool, params: dict[str, Any], seconds: float = 1.0) -> None:
        """``images``: the latency run's requests, or the throughput run's workload; ``gpus``: CUDA
        indices and ``cpus``: whether CPUs take part (temperatures); ``seconds``: each throughput
        baseline's length."""
        self.model, self.mode, self.images, self.devices = model, mode, images, devices
        self.gpus, self.cpus, self.params, self.seconds = gpus, cpus, params, seconds

    @property
    def batch(self) -> int:
        return self.mode.frame(self.params["batch"])

    def _rows(self, start: int, n: int) -> np.ndarray:
        if isinstance(self.images, np.ndarray):
            return self.images[start:start + n]
        return self.images.rows(start, n)

    def _count(self) -> int:
        return len(self.images) if isinstance(self.images, np.ndarray) else self.images.images

    def frame(self) -> Any:
        """One frame of ``batch`` images to plan on: the first images, repeated where there are fewer."""
        import torch

        count = min(self.batch, self._count())
        x = torch.from_numpy(np.ascontiguousarray(self._rows(0, count)))
        return x.repeat(-(-self.batch // count), 1, 1, 1)[:self.batch]

    def _run_program(self, engine: Engine, program: Program, images: int | None = None) -> EngineResult:
        """The program measured the run's way: batch-1 requests, or ``images`` in frames of ``batch``."""
        from autohet.engine import EngineResult, request_latencies, stream_frames

        if self.mode.per_request:
            times, outputs = request_latencies(engine, program, self._rows(0, self._count()))
            return EngineResult(outputs, times_s=times, batch=1, frames=len(times))
        n = images or self._count()
        wall, outputs = stream_frames(engine, program, self._rows, n, self.batch)
        return EngineResult(outputs, wall_s=wall, batch=self.batch, frames=-(-n // self.batch))

    def _baselines(self, engine: Engine, module: Any, example: Any) -> dict[str, dict[str, float]]:
        """The whole model alone on each device: the run's requests (latency), or frames for at least
        ``seconds`` after a probe of four frames (throughput: a steady rate, not a pipeline fill)."""
        from autohet.engine import whole_model_program

        out = {}
        for device in self.devices:
            program = whole_model_program(engine, module, device, example, self.params["graphs"])
            if self.mode.per_request:
                got = self._run_program(engine, program)
                out[device] = {"p50_ms": float(np.median(got.times_s or [])) * 1e3}
                continue
            probe = self._run_program(engine, program, 4 * self.batch)
            frames = len(probe.outputs) / (probe.wall_s or 1.0) * self.seconds / self.batch
            got = self._run_program(engine, program, self.batch * int(min(max(frames, 4), 10_000)))
            out[device] = {"ips": len(got.outputs) / (got.wall_s or 1.0)}
        return out

    @staticmethod
    def _fastest(baselines: dict[str, dict[str, float]]) -> str:
        """The device with the lowest p50 (latency) or the highest throughput alone."""
        if all("p50_ms" in b for b in baselines.values()):
            return min(baselines, key=lambda d: baselines[d]["p50_ms"])
        return max(baselines, key=lambda d: baselines[d]["ips"])

    @staticmethod
    def speeds(baselines: dict[str, dict[str, float]]) -> dict[str, float]:
        """Each device's measured speed alone (requests or images per second)."""
        return {d: (1e3 / b["p50_ms"]) if "p50_ms" in b else b["ips"] for d, b in baselines.items()}

    @abstractmethod
    def plan(self, engine: Engine, graph: SpatialGraph, programs: StagePrograms,
             baselines: Callable[[], dict[str, dict[str, float]]]) -> tuple[list[tuple[float, ...]], dict[str, Any]]:
        """Shares per chain (one per device) and what the planning measured (for the report);
        ``baselines()`` measures each device alone (once) where the plan needs their speeds."""

    def build(self, engine: Engine, measure_baselines: bool = True) -> Spatial:
        """Trace, the devices alone (``measure_baselines``; else only where ``rest`` or the plan needs
        them), ``rest``, the plan, the program."""
        import torch

        from autohet.core.models import build_model, input_shape
        from autohet.strategies.split._chains import spatial_graph
        from autohet.strategies.split._programs import StagePrograms

        params = self.params
        module = build_model(self.model)
        shape = tuple(input_shape(self.model.name))
        if tuple(self._rows(0, 1).shape[1:]) != shape:
            raise UserError(f"the workload's images are {tuple(self._rows(0, 1).shape[1:])}, the model takes {shape}")
        graph = spatial_graph(module, torch.randn((1, *shape), generator=torch.Generator().manual_seed(0)),
                              params.get("max_windows") or 0)
        example = torch.from_numpy(np.ascontiguousarray(self._rows(0, 1))).repeat(self.batch, 1, 1, 1)
        measured: dict[str, dict[str, float]] = {}

        def baselines() -> dict[str, dict[str, float]]:
            if not measured:
                measured.update(self._baselines(engine, module, example))
            return measured

        if measure_baselines:
            baselines()
        rest = self.devices[params["rest"]] if params["rest"] is not None else self._fastest(baselines())
        programs = StagePrograms(engine, graph, self.devices, rest, self.batch, params["graphs"])
        shares, planning = self.plan(engine, graph, programs, baselines)
        return Spatial(graph, example, programs.program(shares, self.how), rest, planning, measured)

    def run(self, engine: Engine) -> EngineResult:
        from autohet.platform.sensors import default_sources
        from autohet.platform.thermal import TemperatureWatch

        built = self.build(engine)
        graph, program, rest, planning, baselines = built.graph, built.program, built.rest, built.planning, \
            built.baselines
        with TemperatureWatch(default_sources(self.gpus)) as watch:
            got = self._run_program(engine, program)
        timings: list[Any] = []
        engine.run(program, {"x": built.example}, timings)  # one timed frame: who was busy how long
        busy: dict[str, float] = defaultdict(float)
        for t in timings:
            busy[t.device] += t.seconds
        if not graph.chains:
            planning["note"] = (f"no chain of spatially-local layers in the {graph.tracer}-traced model: it ran "
                                f"whole on {rest}")
        got.busy_s = {d: busy.get(d, 0.0) * got.frames for d in self.devices}  # one timed frame, scaled
        got.temperature = watch.report()
        got.alone_ips = {d: b["ips"] for d, b in baselines.items() if "ips" in b}
        got.alone_p50_ms = {d: b["p50_ms"] for d, b in baselines.items() if "p50_ms" in b}
        got.report = {**planning, "devices": self.devices, "rest": rest, "batch": self.batch, "baselines": baselines,
                      "temperature": got.temperature, "tracer": graph.tracer, "chains": len(graph.chains),
                      "stages": [s.kind for s in graph.stages], "chain_windows": [c.windows for c in graph.chains]}
        return got


@dataclass
class Spatial:
    """A row split built on an engine: the traced graph, an input frame, the program, the ``rest``
    device, what planning measured, and the devices-alone figures measured so far."""

    graph: SpatialGraph
    example: Any
    program: Program
    rest: str
    planning: dict[str, Any]
    baselines: dict[str, dict[str, float]]


class SpatialStrategy(EngineStrategy):
    """The strategy side of both row families: devices, the job, the measurement and its extras.
    A row family sets ``job`` (its ``SpatialJob``: the plan) and ``params`` (with ``COMMON_PARAMS``)."""

    family: ClassVar[str] = "split"
    modes: ClassVar[tuple[RunMode, ...]] = (RunMode.LATENCY, RunMode.THROUGHPUT)
    job: ClassVar[type[SpatialJob]]

    def check_devices(self, params: dict[str, Any], devices: list[str]) -> None:
        if params.get("rest") is not None and params["rest"] >= len(devices):
            raise UserError(f"{self.name}: rest is an index into devices (0..{len(devices) - 1}), got {params['rest']}")
        self.check_params(params, len(devices))

    def check_params(self, params: dict[str, Any], devices: int) -> None:
        """What can be checked before tracing the model (subclasses)."""

    def _job(self, specs: list[ExecutorSpec], model: ModelSpec, mode: RunMode, workload: Workload, requests: int,
             params: dict[str, Any], seconds: float) -> SpatialJob:
        """The job over the chosen executors: the first ``requests`` images as batch-1 requests
        (latency) or the whole workload in frames of ``batch`` (default: the executors' smallest)."""
        images: Any = np.ascontiguousarray(workload.rows(0, requests)) if mode.per_request else workload
        batch = params.get("batch") or min(s.batch for s in specs)
        gpus = [int(s.gpu or 0) for s in specs if s.is_gpu]
        return self.job(model, mode, images, [s.name for s in specs], gpus, any(s.is_cpu for s in specs),
                        {**params, "batch": batch}, seconds)

    def served(self, pool: Pool, specs: list[ExecutorSpec], model: ModelSpec, params: dict[str, Any],
               mode: RunMode, sample: Workload) -> tuple[ServedBuild, int]:
        """The split program on an engine of this process: batch-1 requests (latency) or frames of
        ``batch``, two in flight. Given shares and ``rest`` are used as they are; what the params leave
        open (greedy ratios, ``rest``, coedge's speed shares) is measured once, here."""
        job = self._job(specs, model, mode, sample, min(4, sample.images), params, 0.5)
        job.reports = False

        def build(engine: Engine) -> tuple[Any, int, dict[str, Any]]:
            built = job.build(engine, measure_baselines=False)
            return built.program, 2, {"rest": built.rest, "ratios": built.planning.get("ratios"),
                                      "measured_alone": sorted(built.baselines)}

        return build, job.batch

    def plan_params(self, params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """``rest`` and the shares the run used (split: per chain, with ``start: given``)."""
        if extra.get("rest") not in (extra.get("devices") or []):
            return {}
        plan: dict[str, Any] = {"rest": extra["devices"].index(extra["rest"])}
        ratios = [float(v) for r in extra.get("ratios") or [] for v in (r if isinstance(r, list) else [r])]
        if ratios:
            plan["ratios"] = ratios
            if "start" in self.params:
                plan["start"] = "given"
        return plan

    def make_job(self, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any]) -> SpatialJob:
        return self._job(specs, ctx.model, ctx.mode, ctx.workload, min(ctx.latency_runs, ctx.workload.images), params,
                         ctx.standalone_seconds)

    def measurement(self, pool: Pool, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any],
                    out: EngineResult) -> Measurement:
        from autohet.platform.thermal import temperature_violation as violation

        busy = out.busy_s
        precision = tolerance_for([s.precision for s in specs])
        if out.times_s is not None:
            reports = [ExecutorReport(s.name, s.device, len(out.times_s), busy[s.name], 0.0, busy_estimated=True)
                       for s in specs]  # busy: one timed frame, scaled (SpatialJob.run)
            m = ctx.latency_measurement(pool, self.name, params, out.times_s, out.outputs, reports, precision)
            best = min(out.alone_p50_ms, key=lambda d: out.alone_p50_ms[d])
            best_single = {"device": best, "p50_ms": out.alone_p50_ms[best]}
        else:
            assert out.wall_s is not None
            reports = [ExecutorReport(s.name, s.device, ctx.workload.images, busy[s.name], out.alone_ips[s.name],
                                      busy_estimated=True) for s in specs]
            m = ctx.stream_measurement(pool, self.name, params, out.wall_s, out.outputs, sum(out.alone_ips.values()),
                                       reports, precision)
            best = max(out.alone_ips, key=lambda d: out.alone_ips[d])
            best_single = {"device": best, "ips": out.alone_ips[best]}
        m.extra.update(out.report)
        m.extra["best_single"] = best_single
        max_temp = params.get("max_temp")
        m.extra["temperature"] = {"devices": out.temperature, "max_temp_c": max_temp,
                                  "checked": [d for d, r in out.temperature.items() if "max_c" in r]}
        broke = violation(out.temperature, max_temp)
        if broke:
            m.extra["violation"] = broke
        return m


def shares_of(value: Sequence[float], devices: int) -> tuple[float, ...]:
    """One chain's shares from a ratio (two devices: device 0's share) or one weight per device."""
    if len(value) == 1 and devices == 2:
        return (float(value[0]), 1.0 - float(value[0]))
    total = float(sum(value))
    if len(value) != devices or total <= 0:
        raise UserError(f"shares need one weight per device ({devices}) with a positive sum, got {list(value)}")
    return tuple(float(v) / total for v in value)
