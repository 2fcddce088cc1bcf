"""The channel family (seed 004): layers split over devices by output channels (OCP), or adjacent
pairs by output then input channels with partial sums added (IOP).

Modules: ``strategy`` the strategy and its engine job, ``_layers`` which layers of a traced model
can be split and their per-device pieces, ``_programs`` the engine programs of a plan, ``_session``
one model's measured costs and plans on an engine. The pairing heuristic is a pure planner:
``autohet.planners.pairing``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ChannelsSession"]

# name -> the private module that defines it (imported on first use: the package stays light)
_PUBLIC = {
    "ChannelsSession": "_session",
}


def __getattr__(name: str) -> Any:
    """The family's pieces that benches and tools use (see ``_PUBLIC``), imported on first use."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(name)
