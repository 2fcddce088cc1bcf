"""Executor pools: declared in actors/*.yaml, run in-process, as Ray actors, or simulated."""

from __future__ import annotations

from autohet.pool.base import Identity, Pool, identity
from autohet.pool.dispatch import Completion, Dispatcher, LocalDispatcher, VirtualClockDispatcher
from autohet.pool.local import LocalPool
from autohet.pool.ray_pool import RayPool
from autohet.pool.spec import PoolSpec, check_local_devices, detect_executors, load_pool
from autohet.pool.standalone import StandaloneCache, executor_class
from autohet.pool.virtual import VirtualPool

__all__ = [
    "Completion", "Dispatcher", "Identity", "LocalDispatcher", "LocalPool", "Pool", "PoolSpec", "RayPool",
    "StandaloneCache", "VirtualClockDispatcher", "VirtualPool", "check_local_devices", "detect_executors",
    "executor_class", "identity", "load_pool",
]
