"""What both pipeline runtimes share (one engine, or one Ray actor per stage across nodes): the
model's blocks at the micro-batch, block runners that honour each device's layout, the plan from
the parameters (planned or given) and the report of its stages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autohet.core.errors import UserError
from autohet.engine.blocks import BlockPrograms
from autohet.planners.stages import StagePlan, StageProblem, evaluate_stages, normalise_cuts

if TYPE_CHECKING:
    from autohet.core.models import ModelSpec
    from autohet.partition import BlockGraph

__all__ = ["StagePrograms", "check_plan_params", "default_depth", "given_plan", "given_stage_plan", "model_graph",
           "stage_rows", "sub_graph", "value_shapes"]

_GRAPHS: dict[tuple[Any, int], Any] = {}


def model_graph(model: ModelSpec, batch: int) -> BlockGraph:
    """The model's blocks traced at ``batch`` (checkpoint weights included; cached per process: the
    engine actor serves many trials, and tracing a large model takes seconds)."""
    key = (model, batch)
    if key not in _GRAPHS:
        from autohet.core.models import build_model, input_shape
        from autohet.partition import partition

        if len(_GRAPHS) >= 4:
            _GRAPHS.pop(next(iter(_GRAPHS)))
        graph = partition(build_model(model), batch=batch, seed=model.seed, input_shape=input_shape(model.name),
                          name=model.name)
        if graph.input_name != "x":  # stream_frames feeds the program's input as "x"
            raise UserError(f"{model.name}: the traced input is named {graph.input_name!r}; pipeline needs a "
                            "forward(x) model")
        _GRAPHS[key] = graph
    return _GRAPHS[key]


def sub_graph(graph: BlockGraph, first: int, end: int) -> BlockGraph:
    """Blocks ``first..end-1`` as a graph of their own: the value crossing into ``first`` is its
    input, the one crossing out after ``end - 1`` its output (a stage run by itself on one node)."""
    from autohet.partition import BlockGraph
    from autohet.planners.stages import boundary_values

    crossing = boundary_values(graph)
    ins, outs = crossing[first], crossing[end]
    if len(ins) != 1 or len(outs) != 1:
        raise UserError(f"{graph.model}: the cut before block {first} or {end} carries {len(ins)} / {len(outs)} "
                        "tensors; stages across nodes need one tensor per cut (use the default partition)")
    shapes = value_shapes(graph)
    blocks = graph.blocks[first:end]
    names = {b.name for b in blocks}
    edges = [(u if u in names else "input", v) for u, v in graph.edges if v in names]
    return BlockGraph(graph.model, graph.batch, tuple(shapes[ins[0]][1:]), ins[0], outs[0], list(blocks), edges,
                      graph.tracer)


def value_shapes(graph: BlockGraph) -> dict[str, tuple[int, ...]]:
    """Every value's shape at the graph's batch, the model input included."""
    shapes = {graph.input_name: (graph.batch, *graph.input_shape)}
    for block in graph.blocks:
        shapes.update(zip(block.outputs, block.out_shapes, strict=True))
    return shapes


# block programs; a device's layout (channels_last from the executor spec) is BlockPrograms' own, as in the
# whole-model baseline (``autohet.engine.ChannelsLast``); precision and threads come from the device
StagePrograms = BlockPrograms


def default_depth(stages: int) -> int:
    """Frames in flight when not set: two per stage and two more. With one more than the stages a
    frame's wait for the next stage showed as gaps on the GPU (docs/why.md, strategies/pipeline/_plan.py)."""
    return 2 * stages + 2


def check_plan_params(params: dict[str, Any], devices: Sequence[str]) -> None:
    """What can be checked before the model is traced: vectors only with start=given, device indices."""
    given = params.get("start", "greedy") == "given"
    for name in ("cuts", "stages"):
        if params.get(name) is not None and not given:
            raise UserError(f"pipeline: {name} is only used with start=given; add --set start=given")
    if not given:
        return
    if params.get("cuts") is None and len(devices) > 1:
        raise UserError("pipeline: start=given needs cuts (block index where each next stage starts) and stages "
                        f"(one index into devices per stage: 0..{len(devices) - 1})")
    bad = [i for i in params.get("stages") or [] if not 0 <= int(i) < len(devices)]
    if bad:
        raise UserError(f"pipeline: stages has device index {bad[0]}; valid: 0..{len(devices) - 1} "
                        f"({', '.join(devices)})")


def given_plan(params: dict[str, Any], blocks: int, devices: int) -> tuple[list[int], list[int]]:
    """(cuts, stage devices) of start=given: cuts normalised (``normalise_cuts``), as many stage
    devices as stages (a tuner's fixed-length vector may hold more), neighbours on one device merged."""
    cuts = normalise_cuts(params.get("cuts") or [], blocks)
    count = len(cuts) + 1
    stages = params.get("stages")
    if stages is None:
        if count > devices:
            raise UserError(f"pipeline: {count} stages (cuts {cuts}) on {devices} devices: give stages")
        stages = list(range(count))
    if len(stages) < count:
        raise UserError(f"pipeline: {count} stages (cuts {cuts}) need {count} stage devices, got stages "
                        f"{list(stages)}")
    order = [int(i) for i in stages[:count]]
    keep = [k for k in range(1, count) if order[k] != order[k - 1]]
    return [cuts[k - 1] for k in keep], [order[0], *(order[k] for k in keep)]


def given_stage_plan(params: dict[str, Any], names: Sequence[str], devices: Sequence[str],
                     sizes: Sequence[int]) -> StagePlan:
    """The plan of start=given, both runtimes: ``given_plan``'s cut and stage devices, evaluated with
    no block measured (nothing is planned: the figures that matter are measured by the run)."""
    cuts, order = given_plan(params, len(names), len(devices))
    zero = dict.fromkeys(((b, d) for b in names for d in devices), 0.0)
    return evaluate_stages(StageProblem(list(names), list(devices), zero, list(sizes)), cuts, order)


def stage_rows(plan: StagePlan, names: Sequence[str], batch: int, measured: dict[int, dict[str, float]]
               ) -> list[dict[str, Any]]:
    """Each stage's report: its blocks and device, the modelled figures, the measured ones (ms per frame)."""
    rows = []
    for k, stage in enumerate(plan.stages):
        got = measured.get(k, {})
        load = got.get("frame_s")
        rows.append({"stage": k, "device": stage.device, "blocks": list(names[stage.first:stage.end]),
                     "first": stage.first, "end": stage.end,
                     "compute_ms": _ms(got.get("compute_s")), "in_ms": _ms(got.get("in_s")),
                     "out_ms": _ms(got.get("out_s")), "frame_ms": _ms(load),
                     "standalone_ips": batch / load if load else None,
                     "modelled_frame_ms": _ms(stage.load_s) if plan.bottleneck_s > 0 else None})
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
