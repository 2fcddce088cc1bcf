"""The split family: one inference split by image rows over devices.

``split`` (seed 003, CoDL): chains of convolutions split at a ratio, halos recomputed, one join per
chain. ``coedge`` (seed 004's baseline): every layer split, halo rows exchanged before each window.
Modules: ``strategy`` (split) and ``coedge`` the strategies, ``spatial`` what both build on (the
engine job and ``SpatialStrategy``: a row family is a plan and its params), ``_chains`` a traced
model as chains, ``_rows`` row arithmetic (pure), ``_slabs``/``_programs`` the engine programs.
The ratio search is a pure planner: ``autohet.planners.split``.
"""

from __future__ import annotations

__all__: list[str] = []
