from __future__ import annotations

import os

import pytest

from autohet.testing import sim_pool_spec

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

__all__ = ["sim_pool_spec"]


def pytest_collection_modifyitems(config, items):
    """The test tiers: a test that uses the Ray fixture is a ``ray`` test (marked here, so it never
    runs in the Ray-free tier by omission); every ``ray`` test is also ``slow`` (a Ray start alone
    takes 8-20 s on the 2-core box: the quick tier, ``-m "not slow"``, stays under 3 minutes);
    ``gpu`` tests skip without a CUDA GPU. The tests that use the Ray fixture run last, in their
    order: they share its one Ray (``ray_local``), and no other test of their process runs while it is up
    (under ``-n 2`` each worker process has its own, beside the other worker's tests)."""
    import torch

    no_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
        if item.get_closest_marker("ray") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if no_gpu is not None and item.get_closest_marker("gpu") is not None:
            item.add_marker(no_gpu)
    items.sort(key=lambda item: "ray_local" in getattr(item, "fixturenames", ()))  # stable: order kept


@pytest.fixture(autouse=True)
def _ray_only_in_ray_tests(request, monkeypatch):
    """A test not marked ``ray`` that starts Ray in this process fails, naming the marker: the
    Ray-free tier (``-m "not ray"``) must stay free of it."""
    try:
        import ray
    except ImportError:  # a machine without Ray (the GPU box before its wheels): nothing can start it
        ray = None
    if ray is None or request.node.get_closest_marker("ray") is not None:
        yield
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts Ray: mark it @pytest.mark.ray")

    monkeypatch.setattr(ray, "init", refuse)
    yield


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
    from autohet.executors import cpu

    vars(cpu._PINNED).clear()  # the thread's record of its pinning: the next executor on it pins again


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with declared fake resources, 2 CPUs and 1 (fake) GPU, one for the session (a start
    costs 5-10 s on the 2-core box): its tests run last (``pytest_collection_modifyitems``)."""
    import ray

    from autohet.platform.ray_cluster import init_ray

    if ray.is_initialized():
        ray.shutdown()
    init_ray(num_cpus=2, num_gpus=1)
    yield ray
    ray.shutdown()
