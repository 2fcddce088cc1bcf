"""Channel partitioning (seed 004): conv/linear layers split over devices by channels, OCP or IOP.

OCP splits one layer's output channels (each device holds its slice of the weights, gets the
input, computes its channels; the slices are concatenated before the next layer). IOP pairs
adjacent layers: the first by output channels, the second by the matching input channels, so
nothing is joined between them; the second's partial sums are added at the pair's end (bias once).
Per-channel ops (batch norm, activations, pooling, dropout) run on the slices. Pairing follows the
seed's heuristic over measured costs (``autohet.planners.pairing``): each layer timed whole on each
device, links timed on the engine, pair when IOP's modelled time beats OCP's; channel shares
proportional to the measured rates. With ``start=given`` the ``pairing`` vector (1 = pair with the
next layer) decides instead, and ``shares`` (either start) fixes the splits, so a tuner can search
both. What cannot be split (depthwise/grouped convs, residual adds, concatenations) runs whole on
``rest`` (default: the device fastest on the whole model), which also joins. Latency runs serve
batch-1 requests; throughput runs stream frames of ``batch``, the limit being the sum of each
device's own throughput on the whole model (same engine, same run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from autohet.context import tolerance_for
from autohet.core.errors import UserError
from autohet.core.measurement import ExecutorReport
from autohet.core.objectives import RunMode
from autohet.core.params import BoolParam, FloatListParam, IntListParam, IntParam, Param
from autohet.engine import EngineJob, EngineResult
from autohet.strategies._inprocess import DEVICES
from autohet.strategies.base import EngineStrategy, start_param

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.core.measurement import Measurement
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.engine import Engine
    from autohet.executors import ExecutorSpec
    from autohet.planners.pairing import PairingPlan
    from autohet.pool import Pool, PoolSpec
    from autohet.strategies.base import ServedBuild
    from autohet.strategies.channels._session import ChannelsSession

__all__ = ["ChannelsJob", "ChannelsStrategy", "check_params"]


def check_params(params: dict[str, Any], devices: list[str]) -> None:
    """What can be checked before tracing the model (lengths are checked in the job)."""
    if params.get("start", "greedy") != "given" and params.get("pairing") is not None:
        raise UserError("channels: pairing is only used with start=given; add --set start=given")
    rest = params.get("rest")
    if rest is not None and not 0 <= rest < len(devices):
        raise UserError(f"channels: rest = {rest} is not an index into the devices "
                        f"({', '.join(f'{k} {d}' for k, d in enumerate(devices))})")


class ChannelsJob(EngineJob):
    """Trace, time layers and links, plan, run the plan next to each device alone (runs where the engine is)."""

    def __init__(self, model: ModelSpec, mode: RunMode, workload: Workload, requests: int, devices: list[str],
                 params: dict[str, Any], standalone_s: float = 1.0) -> None:
        self.model, self.mode, self.workload, self.requests = model, mode, workload, requests
        self.devices, self.params, self.standalone_s = devices, params, standalone_s

    def planned(self, engine: Engine, measure: bool = True) -> tuple[ChannelsSession, PairingPlan]:
        """The session on the engine (``measure``: see ``ChannelsSession``) and the plan: the seed's
        heuristic (greedy) or the given pairing."""
        from autohet.strategies.channels._session import ChannelsSession

        params = self.params
        session = ChannelsSession(engine, self.model, self.mode, self.workload, self.requests, self.devices, params,
                                  self.standalone_s, measure)
        pairing = params["pairing"] if params["start"] == "given" else None
        if params["start"] == "given" and pairing is None:
            pairing = [0] * len(session.names)  # given without a vector: OCP everywhere
        return session, session.plan(pairing, params["shares"], params["unsplit"])

    def run(self, engine: Engine) -> EngineResult:
        session, plan = self.planned(engine)
        out = session.measure(plan)
        out.report = {"start": self.params["start"], **session.report(plan, self.params["compare"])}
        if self.params["start"] == "given" and self.params["pairing"] is None:
            out.ran = {"pairing": plan.pairing}  # the exported config names the vector that ran
        return out


class ChannelsStrategy(EngineStrategy):
    name = "channels"
    family = "channels"
    modes = (RunMode.LATENCY, RunMode.THROUGHPUT)
    params: ClassVar[dict[str, Param]] = {
        "start": start_param("greedy: the seed's pairing heuristic over measured costs; given: `pairing`"),
        "pairing": IntListParam("pairing", None, low=0, high=1,
                                help="with start=given: per partitionable layer, 1 pairs it with the next (IOP), "
                                     "0 splits it alone (OCP)"),
        "shares": FloatListParam("shares", None, low=0.0, high=1.0,
                                 help="per partitionable layer, the first device's fraction of its channels (the "
                                      "others split the rest by measured rate); or one per layer and device"),
        "unsplit": BoolParam("unsplit", False,
                             help="greedy: also weigh each layer unsplit on rest against its split (the seed's "
                                  "eta = (0, 0)); off: every layer is split, as in the seed's heuristic"),
        "rest": IntParam("rest", None, low=0, high=1023,
                         help="index into devices of the device running what is not split and joining (default: "
                              "the fastest on the whole model)"),
        "batch": IntParam("batch", 8, low=1, high=4096, help="throughput runs: images per frame"),
        "depth": IntParam("depth", 2, low=1, high=16, help="throughput runs: frames in flight"),
        "runs": IntParam("runs", 10, low=1, high=1000, help="timed runs per layer, link and unit"),
        "compare": BoolParam("compare", True, help="also measure IOP against OCP + OCP for every pairable layer "
                                                   "pair (the seed's table)"),
        "graphs": BoolParam("graphs", True, help="run GPU pieces and segments as CUDA graphs"),
        "devices": DEVICES,
    }

    def vector_sizes(self, model: ModelSpec, spec: PoolSpec, devices: int) -> dict[str, int]:
        """``layers``: the partitionable layers of the batch-1 trace; ``binary``: a pairing choice's values."""
        import torch

        from autohet.core.models import build_model, input_shape
        from autohet.strategies.channels._layers import channel_graph

        graph = channel_graph(build_model(model), torch.zeros(1, *input_shape(model.name)))
        return {"layers": len(graph.layers), "binary": 2}

    def check_devices(self, params: dict[str, Any], devices: list[str]) -> None:
        check_params(params, devices)

    def served(self, pool: Pool, specs: list[ExecutorSpec], model: ModelSpec, params: dict[str, Any],
               mode: RunMode, sample: Workload) -> tuple[ServedBuild, int]:
        """The channel-split program on an engine of this process: batch-1 requests (latency) or
        frames of ``batch``, ``depth`` in flight. A plan the params fix (start given, shares, rest) is
        built without timing anything; otherwise its costs are measured once, here."""
        devices = [s.name for s in specs]
        job = ChannelsJob(model, mode, sample, min(4, sample.images), devices, params, 0.5)

        def build(engine: Engine) -> tuple[Any, int, dict[str, Any]]:
            session, plan = job.planned(engine, measure=False)
            program = session.programs.program(plan.units, devices, session.rest)
            return (program, mode.pick(2, params["depth"]),
                    {"rest": session.rest, "pairing": plan.pairing, "planned": not session.given(params)})

        return build, mode.frame(params["batch"])

    def plan_params(self, params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """The pairing, every layer's shares on every device, and ``rest``, as the run used them."""
        if extra.get("rest") not in (extra.get("devices") or []) or extra.get("pairing") is None:
            return {}
        return {"start": "given", "pairing": [int(p) for p in extra["pairing"]],
                "shares": [float(v) for row in extra.get("shares") or [] for v in row],
                "rest": extra["devices"].index(extra["rest"])}

    def make_job(self, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any]) -> ChannelsJob:
        requests = min(ctx.latency_runs, ctx.workload.images)
        return ChannelsJob(ctx.model, ctx.mode, ctx.workload, requests, [s.name for s in specs], params,
                           ctx.standalone_seconds)

    def measurement(self, pool: Pool, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any],
                    out: EngineResult) -> Measurement:
        params = {**params, **out.ran}
        precision = tolerance_for([s.precision for s in specs])
        if out.times_s is not None:
            times = out.times_s
            report = [ExecutorReport("channels", "+".join(s.device for s in specs), len(times), float(sum(times)))]
            m = ctx.latency_measurement(pool, self.name, params, times, out.outputs, report, precision)
        else:
            assert out.wall_s is not None
            ips, busy = out.alone_ips, out.busy_s
            report = [ExecutorReport(s.name, s.device, ctx.workload.images, busy[s.name], ips[s.name],
                                     busy_estimated=True) for s in specs]  # a few timed frames, scaled
            m = ctx.stream_measurement(pool, self.name, params, out.wall_s, out.outputs, sum(ips.values()), report,
                                       precision)
        m.extra.update(out.report)
        return m
