"""One model's channel-partitioning state on an engine: its trace, the devices alone on the whole
model, per-layer times, links; then any number of plans built and measured on it (the strategy runs
one, ``bench.channels`` compares several and searches without re-measuring the costs)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.core.errors import UserError
from autohet.core.objectives import RunMode

if TYPE_CHECKING:
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.engine import Engine, EngineResult
    from autohet.planners.pairing import PairingPlan

__all__ = ["ChannelsSession"]


class ChannelsSession:
    """Built on the engine's side: ``params`` are the strategy's (graphs, runs, batch, depth, rest)."""

    def __init__(self, engine: Engine, model: ModelSpec, mode: RunMode, workload: Workload, requests: int,
                 devices: list[str], params: dict[str, Any], standalone_s: float = 1.0, measure: bool = True) -> None:
        """``measure`` off (a served config): where the params fix the whole plan (``given``) nothing is
        timed; the devices alone, layers and links are measured only when the plan needs them."""
        import torch

        from autohet.core.models import build_model, input_shape
        from autohet.engine.blocks import measure_links
        from autohet.planners.pairing import LayerCost
        from autohet.strategies.channels._layers import channel_graph
        from autohet.strategies.channels._programs import ChannelPrograms

        self.engine, self.model, self.mode, self.workload = engine, model, mode, workload
        self.requests, self.devices, self.params, self.standalone_s = requests, devices, params, standalone_s
        batch = mode.frame(params["batch"])
        module = build_model(model)
        example = torch.from_numpy(np.ascontiguousarray(workload.rows(0, 1))).expand(
            batch, *input_shape(model.name)).contiguous()
        self.graph = channel_graph(module, example)
        self.names = [layer.name for layer in self.graph.layers]
        self.check_lengths(params.get("pairing"), params.get("shares"))
        self.programs = ChannelPrograms(engine, self.graph, params["graphs"])
        if not measure and self.given(params):  # a served plan: nothing left to measure
            self.baselines: dict[str, float] = {}
            self.rest = devices[params["rest"]]
            self.times = dict.fromkeys(((layer.index, d) for layer in self.graph.layers for d in devices), 0.0)
            self.links, self.hops = {}, {}
        else:
            self.baselines = self._baselines(module, example)
            pick = mode.pick(min, max)
            self.rest = devices[params["rest"]] if params.get("rest") is not None else pick(self.baselines,
                                                                                           key=self.baselines.get)
            self.times = self.programs.layer_times(devices, runs=params["runs"])
            self.links = measure_links(engine, devices) if len(devices) > 1 else {}
            self.hops = self.programs.hop_times(devices, self.rest, runs=max(30, params["runs"])) if self.links else {}
        item = torch.empty((), dtype=engine[self.rest].dtype).element_size()
        self.costs = [LayerCost(layer.name, layer.channels, {d: self.times[(layer.index, d)] for d in devices},
                                item * float(np.prod(layer.in_shape)), item * float(np.prod(layer.out_shape)),
                                item * float(np.prod(layer.raw_shape)), layer.pairs_next,
                                "host" if layer.node.all_input_nodes[0] is self.graph.placeholder else None)
                      for layer in self.graph.layers]
        self._unit_ms: dict[tuple[Any, ...], float] = {}

    def given(self, params: dict[str, Any]) -> bool:
        """Whether the params fix the plan without a measured figure: ``start: given``, ``rest`` and
        the shares of every layer on every device (with two devices, the first's fraction says it)."""
        shares = params.get("shares")
        return (params.get("start") == "given" and params.get("rest") is not None and shares is not None
                and (len(self.devices) <= 2 or len(shares) == len(self.names) * len(self.devices)))

    def check_lengths(self, pairing: list[int] | None, shares: list[float] | None) -> None:
        n, d, name = len(self.names), len(self.devices), self.model.name
        if pairing is not None and len(pairing) != n:
            raise UserError(f"channels: pairing has {len(pairing)} values; {name} has {n} partitionable layers "
                            "(one 0/1 per layer: 1 pairs it with the next)")
        if shares is not None and len(shares) not in (n, n * d):
            raise UserError(f"channels: shares has {len(shares)} values; {name} has {n} partitionable layers: "
                            f"give {n} (the first device's fraction per layer)"
                            + (f" or {n * d} (per layer and device)" if d > 1 else ""))

    # --- plans -------------------------------------------------------------------------------------

    def plan(self, pairing: list[int] | None = None, shares: list[float] | None = None,
             unsplit: bool = False) -> PairingPlan:
        """The seed's heuristic (``pairing`` None) or the given pairing, over the measured costs."""
        from autohet.planners.pairing import linear_link, plan_pairing, table_link

        self.check_lengths(pairing, shares)
        link = table_link(self.links, self.hops) if self.links else linear_link()
        try:
            return plan_pairing(self.costs, self.devices, self.rest, link, pairing, shares, unsplit)
        except ValueError as exc:
            raise UserError(f"channels: {exc}") from None

    def measure(self, plan: PairingPlan) -> EngineResult:
        """The plan's program run the way the mode is measured: batch-1 requests, or every workload
        image in frames of ``batch`` (outputs kept for the check; each device's busy seconds from a few
        timed frames, scaled); each device alone (``baselines``)."""
        from autohet.engine import EngineResult, request_latencies, stream_frames

        program = self.programs.program(plan.units, self.devices, self.rest)
        alone = {"alone_p50_ms" if self.mode.per_request else "alone_ips": dict(self.baselines)}
        if self.mode.per_request:
            times, outputs = request_latencies(self.engine, program, self._requests())
            return EngineResult(outputs, times_s=times, **alone)
        batch = self.params["batch"]
        wall, outputs = stream_frames(self.engine, program, self.workload.rows, self.workload.images, batch,
                                      self.params["depth"])
        return EngineResult(outputs, wall_s=wall, busy_s=self._busy(program, -(-self.workload.images // batch)),
                            **alone)

    def _busy(self, program: Any, frames: int, samples: int = 3) -> dict[str, float]:
        """Seconds each device works over ``frames`` frames: its steps' times (transfers it issues
        included) in a few timed frames, scaled."""
        import torch

        from autohet.engine import StepTime

        x = torch.from_numpy(np.ascontiguousarray(self.workload.rows(0, self.params["batch"])))
        timings: list[StepTime] = []
        for _ in range(samples):
            self.engine.run(program, {"x": x}, timings)
        return {d: sum(t.seconds for t in timings if t.device == d) / samples * frames for d in self.devices}

    def unit_ms(self, unit: Any) -> float:
        """A unit's measured milliseconds on the engine (cached per unit)."""
        key = (unit.kind, unit.layers, unit.counts)
        if key not in self._unit_ms:
            self._unit_ms[key] = self.programs.unit_time(unit, self.devices, self.rest, runs=self.params["runs"]) * 1e3
        return self._unit_ms[key]

    def report(self, plan: PairingPlan, compare: bool = True) -> dict[str, Any]:
        """What ``m.extra`` carries: baselines, the plan, per unit modelled vs measured ms, and per
        pairable layer pair IOP against OCP + OCP (modelled; measured with ``compare``)."""
        from autohet.planners.pairing import Unit

        names, devices = self.names, self.devices
        units = [{"kind": u.kind, "layers": [names[k] for k in u.layers],
                  "channels": dict(zip(devices, u.counts, strict=True)), "modelled_ms": u.modelled_s * 1e3,
                  "measured_ms": self.unit_ms(u)} for u in plan.units]
        kind_of = {k: (u.kind if k == u.layers[0] else "second of the pair before") for u in plan.units
                   for k in u.layers}
        pairs = []
        for c in plan.comparisons:
            row = {"first": names[c.first], "second": names[c.second], "iop_modelled_ms": c.iop_s * 1e3,
                   "ocp_modelled_ms": c.ocp_s * 1e3, "chosen": kind_of[c.first]}
            if compare:
                row["iop_measured_ms"] = self.unit_ms(Unit("iop", (c.first, c.second), c.iop_counts, c.iop_s))
                row["ocp_measured_ms"] = sum(self.unit_ms(Unit("ocp", (k,), n, 0.0))
                                             for k, n in zip((c.first, c.second), c.ocp_counts, strict=True))
            pairs.append(row)
        key = self.mode.pick("baselines_p50_ms", "baselines_ips")
        return {"devices": devices, "rest": self.rest, key: self.baselines, "layers": names,
                "pairs_next": [layer.pairs_next for layer in self.graph.layers], "pairing": plan.pairing,
                "shares": plan.shares, "units": units, "pairs": pairs, "modelled_ms": plan.modelled_s * 1e3,
                "layer_times_ms": {f"{names[i]}@{d}": t * 1e3 for (i, d), t in self.times.items()},
                "links": {f"{a}->{b}": {"latency_us": lat * 1e6, "gb_per_s": bw / 1e9,
                                        "handoff_us": self.hops.get((a, b), 0.0) * 1e6}
                          for (a, b), (lat, bw) in self.links.items()}}

    # --- baselines ---------------------------------------------------------------------------------

    def _requests(self) -> np.ndarray:
        return np.ascontiguousarray(self.workload.rows(0, self.requests))

    def _baselines(self, module: Any, example: Any) -> dict[str, float]:
        """Each device alone on the whole model (same engine, graphs, precision): p50 ms of batch-1
        requests, or images/s of frames of ``batch`` for about ``standalone_s`` seconds."""
        from autohet.engine import request_latencies, stream_frames, whole_model_program

        out = {}
        for device in self.devices:
            program = whole_model_program(self.engine, module, device, example, self.params["graphs"])
            if self.mode.per_request:
                times, _ = request_latencies(self.engine, program, self._requests())
                out[device] = float(np.median(times)) * 1e3
                continue
            batch = self.params["batch"]
            self.engine.run(program, {"x": example})
            start = time.perf_counter()
            self.engine.run(program, {"x": example})
            frame_s = max(time.perf_counter() - start, 1e-6)
            frames = int(np.clip(self.standalone_s / frame_s, 2, max(2, self.workload.images // batch)))
            wall, _ = stream_frames(self.engine, program, self.workload.rows, frames * batch, batch,
                                    self.params["depth"], warmup=1)
            out[device] = frames * batch / wall
        return out
