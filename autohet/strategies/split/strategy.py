"""Intra-layer split (seed 003; muLayer, CoDL): chains of spatially-local layers split by output
rows between devices that compute at once, joined once per chain.

Each device computes its share of a chain's output rows from the input rows they need (the halo
derived backward through the chain's kernels, strides, paddings, dilations and poolings; zero
padding only at the true image border), all devices run at the same time, and the parts are
joined on the ``rest`` device at the chain's end (CoDL: a chain syncs only at its ends). Layers
that are not spatially local run whole on ``rest``. Chains are cut once they hold ``max_windows``
convolutions/poolings (``autohet.strategies.split._chains``).

The ratio per chain comes from seed 003's search (``start=greedy``, ``autohet.planners.split``):
start at ``r0``, measure the chain's sides, move ``s0`` of the rows from the slower device to the
faster until they differ by less than ``threshold``, one device alone always a candidate; or is
given (``start=given``, ``ratios``: one per chain, device 0's share, for two devices; N shares per
chain for N devices), which is what a tuner searches (``space_sizes``: ``chains``). Batch-1
requests (latency) or frames of ``batch`` (throughput, limit: the devices' standalone throughputs
summed), next to each device alone measured in the same run; per-chain timings (each device's
side, the join, the total) at the chosen ratios and along the search are in ``m.extra``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from autohet.core.errors import UserError
from autohet.core.params import FloatListParam, FloatParam, IntParam, Param
from autohet.engine import step_seconds
from autohet.strategies.base import start_param
from autohet.strategies.split.spatial import COMMON_PARAMS, SpatialJob, SpatialStrategy, shares_of

if TYPE_CHECKING:
    from autohet.core.models import ModelSpec
    from autohet.engine import Engine
    from autohet.planners.split import ChainCost
    from autohet.pool import PoolSpec
    from autohet.strategies.split._chains import SpatialGraph
    from autohet.strategies.split._programs import StagePrograms

__all__ = ["DEFAULT_MAX_WINDOWS", "SplitJob", "SplitStrategy", "given_shares"]

DEFAULT_MAX_WINDOWS = 4


def given_shares(ratios: list[float] | None, chains: int, devices: int) -> list[tuple[float, ...]]:
    """Per chain, one share per device from ``ratios``: two devices take one ratio per chain (device
    0's share), N devices N weights per chain; one chain's worth applies to every chain."""
    if devices == 1:
        return [(1.0,)] * chains
    if not ratios:
        raise UserError("split: start=given needs ratios (one per chain: device 0's share of its rows)")
    width = 1 if devices == 2 else devices
    if len(ratios) == width:
        return [shares_of(ratios, devices)] * chains
    if len(ratios) != chains * width:
        raise UserError(f"split: ratios has {len(ratios)} values; this model has {chains} chains on {devices} devices, "
                        f"so give {chains * width} ({'one per chain' if width == 1 else f'{devices} per chain'}) "
                        f"or {width} for every chain")
    return [shares_of(ratios[c * width:(c + 1) * width], devices) for c in range(chains)]


def _ratios(shares: list[tuple[float, ...]], devices: int) -> list[Any]:
    """Per chain, device 0's share (two devices) or every device's: the report's ``ratios``."""
    return [s[0] for s in shares] if devices == 2 else [list(s) for s in shares]


class SplitJob(SpatialJob):
    how = "split"

    def plan(self, engine: Engine, graph: SpatialGraph, programs: StagePrograms,
             baselines: Callable[[], dict[str, dict[str, float]]]) -> tuple[list[tuple[float, ...]], dict[str, Any]]:
        from autohet.planners.split import ChainCost, balance
        from autohet.strategies.split._rows import split_rows
        from autohet.strategies.split._slabs import DeviceModel, capture

        params, n = self.params, len(self.devices)
        chains = graph.chains
        given = given_shares(params.get("ratios"), len(chains), n) if params["start"] == "given" else None
        if given is not None and not self.reports:  # served: the given shares, no chain timed
            return given, {"ratios": _ratios(given, n), "start": "given"}
        keep = {v for c in chains for v in c.inputs}
        feeds_all = capture(graph, DeviceModel(graph, engine["host"]), self.frame(), keep)
        measured: dict[tuple, tuple[ChainCost, dict[str, Any]]] = {}

        def measure(c: int, shares: tuple[float, ...]) -> ChainCost:
            rows = tuple(tuple(split_rows(graph.height(o), shares)) for o in chains[c].outputs)
            if (c, rows) not in measured:
                program, tags = programs.chain_program(c, shares, self.how)
                feeds = {v: feeds_all[v] for v in chains[c].inputs}
                per, wall = step_seconds(engine, program, feeds, tags, params["runs"])
                sides = tuple(per.get(("side", str(c), d), 0.0) for d in self.devices)
                cost = ChainCost(sides, per.get(("join", str(c)), 0.0), wall)
                measured[(c, rows)] = (cost, {"rows": {d: list(rows[0][k]) for k, d in enumerate(self.devices)}})
            return measured[(c, rows)][0]

        def entry(c: int, shares: tuple[float, ...]) -> dict[str, Any]:
            cost = measure(c, shares)
            rows = tuple(tuple(split_rows(graph.height(o), shares)) for o in chains[c].outputs)
            return {"shares": [round(s, 4) for s in shares], **measured[(c, rows)][1],
                    "side_ms": {d: cost.sides[k] * 1e3 for k, d in enumerate(self.devices)},
                    "join_ms": cost.join * 1e3, "total_ms": cost.span * 1e3}

        chosen, table = [], []
        for c, stage in enumerate(chains):
            row: dict[str, Any] = {"chain": c, "first": stage.nodes[0].name, "last": stage.nodes[-1].name,
                                   "windows": stage.windows, "height": graph.height(stage.outputs[0])}
            if given is not None:
                chosen.append(given[c])
            else:
                plan = balance(lambda s, c=c: measure(c, s), n, params["r0"], params["s0"], params["threshold"],
                               max_steps=12)
                chosen.append(plan.shares)
                programs.prune(c, plan.shares)
                row.update(balanced=plan.balanced, reason=plan.reason,
                           search=[entry(c, s) for s, _ in plan.trace])
            row.update(entry(c, chosen[-1]))
            table.append(row)
        return chosen, {"ratios": _ratios(chosen, n), "start": params["start"], "chain_table": table}


class SplitStrategy(SpatialStrategy):
    name = "split"
    job = SplitJob
    params: ClassVar[dict[str, Param]] = {
        "start": start_param("greedy: seed 003's search per chain from r0 in steps of s0; given: use ratios"),
        "ratios": FloatListParam("ratios", None, low=0.0, high=1.0,
                                 help="with start=given: device 0's share of each chain's rows (two devices), or N "
                                      "shares per chain; one chain's worth applies to every chain"),
        "r0": FloatParam("r0", 0.5, low=0.0, high=1.0, help="the search's initial share of device 0"),
        "s0": FloatParam("s0", 0.1, low=0.001, high=1.0, help="the search's step (halved when a step overshoots)"),
        "threshold": FloatParam("threshold", 0.05, low=0.0, high=1.0,
                                help="stop when the devices' times differ by less than this share of the slower"),
        "max_windows": IntParam("max_windows", DEFAULT_MAX_WINDOWS, low=0, high=1000,
                                help="cut a chain once it holds this many convolutions/poolings, where one tensor "
                                     "crosses (0: chains end only at non-local layers)"),
        "runs": IntParam("runs", 3, low=1, high=1000, help="timed runs per chain and ratio measured"),
        **COMMON_PARAMS,
    }

    def check_params(self, params: dict[str, Any], devices: int) -> None:
        if params.get("start") != "given" and params.get("ratios") is not None:
            raise UserError("split: ratios are only used with start=given; add --set start=given")
        if params.get("start") == "given" and params.get("ratios") is None and devices > 1:
            raise UserError("split: start=given needs ratios (one per chain: device 0's share of its rows)")

    def vector_sizes(self, model: ModelSpec, spec: PoolSpec, devices: int) -> dict[str, int]:
        """``chains``: the ratio vector's length for the default devices (one per chain for two
        devices, N per chain for N) at the default ``max_windows``."""
        import torch

        from autohet.core.models import build_model, input_shape
        from autohet.strategies.split._chains import spatial_graph

        shape = input_shape(model.name)
        graph = spatial_graph(build_model(model), torch.zeros((1, *shape)), DEFAULT_MAX_WINDOWS)
        return {"chains": len(graph.chains) * (1 if devices == 2 else devices)}
