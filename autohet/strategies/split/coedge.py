"""CoEdge (seed 004's baseline): spatial partitioning of the image height with a halo exchange at
every spatially-local layer.

Every value of a chain is split between the devices by the same shares (``ratios``; default: in
proportion to each device's measured speed alone). Each device keeps its rows; before every
convolution or pooling it receives from the devices holding them only the halo rows it lacks
(explicit transfer steps of just those rows), then computes its own rows. Elementwise layers,
residual adds and channel concatenations need no exchange. Non-local layers run whole on ``rest``
after a gather. Against ``split`` (one join per chain, halos recomputed) it pays a sync per layer
and recomputes nothing. Same modes, checks and same-run baselines as ``split``; per-layer timings
(each device's compute and halo transfers) are in ``m.extra``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from autohet.core.params import FloatListParam, IntParam, Param
from autohet.engine import step_seconds
from autohet.strategies.split.spatial import COMMON_PARAMS, SpatialJob, SpatialStrategy, shares_of

if TYPE_CHECKING:
    from autohet.engine import Engine
    from autohet.strategies.split._chains import SpatialGraph
    from autohet.strategies.split._programs import StagePrograms

__all__ = ["CoEdgeJob", "CoEdgeStrategy"]


class CoEdgeJob(SpatialJob):
    how = "coedge"

    def plan(self, engine: Engine, graph: SpatialGraph, programs: StagePrograms,
             baselines: Callable[[], dict[str, dict[str, float]]]) -> tuple[list[tuple[float, ...]], dict[str, Any]]:
        from autohet.strategies.split._programs import coedge_groups
        from autohet.strategies.split._rows import split_rows

        given = self.params.get("ratios")  # else each device's speed alone (normalised by shares_of)
        shares = shares_of(given or [self.speeds(baselines())[d] for d in self.devices], len(self.devices))
        chosen = [shares] * len(graph.chains)
        shares_out = [round(s, 4) for s in shares]
        shares_from = "given" if given else "measured speeds"
        if not self.reports:  # served: no per-layer table
            return chosen, {"ratios": shares_out, "shares_from": shares_from}
        program, tags = programs.tagged(chosen, self.how)
        feeds = {"x": self.frame()}
        per, wall = step_seconds(engine, program, feeds, tags, self.params["runs"])
        layers = []
        for c, stage in enumerate(graph.chains):
            for g, group in enumerate(coedge_groups(stage.ops)):
                height = graph.height(group[0].name)
                layers.append({
                    "chain": c, "layer": group[0].name, "ops": len(group), "height": height,
                    "rows": {d: list(r) for d, r in zip(self.devices, split_rows(height, shares), strict=True)},
                    "compute_ms": {d: per.get(("layer", str(c), str(g), d), 0.0) * 1e3 for d in self.devices},
                    "halo_ms": {d: per.get(("halo", str(c), str(g), d), 0.0) * 1e3 for d in self.devices}})
        joins = {str(c): per.get(("join", str(c)), 0.0) * 1e3 for c in range(len(graph.chains))}
        rest = {k: v * 1e3 for k, v in ((t[1], s) for t, s in per.items() if t and t[0] == "rest")}
        return chosen, {"ratios": shares_out, "shares_from": shares_from,
                        "layer_table": layers, "join_ms": joins, "rest_ms": rest, "frame_ms": wall * 1e3}


class CoEdgeStrategy(SpatialStrategy):
    name = "coedge"
    job = CoEdgeJob
    params: ClassVar[dict[str, Param]] = {
        "ratios": FloatListParam("ratios", None, low=0.0, high=1.0,
                                 help="each device's share of every layer's rows (normalised; with two devices one "
                                      "value is device 0's share); default: proportional to measured speed alone"),
        "runs": IntParam("runs", 3, low=1, high=1000, help="timed runs of the per-layer table"),
        **COMMON_PARAMS,
    }

    def check_params(self, params: dict[str, Any], devices: int) -> None:
        if params.get("ratios") is not None:
            shares_of(params["ratios"], devices)
