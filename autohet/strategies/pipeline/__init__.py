"""The pipeline family (seed 002, PipeEdge): contiguous stages of the model's blocks on different
executors, frames streamed through them.

Modules: ``strategy`` the strategy, ``_plan`` what both runtimes share (blocks, plans, reports),
``_job`` the in-process engine runtime (one node), ``_ray`` one Ray actor per stage (several
nodes). The cut is a pure planner: ``autohet.planners.stages``.
"""

from __future__ import annotations

__all__: list[str] = []
