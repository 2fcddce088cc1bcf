"""The pipeline family (seed 002, PipeEdge): contiguous stages of the model's blocks on different
executors, frames streamed through them.

Modules: ``strategy`` the strategy, ``_plan`` what both runtimes share (blocks, plans, reports),
``_job`` the in-process engine runtime (one node), ``_ray`` one Ray actor per stage (several
nodes). The cut is a pure planner: ``autohet.planners.stages``.
"""

from __future__ import annotations

from autohet.core.lazy import lazy_exports

__all__ = ["PipelineJob", "StagePrograms", "given_stage_plan", "measure_stage", "model_graph", "stage_programs",
           "steady_frame_seconds", "value_shapes"]

# name -> the private module that defines it, imported on first use
__getattr__ = lazy_exports(__name__, {
    "PipelineJob": "_job",
    "StagePrograms": "_plan",
    "given_stage_plan": "_plan",
    "measure_stage": "_job",
    "model_graph": "_plan",
    "stage_programs": "_job",
    "steady_frame_seconds": "_job",
    "value_shapes": "_plan",
})
