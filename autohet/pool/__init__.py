"""Executor pools: declared in actors/*.yaml, run in-process, as Ray actors, or simulated."""

from __future__ import annotations

from autohet.pool.dispatch import Completion, Dispatcher, LocalDispatcher, VirtualClockDispatcher
from autohet.pool.pools import Identity, LocalPool, Pool, RayPool, VirtualPool, identity
from autohet.pool.spec import PoolSpec, check_local_devices, detect_executors, load_pool
from autohet.pool.standalone import StandaloneCache, executor_class

__all__ = [
    "Completion", "Dispatcher", "Identity", "LocalDispatcher", "LocalPool", "Pool", "PoolSpec", "RayPool",
    "StandaloneCache", "VirtualClockDispatcher", "VirtualPool", "check_local_devices", "detect_executors",
    "executor_class", "identity", "load_pool",
]
