"""The split family: one inference split by image rows over devices.

``split`` (seed 003, CoDL): chains of convolutions split at a ratio, halos recomputed, one join per
chain. ``coedge`` (seed 004's baseline): every layer split, halo rows exchanged before each window.
Modules: ``strategy`` (split) and ``coedge`` the strategies, ``spatial`` what both build on (the
engine job and ``SpatialStrategy``: a row family is a plan and its params), ``_chains`` a traced
model as chains, ``_rows`` row arithmetic (pure), ``_slabs``/``_programs`` the engine programs.
The ratio search is a pure planner: ``autohet.planners.split``.
"""

from __future__ import annotations

from autohet.core.lazy import lazy_exports

__all__ = ["DeviceModel", "StagePrograms", "capture", "spatial_graph"]

# name -> the private module that defines it, imported on first use
__getattr__ = lazy_exports(__name__, {
    "DeviceModel": "_slabs",
    "StagePrograms": "_programs",
    "capture": "_slabs",
    "spatial_graph": "_chains",
})
