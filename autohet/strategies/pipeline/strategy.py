"""Pipelining (seed 002, PipeEdge): consecutive blocks form stages on different devices and frames
stream through, so stage k of frame n runs beside stage k+1 of frame n-1. For throughput.

The model's blocks (``autohet.partition`` at the micro-batch ``batch``) are cut into contiguous
stages, one device each (a CPU group with its own threads, a GPU, a GPU partition: the executors'
specs give cores, precision and layout). With ``start=greedy`` the cut and each stage's device come
from measurement: every block timed on every device at the micro-batch and every link timed, then a
dynamic program over contiguous stages and device orders minimises the slowest device's work per
frame, moves included (``autohet.planners.stages``). With ``start=given`` the ``cuts`` and ``stages``
vectors are run as given, so a tuner can search cuts the planner would not pick.

On one node the stages are devices of the in-process engine and up to ``depth`` frames are in
flight (``FrameStream``). When the chosen executors sit on different Ray nodes, each stage runs in
a Ray actor on its node and frames pass through the object store (``pipeline._ray``).

The limit is the pipeline's bound: the throughput of its slowest stage measured alone on its
device (with the moves it carries); efficiency = measured / bound. The whole model on each chosen
device at the same micro-batch is measured in the same job (``m.extra["single_ips"]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from autohet.context import tolerance_for
from autohet.core.errors import UserError
from autohet.core.measurement import ExecutorReport, WorkUnit
from autohet.core.objectives import RunMode
from autohet.core.params import BoolParam, IntListParam, IntParam, Param
from autohet.strategies._driver import RAISE_MARGIN
from autohet.strategies._inprocess import DEVICES
from autohet.strategies.base import EngineStrategy, start_param
from autohet.strategies.pipeline._plan import check_plan_params, default_depth

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.core.measurement import Measurement
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.engine import Engine, EngineJob, EngineResult
    from autohet.executors import ExecutorSpec
    from autohet.pool import Pool, PoolSpec
    from autohet.strategies.base import ServedBuild

__all__ = ["PipelineStrategy", "default_batch", "spans_nodes"]


def default_batch(specs: list[ExecutorSpec], images: int) -> int:
    """The chosen executors' smallest batch, but small enough for four frames per possible stage
    (a pipeline of one frame has nothing to overlap)."""
    return max(1, min(min(s.batch for s in specs), images // (4 * len(specs))))


def spans_nodes(specs: list[ExecutorSpec]) -> bool:
    """Whether the executors name more than one Ray node (then one actor per stage, on its node)."""
    return len({s.node for s in specs if s.node is not None}) > 1


class PipelineStrategy(EngineStrategy):
    name = "pipeline"
    family = "pipeline"
    modes = (RunMode.THROUGHPUT,)
    params: ClassVar[dict[str, Param]] = {
        "start": start_param("greedy: the planner's stages from measured block and link times; given: "
                             "cuts and stages as set"),
        "cuts": IntListParam("cuts", None, low=0, high=1023,
                             help="with start=given: block index where each next stage starts (0, repeats and "
                                  "indices past the last block mean no cut)"),
        "stages": IntListParam("stages", None, low=0, high=1023,
                               help="with start=given: one index into devices per stage (default 0, 1, ...)"),
        "batch": IntParam("batch", None, low=1, high=4096,
                          help="images per frame (default: the chosen executors' smallest batch, at most "
                               "images / (4 x devices))"),
        "depth": IntParam("depth", None, low=1, high=64, help="frames in flight (default: 2 x stages + 2)"),
        "graphs": BoolParam("graphs", True, help="run GPU stages as CUDA graphs (captured once per stage)"),
        "runs": IntParam("runs", 3, low=1, high=100, help="timed frames per block and per stage measurement"),
        "devices": DEVICES,
    }

    def vector_sizes(self, model: ModelSpec, spec: PoolSpec, devices: int) -> dict[str, int]:
        """``blocks`` (the partition's length) and ``cut_points`` (one fewer than the devices): the
        ``cuts`` vector; ``stages`` is sized by ``devices``."""
        from autohet.partition import partition

        return {"blocks": len(partition(model.name, batch=1, seed=model.seed).blocks), "cut_points": devices - 1}

    def check_devices(self, params: dict[str, Any], devices: list[str]) -> None:
        check_plan_params(params, devices)

    def served(self, pool: Pool, specs: list[ExecutorSpec], model: ModelSpec, params: dict[str, Any],
               mode: RunMode, sample: Workload) -> tuple[ServedBuild, int]:
        """Frames of ``batch`` streamed through the stages, ``depth`` in flight, on an engine of this
        process; the stages given, or planned once here (greedy)."""
        from autohet.strategies.pipeline._job import PipelineJob

        if pool.on_ray and spans_nodes(specs):
            raise UserError("pipeline: a config whose stages span Ray nodes cannot be served yet; serve one "
                            "node's executors (devices) or tune on one node")
        params = {**params, "batch": params["batch"] or min(s.batch for s in specs)}
        job = PipelineJob(model, sample, [s.name for s in specs], params)

        def build(engine: Engine) -> tuple[Any, int, dict[str, Any]]:
            staged = job.stages(engine)
            return (staged.program, params["depth"] or default_depth(len(staged.plan.stages)),
                    {"cuts": staged.plan.cuts, "stages": staged.plan.order, "planned": params["start"] != "given"})

        return build, params["batch"]

    def plan_params(self, params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """The cut, stage devices, frame size and depth the run streamed."""
        if "cuts" not in extra:
            return {}
        return {"start": "given", "cuts": [int(c) for c in extra["cuts"]], "stages": [int(d) for d in extra["order"]],
                "batch": int(extra["batch"]), "depth": int(extra["depth"])}

    def run_params(self, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any]) -> dict[str, Any]:
        """``batch`` defaulted for this workload (``default_batch``)."""
        return {**params, "batch": params["batch"] or default_batch(specs, ctx.workload.images)}

    def make_job(self, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any]) -> EngineJob:
        from autohet.strategies.pipeline._job import PipelineJob

        return PipelineJob(ctx.model, ctx.workload, [s.name for s in specs], params)

    def execute(self, pool: Pool, ctx: RunContext, specs: list[ExecutorSpec], job: EngineJob) -> EngineResult:
        """On the engine, or one Ray actor per stage when the executors span Ray nodes."""
        if pool.on_ray and spans_nodes(specs):
            from autohet.strategies.pipeline._ray import run_on_nodes

            return run_on_nodes(specs, ctx.model, ctx.workload, job.params)  # type: ignore[attr-defined]
        return super().execute(pool, ctx, specs, job)

    def measurement(self, pool: Pool, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any],
                    out: EngineResult) -> Measurement:
        assert out.wall_s is not None and out.bound_ips is not None
        wall, timeline = out.wall_s, [WorkUnit(**unit) for unit in out.timeline]
        used = set(out.devices_used)
        params = {**params, **out.ran}  # the depth, and a given run's cut: what the exported config names
        frame_ms = out.frame_ms
        # summed from the frames' timeline where one came back; on Ray nodes, estimated from each stage's frame time
        busy = {s.name: sum(u.compute_s for u in timeline if u.executor == s.name) if timeline else
                frame_ms.get(s.name, 0.0) / 1e3 * out.frames for s in specs}
        reports = [ExecutorReport(s.name, s.device, ctx.workload.images if s.name in used else 0, busy[s.name],
                                  out.batch / (frame_ms[s.name] / 1e3) if frame_ms.get(s.name) else 0.0,
                                  busy_estimated=not timeline)
                   for s in specs]
        precision = tolerance_for([s.precision for s in specs if s.name in used])
        bound = out.bound_ips
        run_ips = ctx.workload.images / wall if wall > 0 else 0.0
        if run_ips > bound * RAISE_MARGIN:  # no pipeline beats its slowest stage: that stage was measured low
            out.report["limit_raised"] = {"stage_bound_ips": bound, "run_ips": run_ips}
            bound = run_ips
        m = ctx.stream_measurement(pool, self.name, params, wall, out.outputs, bound, reports, precision)
        m.timeline = timeline
        m.extra.update(out.report)
        m.extra["speedup_vs_best_single"] = m.throughput_ips / max(out.alone_ips.values())
        return m
