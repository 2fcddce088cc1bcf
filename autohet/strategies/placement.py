"""Subgraph placement (seed 001): blocks of the model on CPU and GPU, placed by measurement, for latency.

The model is cut into blocks (``autohet.partition``); every block is timed on every device (mean of
``runs`` after warm-up); blocks are placed greedily along the critical path, then correction rounds
move a block when the measured end-to-end latency drops, stopping after ``x`` rounds without gain
(``autohet.planners``). With ``start=given`` the greedy step is skipped: ``assignment`` (one index
into the chosen ``devices`` per block, in ``partition(model, batch=1).blocks`` order) is the
starting point, so a tuner can search placements greedy would never reach; ``x=0`` measures it as
given. The placed model runs on the in-process engine: consecutive blocks on one device form a
segment (one CUDA graph on a GPU), segments on different devices run at once where the DAG allows,
transfers are explicit. It serves batch-1 requests, timed one by one, next to the whole model on
each device (the same engine, graphs and backend): baselines measured in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from autohet.context import tolerance_for
from autohet.core.errors import UserError
from autohet.core.measurement import ExecutorReport
from autohet.core.objectives import RunMode
from autohet.core.params import BoolParam, ChoiceParam, IntListParam, IntParam, Param
from autohet.engine import EngineJob, EngineResult
from autohet.executors.backends import BLOCK_RUNNERS, PER_BLOCK, backend, block_runners_for
from autohet.strategies._inprocess import DEVICES, default_devices
from autohet.strategies.base import EngineStrategy, start_param

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.core.measurement import Measurement
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.engine import Engine
    from autohet.engine.blocks import BlockPrograms
    from autohet.executors import ExecutorSpec
    from autohet.partition import BlockGraph
    from autohet.planners import PlacementResult
    from autohet.pool import Pool, PoolSpec
    from autohet.strategies.base import ServedBuild

__all__ = ["Placed", "PlacementJob", "PlacementStrategy", "check_vector", "placement_devices", "start_assignment",
           "tvm_ready"]


def tvm_ready(model: str, targets: list[str]) -> list[str]:
    """Torch device strings with a MetaSchedule database for ``model``: where TVM is worth measuring."""
    from autohet.block_runners.tvm import database_tag, tune_dir, tvm_target

    return [d for d in targets if database_tag(tune_dir(model, tvm_target(d)[1])) != "untuned"]


def _require_tuned(model: str, targets: list[str]) -> None:
    """Untuned TVM is 50-150x slower than PyTorch: a TVM trial needs `autohet compile` first."""
    from autohet.block_runners.tvm import tvm_target

    ready = tvm_ready(model, targets)
    for target in (t for t in targets if t not in ready):
        _, key = tvm_target(target)
        kind = "cpu" if target == "cpu" else "cuda"
        raise UserError(f"no MetaSchedule database for {model} on {key}; run `autohet compile --model {model} "
                        f"--backend tvm --target {kind} --trials N` first, or use backend torch")


def placement_devices(spec: PoolSpec, params: dict[str, Any] | None = None) -> list[str]:
    """Names of the devices a placement vector indexes (the chosen executors, in pool order)."""
    indices = (params or {}).get("devices") or default_devices(spec)
    return [spec.executors[i].name for i in indices if 0 <= i < len(spec.executors)]


def check_vector(params: dict[str, Any], devices: list[str]) -> None:
    """What can be checked without partitioning the model (the length is checked in the job)."""
    from autohet.planners import valid_indices

    vector = params.get("assignment")
    if params.get("start", "greedy") != "given":
        if vector is not None:
            raise UserError("placement: assignment is only used with start=given; add --set start=given")
        return
    if vector is None:
        if len(devices) > 1:
            raise UserError(f"placement: start=given needs assignment, one device index per block "
                            f"(valid: {valid_indices(devices)})")
        return  # one device: the only vector is all on it (the tuner suggests none then)
    bad = [i for i in vector if not 0 <= int(i) < len(devices)]
    if bad:
        raise UserError(f"placement: assignment has device index {bad[0]}; valid: {valid_indices(devices)}")


def start_assignment(params: dict[str, Any], blocks: list[str], devices: list[str]) -> dict[str, str] | None:
    """None for the greedy start; else the given vector decoded (all on the one device without one)."""
    from autohet.planners import decode

    if params.get("start", "greedy") != "given":
        return None
    vector = params.get("assignment")
    if vector is None and len(devices) == 1:
        vector = [0] * len(blocks)
    check_vector({**params, "assignment": vector}, devices)
    return decode(list(vector), blocks, devices)


@dataclass
class Placed:
    """A placement built on an engine: the block graph, its programs, the assignment to run and,
    when it was planned here, what the planning measured (``kinds``/``on``/``by_kind``: block times per
    backend, ``links``, ``result``: the placer's)."""

    graph: BlockGraph
    programs: BlockPrograms
    assignment: dict[str, str]
    kinds: tuple[str, ...]
    on: dict[str, list[str]]
    by_kind: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    links: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    result: PlacementResult | None = None


class PlacementJob(EngineJob):
    """Partition, measure, place, then time batch-1 requests (runs where the engine is)."""

    def __init__(self, model: ModelSpec, images: np.ndarray, devices: list[str], params: dict[str, Any]) -> None:
        self.model, self.images, self.devices, self.params = model, images, devices, params

    def place(self, engine: Engine, reuse_given: bool = False) -> Placed:
        """The partition placed on the engine's devices: measured and placed (greedy or from the given
        vector, then the correction rounds). ``reuse_given``: a given vector with ``x=0`` and one backend
        is taken as it is, nothing measured (a served config's plan)."""
        from autohet.core.models import build_model, input_shape
        from autohet.engine.blocks import BlockPrograms, measure_links
        from autohet.partition import partition
        from autohet.planners import place, problem_from_graph, table_transfer

        params, devices, model = self.params, self.devices, self.model
        runners = block_runners_for(params["backend"])
        graph = partition(build_model(model), batch=1, seed=model.seed, input_shape=input_shape(model.name),
                          name=model.name)
        start = start_assignment(params, graph.names, devices)  # before any timing: a bad vector fails fast
        target = {d: str(engine[d].torch_device) for d in devices}
        if len(runners) == 1 and backend(runners[0]).needs_tuning:
            _require_tuned(self.model.name, sorted(set(target.values())))
        # per_block: each (block, device) runs with whichever block runner measured faster there; one that
        # needs tuning (TVM) only where its database exists (untuned, minutes of timing for nothing)
        on = {k: devices for k in runners}
        if len(runners) > 1:
            ready = set(tvm_ready(self.model.name, sorted(set(target.values()))))
            on.update({k: [d for d in devices if target[d] in ready] for k in runners if backend(k).needs_tuning})
        kinds = tuple(k for k in on if on[k])
        graphs = params["graphs"]
        if reuse_given and start is not None and params["x"] == 0 and len(runners) == 1:
            return Placed(graph, BlockPrograms(engine, graph, runners[0], graphs), start, kinds, on)
        by_kind = {k: BlockPrograms(engine, graph, k, graphs).block_times(on[k], runs=params["runs"]) for k in kinds}
        choice = {cell: min((k for k in kinds if cell in by_kind[k]), key=lambda k, c=cell: by_kind[k][c])
                  for cell in by_kind[kinds[0]]}
        times = {cell: by_kind[choice[cell]][cell] for cell in choice}
        programs = BlockPrograms(engine, graph, runners[0] if len(runners) == 1 else choice, graphs)
        links = measure_links(engine, devices) if len(devices) > 1 else {}
        transfer = table_transfer(links) if links else None
        problem = problem_from_graph(graph, devices, times, transfer, source_device="host", sink_device="host")
        result = place(problem, lambda a: programs.measure(a, runs=params["runs"]), x=params["x"], start=start)
        return Placed(graph, programs, result.assignment, kinds, on, by_kind, links, result)

    def run(self, engine: Engine) -> EngineResult:
        from autohet.engine.blocks import BlockPrograms
        from autohet.planners import encode

        placed = self.place(engine)
        graph, programs, result, kinds = placed.graph, placed.programs, placed.result, placed.kinds
        devices = self.devices
        assert result is not None
        lat, outputs = programs.latencies(result.assignment, self.images)
        baselines = {}
        one_runner = len(block_runners_for(self.params["backend"])) == 1  # else ``programs`` mixes them
        for device in devices:
            for kind in (k for k in kinds if device in placed.on[k]):  # whole model, each device x measured backend
                whole = programs if one_runner else BlockPrograms(engine, graph, kind, self.params["graphs"])
                base, _ = whole.latencies(dict.fromkeys(graph.names, device), self.images)
                baselines[f"{device}/{kind}"] = float(np.median(base)) * 1e3
        greedy = result.start == "greedy"
        start_vector = encode(result.greedy, graph.names, devices)
        report = {
            "assignment": result.assignment, "assignment_vector": encode(result.assignment, graph.names, devices),
            "start": result.start, "start_assignment": result.greedy, "start_vector": start_vector,
            "start_s": result.greedy_s, "greedy": result.greedy if greedy else None,
            "greedy_s": result.greedy_s if greedy else None, "placed_modelled_s": result.modelled_s,
            "rounds": result.rounds, "devices": devices, "baselines_p50_ms": baselines,
            "blocks": [b.name for b in graph.blocks],
            "block_backend": {b: programs.backend_of(b, d) for b, d in result.assignment.items()},
            "block_times_ms": {f"{b}@{d}/{k}": t * 1e3 for k in kinds for (b, d), t in placed.by_kind[k].items()},
            "links": {f"{a}->{b}": {"latency_us": lat_s * 1e6, "gb_per_s": bw / 1e9}
                      for (a, b), (lat_s, bw) in placed.links.items()}}
        # given without a vector: the exported config names the vector that ran
        given = self.params.get("start") == "given" and self.params.get("assignment") is None
        return EngineResult(np.concatenate([o.numpy() for o in outputs]), times_s=lat, alone_p50_ms=baselines,
                            ran={"assignment": start_vector} if given else {}, report=report)


class PlacementStrategy(EngineStrategy):
    name = "placement"
    family = "placement"
    modes = (RunMode.LATENCY,)
    params: ClassVar[dict[str, Param]] = {
        "x": IntParam("x", 2, low=0, high=20, help="correction rounds without gain before stopping (0: none)"),
        "backend": ChoiceParam("backend", "torch", choices=(*BLOCK_RUNNERS, PER_BLOCK),
                               help="block backend; per_block: torch or tvm per (block, device), the faster measured "
                                    "(tvm needs MetaSchedule databases from `autohet compile`; per_block uses "
                                    "them where they exist)"),
        "runs": IntParam("runs", 10, low=1, high=1000, help="timed runs per block / per assignment"),
        "start": start_param("start the correction rounds from the greedy placement or from `assignment`"),
        "assignment": IntListParam("assignment", None, low=0, high=1023,
                                   help="with start=given: one index into devices per block"),
        "graphs": BoolParam("graphs", True, help="run GPU segments as CUDA graphs (captured once per segment)"),
        "devices": DEVICES,
    }

    def vector_sizes(self, model: ModelSpec, spec: PoolSpec, devices: int) -> dict[str, int]:
        """``blocks``: the batch-1 partition's length."""
        from autohet.partition import partition

        return {"blocks": len(partition(model.name, batch=1, seed=model.seed).blocks)}

    def check_devices(self, params: dict[str, Any], devices: list[str]) -> None:
        check_vector(params, devices)

    def served(self, pool: Pool, specs: list[ExecutorSpec], model: ModelSpec, params: dict[str, Any],
               mode: RunMode, sample: Workload) -> tuple[ServedBuild, int]:
        """Each image a batch-1 request through the placed program (frames overlap across devices). A
        given vector with ``x=0`` is run as given; otherwise the placement is measured once, here."""
        from autohet.planners import encode

        devices = [s.name for s in specs]
        job = PlacementJob(model, np.ascontiguousarray(sample.rows(0, 1)), devices, params)

        def build(engine: Engine) -> tuple[Any, int, dict[str, Any]]:
            placed = job.place(engine, reuse_given=True)
            vector = encode(placed.assignment, placed.graph.names, devices)
            planned = placed.result is not None
            return placed.programs.program(placed.assignment), 2, {"assignment": vector, "planned": planned}

        return build, 1

    def plan_params(self, params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """The vector the run ended on, to run as given (per_block backends are chosen by measurement)."""
        if len(block_runners_for(params.get("backend", "torch"))) > 1 or extra.get("assignment_vector") is None:
            return {}
        return {"start": "given", "assignment": [int(i) for i in extra["assignment_vector"]], "x": 0}

    def make_job(self, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any]) -> PlacementJob:
        images = np.ascontiguousarray(ctx.workload.rows(0, min(ctx.latency_runs, ctx.workload.images)))
        return PlacementJob(ctx.model, images, [s.name for s in specs], params)

    def measurement(self, pool: Pool, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any],
                    out: EngineResult) -> Measurement:
        times = out.times_s or []
        params = {**params, **out.ran}
        report = [ExecutorReport("placed", "+".join(s.device for s in specs), len(times), float(sum(times)), 0.0)]
        m = ctx.latency_measurement(pool, self.name, params, times, out.outputs, report,
                                    tolerance_for([s.precision for s in specs]))
        m.extra.update(out.report)
        return m
