from __future__ import annotations

import os

import pytest

from autohet.testing import sim_pool_spec

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

__all__ = ["sim_pool_spec"]


@pytest.fixture(autouse=True)
def _restore_pinning():
    """Tests that load a CPU executor on the main thread pin it (an executor pins the thread that runs
    it, by design); without this, later tests and every process they start inherit one core."""
    import torch

    cores = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
    threads = torch.get_num_threads()
    yield
    if cores is not None and os.sched_getaffinity(0) != cores:
        os.sched_setaffinity(0, cores)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


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
