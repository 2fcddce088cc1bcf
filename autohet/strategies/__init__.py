"""Strategies: one base class, one registry, one module per family.

Plug-ins extend the public names here: ``Strategy`` for any family, ``DataParallelStrategy`` (with
``SchedState`` and ``split_by_weights``) for a new data-parallel scheduler, the built-in schedulers
to refine one, and ``register_strategy`` to join the registry. What the in-process (engine)
families share is here too: ``DEVICES``, ``default_devices``, ``chosen_devices``,
``run_on_engine``, ``serve_on_engine``.
"""

from __future__ import annotations

from typing import Any

from autohet.strategies.base import Strategy
from autohet.strategies.registry import (
    BASELINE,
    STRATEGIES,
    get_strategy,
    is_baseline,
    register_strategy,
    strategy_names,
)

__all__ = [
    "BASELINE", "DEVICES", "STRATEGIES", "ChunkScheduler", "DataParallelStrategy", "FastSplitScheduler",
    "FifoScheduler", "HatScheduler", "QuickScheduler", "SchedState", "SingleScheduler", "StaticScheduler",
    "Strategy", "chosen_devices", "default_devices", "get_strategy", "is_baseline", "register_strategy",
    "run_on_engine", "serve_on_engine", "split_by_weights", "strategy_names",
]

_IN_PROCESS = {"DEVICES", "chosen_devices", "default_devices", "run_on_engine", "serve_on_engine"}
_DATA_PARALLEL = {"ChunkScheduler", "DataParallelStrategy", "FastSplitScheduler", "FifoScheduler", "HatScheduler",
                  "QuickScheduler", "SingleScheduler", "StaticScheduler"}


def __getattr__(name: str) -> Any:
    """The data-parallel family's classes and the in-process families' helpers, imported on first use."""
    if name in _DATA_PARALLEL:
        from autohet.strategies import data_parallel

        return getattr(data_parallel, name)
    if name in ("SchedState", "split_by_weights"):
        from autohet.strategies import _driver

        return getattr(_driver, name)
    if name in _IN_PROCESS:
        from autohet.strategies import _inprocess

        return getattr(_inprocess, name)
    raise AttributeError(name)
