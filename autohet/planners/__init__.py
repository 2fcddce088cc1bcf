"""Block placement across devices (seed 001): greedy on the critical path, then correction rounds.

Pure Python (no torch): build a ``Problem`` from block names, edges, per-(block, device) seconds,
bytes per edge and a transfer function, then ``place(problem, measure=None, x=2)``.
``problem_from_graph`` builds one from an ``autohet.partition.BlockGraph``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autohet.planners import pairing  # noqa: F401  (channel partitioning's pairing planner, seed 004)
from autohet.planners._placement import (
    PlacementResult,
    critical_path,
    decode,
    encode,
    greedy,
    place,
    search_space,
    valid_indices,
)
from autohet.planners._placement_problem import Problem, TransferFn, linear_transfer, table_transfer
from autohet.planners.split import ChainCost, SplitPlan, balance  # noqa: F401  (the split ratio search, seed 003)
from autohet.planners.stages import StagePlan, StageProblem, evaluate_stages, plan_stages  # noqa: F401

__all__ = [
    "PlacementResult", "Problem", "TransferFn", "critical_path", "decode", "encode", "greedy",
    "linear_transfer", "place", "problem_from_graph", "search_space", "table_transfer", "valid_indices",
]


def problem_from_graph(graph: Any, devices: Sequence[str], times: Mapping[tuple[str, str], float],
                       transfer: TransferFn | None = None, source_device: str | None = "cpu",
                       sink_device: str | None = "cpu") -> Problem:
    """A Problem from a BlockGraph (duck-typed: ``names``, ``edges``, ``edge_bytes()``, ``blocks``);
    the model input starts on and the output returns to ``cpu`` by default."""
    edge_bytes = dict(graph.edge_bytes())
    for block in graph.blocks:
        if graph.output_name in block.outputs:
            edge_bytes[(block.name, "output")] = block.out_bytes
    return Problem(blocks=graph.names, edges=list(graph.edges), devices=list(devices), times=times,
                   edge_bytes=edge_bytes, transfer=transfer or linear_transfer(),
                   source_device=source_device, sink_device=sink_device)
