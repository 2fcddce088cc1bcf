"""The executors of a tune: created once per pool topology, reused by every trial that needs it.

Trials run in Ray Tune's worker processes; they ask the manager (a Ray actor holding no
devices) for the actor handles of the topology a trial wants, with that trial's executor
parameters applied. Only one topology lives at a time: devices are never shared by two.
"""

from __future__ import annotations

from typing import Any

from autohet.models import ModelSpec
from autohet.pool import PoolSpec, RayPool, load_pool
from autohet.workload import Workload, WorkloadSpec

__all__ = ["PoolManager", "regroup"]


def regroup(base: PoolSpec, pool_params: dict[str, Any]) -> PoolSpec:
    """The auto pool re-detected with another cpu_group_size; explicit pools stay as they are."""
    size = pool_params.get("cpu_group_size")
    if not base.auto or size is None or base.source.startswith("auto on"):
        return base
    source = None if base.source == "auto" else base.source
    return load_pool(source, auto_overrides={"cpu_group_size": int(size)})


class PoolManager:
    """Plain class (wrapped by ray.remote in the tuner): owns at most one live RayPool."""

    def __init__(self, base: PoolSpec, model: ModelSpec, workload: WorkloadSpec | Workload, prefix: str) -> None:
        # built here from the (small) spec: a restarted manager needs nothing from the object store
        self.workload = Workload.from_spec(workload) if isinstance(workload, WorkloadSpec) else workload
        self.base = base
        self.model = model
        self.prefix = prefix
        self.pool: RayPool | None = None
        self.key: tuple | None = None
        self.topologies_started = 0
        self.standalone_cache: dict[tuple, list[float]] = {}

    def acquire(self, pool_params: dict[str, Any], exec_params: dict[str, dict[str, Any]]
                ) -> tuple[PoolSpec, list[Any]]:
        spec = regroup(self.base, pool_params)
        key = tuple((e.name, e.kind, e.cores, e.gpu, e.node) for e in spec.executors)
        if key != self.key or self.pool is None:
            if self.pool is not None:
                self.pool.shutdown()
            self.pool = RayPool(spec, f"{self.prefix}-t{self.topologies_started}")
            self.pool.start(self.model, self.workload)
            self.key = key
            self.topologies_started += 1
        self.pool.configure(exec_params)
        return self.pool.spec, list(self.pool.actors)

    def replace(self, indices: list[int]) -> None:
        """Fresh actors for executors abandoned mid-unit by a cut trial (same spec and params)."""
        if self.pool is not None and indices:
            self.pool.replace(indices)

    def standalone(self, seconds: float, max_images: int) -> list[float]:
        """Standalone throughputs of the live topology, measured once per executor configuration."""
        assert self.pool is not None, "acquire() first"
        key = (self.key, tuple(tuple(sorted(e.executor_params().items())) for e in self.pool.spec.executors),
               max_images)
        if key not in self.standalone_cache:
            self.standalone_cache[key] = self.pool.standalone_ips(seconds, max_images)
        return self.standalone_cache[key]

    def calibrate(self, seconds: float) -> float:
        """Sum of standalone throughputs of the base topology at its own params (images/s)."""
        self.acquire({}, {})
        assert self.pool is not None
        return float(sum(self.pool.standalone_ips(seconds)))

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
            self.key = None
