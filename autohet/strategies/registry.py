"""Strategy name -> factory. Modules are imported lazily; a strategy joins by one line here.

Plug-ins outside the package join through the ``autohet.strategies`` entry-point group
(``name = "module:Class"``) or the AUTOHET_PLUGINS environment variable (comma-separated
modules that call ``register_strategy`` on import). Both are read in every process, Ray
workers included, so a plug-in strategy runs wherever the tuner sends it.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from autohet.core.errors import unknown_name
from autohet.core.settings import env
from autohet.strategies.base import Strategy

__all__ = ["BASELINE", "STRATEGIES", "get_strategy", "is_baseline", "register_strategy", "strategy_names"]

# the single-device baseline: every image on one executor. Every tune runs it first on each device, every other
# strategy is compared with it, a one-executor config is served as it; a caller asks ``is_baseline``
BASELINE = "single"

# name -> "module:Class"
STRATEGIES: dict[str, str] = {
    "single": "autohet.strategies.data_parallel:SingleScheduler",
    "static": "autohet.strategies.data_parallel:StaticScheduler",
    "quick": "autohet.strategies.data_parallel:QuickScheduler",
    "chunk": "autohet.strategies.data_parallel:ChunkScheduler",
    "hat": "autohet.strategies.data_parallel:HatScheduler",
    "fifo": "autohet.strategies.data_parallel:FifoScheduler",
    "fast_split": "autohet.strategies.data_parallel:FastSplitScheduler",
    "placement": "autohet.strategies.placement:PlacementStrategy",
    "split": "autohet.strategies.split.strategy:SplitStrategy",
    "coedge": "autohet.strategies.split.coedge:CoEdgeStrategy",
    "pipeline": "autohet.strategies.pipeline.strategy:PipelineStrategy",
    "channels": "autohet.strategies.channels.strategy:ChannelsStrategy",
}


_plugins_loaded = False


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in metadata.entry_points(group="autohet.strategies"):
        STRATEGIES.setdefault(entry.name, entry.value)
    for module in filter(None, (m.strip() for m in (env("AUTOHET_PLUGINS") or "").split(","))):
        importlib.import_module(module)


def is_baseline(name: str | None) -> bool:
    """Whether ``name`` is the single-device baseline (``BASELINE``)."""
    return name == BASELINE


def register_strategy(name: str, target: str) -> None:
    """Adds a strategy by import path ``module:Class`` (plug-ins call this)."""
    STRATEGIES[name] = target


def strategy_names() -> list[str]:
    _load_plugins()
    return list(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    _load_plugins()
    if name not in STRATEGIES:
        raise unknown_name("strategy", name, list(STRATEGIES))
    module, _, cls = STRATEGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
