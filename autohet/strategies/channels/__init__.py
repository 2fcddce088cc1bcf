"""The channel family (seed 004): layers split over devices by output channels (OCP), or adjacent
pairs by output then input channels with partial sums added (IOP).

Modules: ``strategy`` the strategy and its engine job, ``_layers`` which layers of a traced model
can be split and their per-device pieces, ``_programs`` the engine programs of a plan, ``_session``
one model's measured costs and plans on an engine. The pairing heuristic is a pure planner:
``autohet.planners.pairing``.
"""

from __future__ import annotations

from autohet.core.lazy import lazy_exports

__all__ = ["ChannelsSession"]

# name -> the private module that defines it, imported on first use
__getattr__ = lazy_exports(__name__, {
    "ChannelsSession": "_session",
})
