from __future__ import annotations

import os

import pytest

from autohet.testing import sim_pool_spec

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

__all__ = ["sim_pool_spec"]


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
