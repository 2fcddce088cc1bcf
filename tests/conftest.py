from __future__ import annotations

import os

import pytest

from autohet.executors import ExecutorSpec
from autohet.pool import PoolSpec

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def sim_pool_spec(speeds: list[float], overheads: list[float] | None = None, batch: int = 16) -> PoolSpec:
    """SIMULATED executors with the given speeds (images/s) and per-unit overheads (s)."""
    overheads = overheads or [0.0] * len(speeds)
    return PoolSpec("sim", [ExecutorSpec(f"sim{i}", "sim", batch=batch, speed_ips=s, overhead_s=o)
                            for i, (s, o) in enumerate(zip(speeds, overheads, strict=True))])


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray for the module with declared fake resources: 2 CPUs and 1 (fake) GPU."""
    import ray

    from autohet.ray_runtime import init_ray

    if ray.is_initialized():
        ray.shutdown()
    init_ray(num_cpus=2, num_gpus=1)
    yield ray
    ray.shutdown()
