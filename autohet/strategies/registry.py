"""Strategy name -> factory. Modules are imported lazily; a strategy joins by one line here."""

from __future__ import annotations

import importlib

from autohet.errors import unknown_name
from autohet.strategies.base import Strategy

__all__ = ["STRATEGIES", "get_strategy", "register_strategy", "strategy_names"]

# name -> "module:Class"
STRATEGIES: dict[str, str] = {
    "single": "autohet.strategies.data_parallel:SingleScheduler",
    "static": "autohet.strategies.data_parallel:StaticScheduler",
    "quick": "autohet.strategies.data_parallel:QuickScheduler",
    "chunk": "autohet.strategies.data_parallel:ChunkScheduler",
    "hat": "autohet.strategies.data_parallel:HatScheduler",
    "fifo": "autohet.strategies.data_parallel:FifoScheduler",
    "fast_split": "autohet.strategies.data_parallel:FastSplitScheduler",
}


def register_strategy(name: str, target: str) -> None:
    """Adds a strategy by import path ``module:Class`` (plug-ins call this)."""
    STRATEGIES[name] = target


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise unknown_name("strategy", name, list(STRATEGIES))
    module, _, cls = STRATEGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
