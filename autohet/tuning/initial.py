"""The tune's first points: the best single executor is found before any mixed configuration.

Single on the first executor of each kind and size (a GPU at each of its backend, then batch
choices: the figure every mixed configuration must beat, so the result is never below the best
single executor measured), then every strategy at the defaults that suit the pool.
"""

from __future__ import annotations

from typing import Any

from autohet.pool import PoolSpec
from autohet.pool.spec import GPU_BOX_GROUP
from autohet.strategies import get_strategy
from autohet.tuning.dims import SpaceContext
from autohet.tuning.space import SearchSpace

__all__ = ["initial_points"]

# the compiled backends first, for both objectives: inductor, then CUDA graphs. At batch 1 inductor
# is compiled and then captured, and beat the plain CUDA graph on the H100 box (0.22 vs 0.39 ms
# resnet18, 0.42 vs 0.77 ms mobilenet_v2; a 150 s mobilenet_v2 tune that tried the graph first
# ended on it)
_BACKEND_FIRST = {"inductor": 0, "cudagraphs": 1}


def _exec_defaults(space: SearchSpace, pool: PoolSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in sorted({e.kind for e in pool.executors}):
        first = next(e for e in pool.executors if e.kind == kind)
        for name, dim in space.executors.get(kind, {}).items():
            value = first.executor_params().get(name)
            if value is None and name == "sms":
                value = 0
            if dim.contains(value):
                out[f"exec.{kind}.{name}"] = value
    if pool.auto:
        for name, dim in space.pool.items():
            value = pool.auto.get(name)
            if name == "cpu_group_size" and value in (None, "auto"):  # what auto chose for this pool
                value = GPU_BOX_GROUP if any(e.kind == "gpu" for e in pool.executors) else 1
            if name == "gpu_partitions" and value is None:  # auto's default: whole GPUs. Left to the
                value = 1  # sampler, the first points flipped topologies, each restarting the GPU's actor
            if dim.contains(value):
                out[f"pool.{name}"] = value
    return out


def initial_points(space: SearchSpace, pool: PoolSpec, ctx: SpaceContext | None = None,
                   mode: str = "throughput") -> list[dict[str, Any]]:
    """Single per executor kind and size (GPUs at each backend, then batch choice), then every strategy
    at its pool-suited defaults (values outside the space are left to the sampler). ``mode``: the
    objective's: latency puts every GPU on CUDA graphs and tries the GPU alone with inductor first."""
    defaults = _exec_defaults(space, pool)
    backend = space.executors.get("gpu", {}).get("backend")
    if mode == "latency" and backend is not None and backend.contains("cudagraphs"):
        defaults["exec.gpu.backend"] = "cudagraphs"  # every first point's GPU: batch 1 is launch-bound
    points: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for i, e in enumerate(pool.executors):
        if (e.kind, e.threads) in seen:
            continue
        seen.add((e.kind, e.threads))
        base = {"strategy": "single", "single.executor": i, **defaults}
        if e.kind != "gpu":
            points.append(base)
            continue
        ours: list[dict[str, Any]] = [base]
        # one at a time from the defaults (a handful of points, not a grid); the compiled backends first
        # (for throughput inductor, then CUDA graphs: torch.compile is what a user would run instead,
        # and a short tune, mobilenet_v2 with 5 trials on the H100 box, ran out of time before reaching it)
        for name in ("backend", "batch"):
            dim = space.executors.get("gpu", {}).get(name)
            values = list((dim.values() if dim is not None else None) or [])
            if name == "backend":
                values.sort(key=lambda v: _BACKEND_FIRST.get(v, len(_BACKEND_FIRST)))
            ours += [{**base, f"exec.gpu.{name}": v} for v in values if v != defaults.get(f"exec.gpu.{name}")]
        if mode == "latency" and len(ours) > 1 and ours[1].get("exec.gpu.backend") == "inductor":
            ours[:2] = ours[1::-1]  # the compiled-and-captured GPU before the plain graph
        points += ours
    for name, dims in space.strategies.items():
        if name == "single":
            continue
        strategy = get_strategy(name)
        values = strategy.validate(strategy.defaults_for(pool, {}))
        point = {"strategy": name, **defaults}
        point.update({f"{name}.{p}": values[p] for p, dim in dims.items()
                      if not dim.vector and dim.when is None and dim.contains(values[p], ctx)})
        points.append(point)
    return points

