"""The tune's first points: each device made fast alone before any configuration splits the work.

Stage one is ``single`` on each kind of executor: a GPU at each of its backends, then batch choices;
a CPU group (one group of every core, where the pool is auto-detected) at each CPU backend and
precision, the fastest known first. Its best figure is the one every mixed configuration must beat,
so the result is never below the best single executor measured. Then the CPU group's best variant at
each other batch choice (``batches``); on a CPU-only auto pool, the split probes (``probes``): one
data-parallel strategy over the smaller groups the strategies run on, once per CPU variant whose single
came close to the best; and stage two: every strategy at the defaults that suit the pool, with each
executor kind at the settings of its best single so far, or of the winning probe on the probes' groups
(``StagedSearch`` fills them in once the stage before has run: ``Stage.filled``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from autohet.core.objectives import Objective, RunMode
from autohet.core.settings import CLOSE_TO_BEST, PROBES_MOST
from autohet.executors.backends import EXECUTOR_BACKENDS, backend
from autohet.pool import PoolSpec
from autohet.pool.spec import GPU_BOX_GROUP
from autohet.strategies import BASELINE, get_strategy, is_baseline
from autohet.tuning.dims import SpaceContext
from autohet.tuning.space import SearchSpace

__all__ = ["CLOSE_TO_BEST", "CPU_VARIANTS", "PROBES_MOST", "CpuVariant", "FirstPoints", "Known", "Stage",
           "batch_walk", "initial_points", "split_winner", "staged_points", "with_best"]


# A CPU group's variants (backend, precision, channels_last), the fastest first as measured (docs/why.md,
# tuning/initial.py). Variants the space leaves out (bf16 without AVX512-BF16/AMX, a backend not installed)
# are skipped; the pool's own setting comes last. ONNX Runtime with NNPACK's layers comes before plain ONNX
# Runtime: where the model has no layer NNPACK wins it is the same program, and on vgg16, which has such
# layers, it ran faster. OpenVINO runs with its THROUGHPUT hint (streams 0: a stream per core or so) and with
# one stream (LATENCY's choice), which a small model can run faster.
class CpuVariant(NamedTuple):
    backend: str
    precision: str
    channels_last: bool = False
    streams: int = 0

    def settings(self) -> dict[str, Any]:
        return dict(self._asdict())


CPU_VARIANTS: tuple[CpuVariant, ...] = (
    CpuVariant("openvino", "bf16"), CpuVariant("openvino", "bf16", streams=1), CpuVariant("eager", "bf16", True),
    CpuVariant("onnxruntime_nnpack", "fp32"), CpuVariant("onnxruntime", "fp32"), CpuVariant("openvino", "fp32"),
    CpuVariant("openvino", "fp32", streams=1), CpuVariant("inductor", "bf16", True), CpuVariant("eager", "fp32", True),
)


# fifo hands each group its next batch as it frees (one batch a unit on CPU-only pools): its figure is
# the groups' own speeds summed, less at most one batch of tail, with no probing rounds of its own
_PROBE_STRATEGY = "fifo"


def split_winner(probes: list[tuple[float, dict[str, Any]]], objective: Objective) -> dict[str, Any]:
    """The split probes' ``exec.cpu.*`` values to carry (``probes``: each probe's figure and values): the
    best, or a probe that refines its backend (``CPU_REFINES``) at otherwise the same settings and came
    within CLOSE_TO_BEST of it: the probes' short trials can rank a refinement just below its plain
    backend where a full run ranks it well above (docs/why.md, tuning/initial.py)."""
    from autohet.executors.cpu_backends import CPU_REFINES

    figure, best = min(probes, key=lambda probe: objective.rank(probe[0]))
    for other_figure, other in probes:
        backend = other.get("exec.cpu.backend")
        same = {k: v for k, v in other.items() if k != "exec.cpu.backend"} == {
            k: v for k, v in best.items() if k != "exec.cpu.backend"}
        if same and CPU_REFINES.get(backend) == best.get("exec.cpu.backend") and objective.share_of(
                other_figure, figure) >= CLOSE_TO_BEST:
            return other
    return best


@dataclass(frozen=True)
class Known:
    """What the stages so far measured, which a later stage's points are filled from. ``best``: kind ->
    its best single's ``exec.<kind>.*`` values; ``cpu_group``: the ``pool.cpu_group_size`` the best CPU
    single ran at; ``close_cpu``: the ``exec.cpu.*`` values but the batch of each CPU variant whose single
    came close to the best (the best first); ``cpu_split``: the group size the split probes ran on and
    the winning probe's ``exec.cpu.*`` values (``split_winner``); ``negligible``: the kinds whose best
    single came under ``NEGLIGIBLE_SHARE`` of another kind's best."""

    best: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu_group: Any = None
    close_cpu: tuple[dict[str, Any], ...] = ()
    cpu_split: tuple[Any, dict[str, Any]] | None = None
    negligible: frozenset[str] = frozenset()


class Stage(NamedTuple):
    """Points that go in once the stage before has run, each at the best singles' settings so far,
    except for its own values of ``keep``; with ``per_close_cpu``, each point once per close CPU
    variant (``Known.close_cpu``) instead of the best's; with ``when_best`` (an ``exec.<kind>.*`` name
    and a value), only where the best single of that kind so far has that value (``batch_walk``); with
    ``unless_negligible`` (a kind), only where that kind's best single is not negligible (``Known``)."""

    points: list[dict[str, Any]]
    keep: frozenset[str] = frozenset()
    per_close_cpu: bool = False
    when_best: tuple[str, Any] | None = None
    unless_negligible: str | None = None

    def filled(self, known: Known) -> list[dict[str, Any]]:
        """A point on groups of another size than the best CPU single's keeps its own CPU batch: a batch
        that won narrowly on one group size can be slow on smaller groups (docs/why.md, tuning/initial.py).
        On the split probes' groups it takes the winning probe's settings, its batch included: they were
        measured there."""
        if self.when_best is not None:
            name, value = self.when_best
            if known.best.get(name.split(".")[1], {}).get(name) != value:
                return []
        if self.unless_negligible in known.negligible:
            return []
        if self.per_close_cpu:
            return [{**with_best(point, known.best, self.keep | {"exec.cpu.batch"}), **variant}
                    for point in self.points for variant in known.close_cpu]
        out = []
        for point in self.points:
            group = point.get("pool.cpu_group_size")
            if known.cpu_split is not None and group == known.cpu_split[0]:
                out.append(with_best(point, {**known.best, "cpu": known.cpu_split[1]}, self.keep))
            else:
                out.append(with_best(point, known.best, self.keep | (
                    {"exec.cpu.batch"} if group != known.cpu_group else set())))
        return out


@dataclass
class FirstPoints:
    """Stage one (singles, run first), the CPU group's best variant at the other batch choices
    (``batches``), the split probes (``probes``), then stage two (strategies); each stage after the
    first is filled from what the ones before it measured.

    On a pool of several GPUs stage one is each GPU setting's single alone (its backends), then the GPU's
    other batches (``gpu_batches``, walked), then every GPU together (``gpus_together``: data-parallel over
    the GPUs without the CPU groups, at the best single's settings, its batch included), then the CPU
    group's singles (``cpu_singles``: its other variants only where its first is not negligible beside a
    GPU), then the rest as on one GPU: where dividing the work pays (docs/why.md, tuning/initial.py), it is
    measured right after the GPUs' own speed."""

    singles: list[dict[str, Any]]
    strategies: list[dict[str, Any]]
    batches: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    gpus_together: list[dict[str, Any]] = field(default_factory=list)
    gpu_batches: list[dict[str, Any]] = field(default_factory=list)
    cpu_singles: list[dict[str, Any]] = field(default_factory=list)
    gpu_batch: Any = None  # the batch stage one's GPU singles ran at, where the batch walk starts

    def later(self) -> list[Stage]:
        """The stages after the first, in order (``StagedSearch``). With split probes the strategies take
        the probes' settings, so the whole group's other batches feed only its ``single`` and go last: the
        batch stage can take much of a tune for little gain (docs/why.md, tuning/initial.py)."""
        batches = Stage(self.batches, frozenset({"exec.cpu.batch"}))
        gpus = [*batch_walk(self.gpu_batches, self.gpu_batch), Stage(self.gpus_together),
                Stage(self.cpu_singles[:1], _CPU_KEYS),
                Stage(self.cpu_singles[1:], _CPU_KEYS, unless_negligible="cpu")] if self.gpus_together else []
        if self.probes:
            return [*gpus, Stage(self.probes, per_close_cpu=True), Stage(self.strategies), batches]
        return [*gpus, batches, Stage(self.strategies)]

    def all(self) -> list[dict[str, Any]]:
        return self.singles + [point for stage in self.later() for point in stage.points]

    def ahead(self) -> list[dict[str, dict[str, Any]]]:
        """What stage one will need, in order, for the pool manager to make ready while trials run elsewhere
        (``autohet.tuning.ahead``): on a pool of several GPUs, the GPU settings it will compile (each single
        whose backend compiles, then the same at the batch walk's first step up); then, beside a GPU, each
        topology its singles start after the first (``pool`` entries: the CPU group of every core). The walk's
        step is filled with the best single's backend, unknown yet: when a compiled backend wins, as inductor
        did in every two-GPU tune (BENCHMARKS.md 34, 39), its setting is the walk's first; when none does, the
        compile was spent for nothing, and the trials after wait for it to end if it still runs."""
        out: list[dict[str, dict[str, Any]]] = []
        if self.gpus_together:
            compiled = [_gpu_settings(p) for p in self.singles if "exec.gpu.backend" in p
                        and backend(p["exec.gpu.backend"]).compiles]
            larger = sorted(p["exec.gpu.batch"] for p in self.gpu_batches
                            if isinstance(p.get("exec.gpu.batch"), int) and isinstance(self.gpu_batch, int)
                            and p["exec.gpu.batch"] > self.gpu_batch)
            out += compiled + ([{"gpu": {**c["gpu"], "batch": larger[0]}} for c in compiled] if larger else [])
        if any("exec.gpu.backend" in p for p in self.singles):  # beside a GPU: its singles leave the cores idle
            seen: list[dict[str, Any]] = []
            for point in self.singles + self.cpu_singles:
                dims = {k.removeprefix("pool."): v for k, v in point.items() if k.startswith("pool.")}
                if dims not in seen:
                    seen.append(dims)
            out += [{"pool": dims} for dims in seen[1:]]
        return out


def _gpu_settings(point: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A point's GPU executor params, by kind."""
    return {"gpu": {k.removeprefix("exec.gpu."): v for k, v in point.items() if k.startswith("exec.gpu.")}}


# a CPU single's own variant: kept when its stage is filled with the GPUs' best settings
_CPU_KEYS = frozenset(f"exec.cpu.{name}" for name in ("batch", *CpuVariant._fields))
# the data-parallel strategies that run the GPUs together first: no barrier, whole batches a unit
_TOGETHER = ("fifo", "fast_split")


def _exec_defaults(space: SearchSpace, pool: PoolSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in sorted({e.kind for e in pool.executors}):
        first = next(e for e in pool.executors if e.kind == kind)
        for name, dim in space.executors.get(kind, {}).items():
            value = first.executor_params().get(name)
            if value is None and name in ("sms", "streams"):
                value = 0
            if dim.contains(value):
                out[f"exec.{kind}.{name}"] = value
    if pool.auto:
        for name, dim in space.pool.items():
            value = pool.auto.get(name)
            if name == "cpu_group_size" and value in (None, "auto"):  # what auto chose for this pool
                value = GPU_BOX_GROUP if any(e.is_gpu for e in pool.executors) else 1
            if name == "gpu_partitions" and value is None:  # auto's default: whole GPUs. Left to the
                value = 1  # sampler, the first points flipped topologies, each restarting the GPU's actor
            if name == "max_cpu_groups" and value is None:  # auto's default: every group
                value = "all"
            if dim.contains(value):
                out[f"pool.{name}"] = value
    return out


def _cpu_group(space: SearchSpace, pool: PoolSpec) -> tuple[int, dict[str, Any]] | None:
    """The CPU group whose singles stage one runs, and the pool dims that make it: one group of every
    core where the pool is auto-detected and the space has ``cpu_group_size: all``, else the pool's
    largest group."""
    size = space.pool.get("cpu_group_size")
    if pool.auto and size is not None and size.contains("all"):
        from autohet.tuning.manager import regroup

        whole = regroup(pool, {"cpu_group_size": "all"})
        index = next((i for i, e in enumerate(whole.executors) if e.is_cpu), None)
        return None if index is None else (index, {"pool.cpu_group_size": "all"})
    cpus = [i for i, e in enumerate(pool.executors) if e.is_cpu]
    if not cpus:
        return None
    return max(cpus, key=lambda i: (len(pool.executors[i].cores), -i)), {}


def _cpu_singles(space: SearchSpace, pool: PoolSpec, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Single on the CPU group at each variant of ``CPU_VARIANTS`` the space holds, then at its pool
    settings (the slowest variant where the pool file names none: eager fp32). Beside a GPU, no variant
    that compiles or refines another by timing its layers (``CPU_REFINES``): seconds to minutes of set-up
    for a group that adds little next to a GPU (docs/why.md, tuning/initial.py)."""
    from autohet.executors.cpu_backends import CPU_REFINES

    found = _cpu_group(space, pool)
    if found is None:
        return []
    index, pool_dims = found
    base = {"strategy": BASELINE, f"{BASELINE}.executor": index, **defaults, **pool_dims}
    dims = space.executors.get("cpu", {})
    points = []
    seen = {tuple(base.get(f"exec.cpu.{k}") for k in CpuVariant._fields)}
    beside_gpu = any(e.uses_gpu for e in pool.executors)
    for variant in CPU_VARIANTS:
        if beside_gpu and (backend(variant.backend).compiles or variant.backend in CPU_REFINES):
            continue
        point = dict(base)
        for name, value in variant.settings().items():
            dim = dims.get(name)
            if dim is not None and not dim.contains(value):
                break  # the space leaves this variant out (on this machine)
            if dim is not None:
                point[f"exec.cpu.{name}"] = value
        else:
            key = tuple(point.get(f"exec.cpu.{k}") for k in CpuVariant._fields)
            if key not in seen:
                seen.add(key)
                points.append(point)
    return [*points, base]


def _cpu_batches(space: SearchSpace, pool: PoolSpec, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Single on the CPU group at each batch choice but its first points' one, the largest first (its
    backend, precision and layout are the best CPU single's: ``Stage.filled``): a larger batch paid for
    some models and backends and not others (docs/why.md, tuning/initial.py). None beside a GPU, where a
    CPU group adds little."""
    found = _cpu_group(space, pool)
    dim = space.executors.get("cpu", {}).get("batch")
    if found is None or dim is None or any(e.uses_gpu for e in pool.executors):
        return []
    index, pool_dims = found
    base = {"strategy": BASELINE, f"{BASELINE}.executor": index, **defaults, **pool_dims}
    values = sorted((v for v in dim.values() or [] if v != base.get("exec.cpu.batch")), reverse=True)
    return [{**base, "exec.cpu.batch": v} for v in values]


def _split_probes(space: SearchSpace, pool: PoolSpec, strategies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The split probes' point (``_PROBE_STRATEGY``'s stage-two point), where the CPU singles ran on one
    group of every core and the strategies split over smaller groups of a CPU-only pool; else none."""
    found = _cpu_group(space, pool)
    probe = next((p for p in strategies if p["strategy"] == _PROBE_STRATEGY), None)
    if found is None or not found[1] or probe is None:
        return []
    from autohet.tuning.manager import regroup

    split = regroup(pool, {k.removeprefix("pool."): v for k, v in probe.items() if k.startswith("pool.")})
    if probe.get("pool.cpu_group_size") == found[1]["pool.cpu_group_size"] or len(split.executors) < 2 or not all(
            e.is_cpu for e in split.executors):
        return []
    return [dict(probe)]


def _gpu_singles(space: SearchSpace, index: int, defaults: dict[str, Any], mode: RunMode) -> list[dict[str, Any]]:
    """Single on a GPU at its defaults, then one change at a time: each backend (the compiled ones
    first), then each batch choice (a handful of points, not a grid). torch.compile is what a user
    would run instead, so it goes early: a short tune can end before later points (docs/why.md,
    tuning/initial.py). On several GPUs ``staged_points`` runs the compiled ones last instead: another
    GPU compiles them meanwhile."""
    base = {"strategy": BASELINE, f"{BASELINE}.executor": index, **defaults}
    ours: list[dict[str, Any]] = [base]
    for name in ("backend", "batch"):
        dim = space.executors.get("gpu", {}).get(name)
        values = list((dim.values() if dim is not None else None) or [])
        if name == "backend":
            values.sort(key=lambda v: (backend(v).gpu_first is None, backend(v).gpu_first or 0))
        ours += [{**base, f"exec.gpu.{name}": v} for v in values if v != defaults.get(f"exec.gpu.{name}")]
    if mode.per_request and len(ours) > 1 and backend(ours[1].get("exec.gpu.backend", "eager")).compiles:
        ours[:2] = ours[1::-1]  # the compiled-and-captured GPU before the plain graph
    return ours


def staged_points(space: SearchSpace, pool: PoolSpec, ctx: SpaceContext | None = None,
                  mode: RunMode = RunMode.THROUGHPUT) -> FirstPoints:
    """Stage one: single per GPU kind and size (each backend, then batch), then the CPU group at each
    backend and precision; then the CPU group at its other batches (throughput only); stage two: every
    strategy at its pool-suited defaults (values outside the space are left to the sampler). ``mode``:
    the objective's; latency puts every GPU on CUDA graphs and tries the GPU alone with inductor first."""
    defaults = _exec_defaults(space, pool)
    dim = space.executors.get("gpu", {}).get("backend")
    graphed = [b for b in EXECUTOR_BACKENDS if backend(b).request_graph and not backend(b).compiles]
    if mode.per_request and dim is not None and graphed and dim.contains(graphed[0]):
        defaults["exec.gpu.backend"] = graphed[0]  # every first point's GPU (a CUDA graph): batch 1 is launch-bound
    singles: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for i, e in enumerate(pool.executors):
        if (e.kind, e.threads) in seen or e.is_cpu:
            continue
        seen.add((e.kind, e.threads))
        if e.is_gpu:
            singles += _gpu_singles(space, i, defaults, mode)
        else:
            singles.append({"strategy": BASELINE, f"{BASELINE}.executor": i, **defaults})
    cpu_singles = _cpu_singles(space, pool, defaults)
    batches = [] if mode.per_request else _cpu_batches(space, pool, defaults)
    strategies = [_strategy_point(space, name, pool, defaults, ctx) for name in space.strategies
                  if not is_baseline(name)]
    probes = [] if mode.per_request else _split_probes(space, pool, strategies)
    together = [] if mode.per_request else _gpus_together(space, pool, defaults, ctx)
    if not together:
        return FirstPoints(singles + cpu_singles, strategies, batches, probes)
    backends = [p for p in singles if "exec.gpu.batch" not in p or p["exec.gpu.batch"] == defaults.get(
        "exec.gpu.batch")]
    # the backends that compile last: their settings compile ahead on another GPU meanwhile (``FirstPoints.ahead``)
    backends.sort(key=lambda p: backend(p.get("exec.gpu.backend", "eager")).compiles)
    walk = [p for p in singles if p not in backends]
    _on_the_compiling_gpu(pool, [p for p in backends if backend(p.get("exec.gpu.backend", "eager")).compiles])
    return FirstPoints(backends, strategies, batches, probes, together, walk, cpu_singles,
                       defaults.get("exec.gpu.batch"))


def _on_the_compiling_gpu(pool: PoolSpec, points: list[dict[str, Any]]) -> None:
    """Moves the compiled backends' GPU singles onto the second GPU: the first idle one while the first GPU's
    singles run, so the plan's first compile ahead is set up on its actor and the next (the walk's first step)
    in a child beside it (``CompileAhead.start``). Those singles then set up nothing. The walk stays on the
    first GPU: idle while they run, it sets the walk's setting up from the cache as soon as the child has
    filled it (``CompileAhead._after``), while the second GPU is still measured; on the second GPU the walk's
    single set it up only after its own single had waited for the child (BENCHMARKS.md 42, 46)."""
    key = f"{BASELINE}.executor"
    for point in points:
        first = pool.executors[point[key]]
        second = next((j for j, e in enumerate(pool.executors) if j != point[key] and e.is_gpu and not e.sms
                       and e.kind == first.kind and e.node is None), None)
        if second is not None:
            point[key] = second


def batch_walk(points: list[dict[str, Any]], start: Any, name: str = "exec.gpu.batch") -> list[Stage]:
    """``points`` (singles at other values of ``name``, a batch) as a walk out from ``start``: the larger
    batches upward, each tried only while the step before it is the best single so far, then the smaller
    ones downward the same way, so the first smaller one only where no larger one won. A batch's speed
    rises to one peak and then falls or levels, so a step past a batch that lost cannot win; each step
    skipped is a compile skipped (5-26 s of acquiring each, by model: docs/why.md,
    tuning/initial.py). Without a ``start`` every point is tried."""
    keep = frozenset({name})
    if start is None or not all(isinstance(p.get(name), int | float) for p in points):
        return [Stage(points, keep)]
    up = sorted((p for p in points if p[name] > start), key=lambda p: p[name])
    down = sorted((p for p in points if p[name] < start), key=lambda p: -p[name])
    stages = []
    for side in (up, down):
        before = start
        for point in side:
            stages.append(Stage([point], keep, when_best=(name, before)))
            before = point[name]
    return stages


def _strategy_point(space: SearchSpace, name: str, pool: PoolSpec, defaults: dict[str, Any],
                    ctx: SpaceContext | None, pool_dims: dict[str, Any] | None = None) -> dict[str, Any]:
    """``name`` at the defaults that suit ``pool`` (values outside the space left to the sampler)."""
    strategy = get_strategy(name)
    values = strategy.validate(strategy.defaults_for(pool, {}))
    point = {"strategy": name, **defaults, **(pool_dims or {})}
    point.update({f"{name}.{p}": values[p] for p, dim in space.strategies[name].items()
                  if not dim.vector and dim.when is None and dim.contains(values[p], ctx)})
    return point


def _gpus_together(space: SearchSpace, pool: PoolSpec, defaults: dict[str, Any],
                   ctx: SpaceContext | None) -> list[dict[str, Any]]:
    """Where the auto pool has several GPUs and the space can leave its CPU groups out: each of
    ``_TOGETHER`` over the GPUs alone, at the defaults that suit GPUs (``PoolMix.GPUS``)."""
    groups = space.pool.get("max_cpu_groups")
    if not pool.auto or groups is None or not groups.contains(0) or sum(1 for e in pool.executors if e.is_gpu) < 2:
        return []
    from autohet.tuning.manager import regroup

    gpus = regroup(pool, {"max_cpu_groups": 0})
    return [_strategy_point(space, name, gpus, defaults, ctx, {"pool.max_cpu_groups": 0})
            for name in _TOGETHER if name in space.strategies]


def initial_points(space: SearchSpace, pool: PoolSpec, ctx: SpaceContext | None = None,
                   mode: RunMode = RunMode.THROUGHPUT) -> list[dict[str, Any]]:
    """Every stage's points in order, the later ones at the pool's own executor settings."""
    return staged_points(space, pool, ctx, mode).all()


def with_best(point: dict[str, Any], best: dict[str, dict[str, Any]],
              keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A later stage's point with each executor kind at its best single's settings (``best``: kind ->
    that single's ``exec.<kind>.*`` values), except the point's own values of ``keep``; kinds without a
    valid single keep the pool's own."""
    out = dict(point)
    for kind, values in best.items():
        out.update({k: v for k, v in values.items() if k.startswith(f"exec.{kind}.") and k not in keep})
    return out
