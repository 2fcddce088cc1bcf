"""Strategies: one base class, one registry, one module per family.

Plug-ins extend the public names here: ``Strategy`` for any family, ``DataParallelStrategy`` (with
``SchedState`` and ``split_by_weights``) for a new data-parallel scheduler, the built-in schedulers
to refine one, and ``register_strategy`` to join the registry.
"""

from __future__ import annotations

from typing import Any

from autohet.strategies.base import Strategy
from autohet.strategies.registry import STRATEGIES, get_strategy, register_strategy, strategy_names

__all__ = [
    "STRATEGIES", "ChunkScheduler", "DataParallelStrategy", "FastSplitScheduler", "FifoScheduler", "HatScheduler",
    "QuickScheduler", "SchedState", "SingleScheduler", "StaticScheduler", "Strategy", "get_strategy",
    "register_strategy", "split_by_weights", "strategy_names",
]

_DATA_PARALLEL = {"ChunkScheduler", "DataParallelStrategy", "FastSplitScheduler", "FifoScheduler", "HatScheduler",
                  "QuickScheduler", "SingleScheduler", "StaticScheduler"}


def __getattr__(name: str) -> Any:
    """The data-parallel family's classes, imported on first use."""
    if name in _DATA_PARALLEL:
        from autohet.strategies import data_parallel

        return getattr(data_parallel, name)
    if name in ("SchedState", "split_by_weights"):
        from autohet.strategies import _driver

        return getattr(_driver, name)
    raise AttributeError(name)
