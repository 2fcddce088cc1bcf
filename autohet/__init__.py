"""autohet: the fastest way to run a CNN's inference on all of a machine's devices, found by measurement."""

from __future__ import annotations

from autohet.context import RunContext
from autohet.core.errors import UserError
from autohet.core.measurement import Measurement
from autohet.core.models import ModelSpec, build_model, input_shape
from autohet.core.objectives import OBJECTIVES, Objective, ObjectiveSet
from autohet.core.workload import Workload, WorkloadSpec
from autohet.strategies import Strategy, get_strategy, register_strategy, strategy_names
from autohet.strategy_run import run_strategy

__all__ = [
    "OBJECTIVES", "Measurement", "ModelSpec", "Objective", "ObjectiveSet", "RunContext", "Runner", "Strategy",
    "UserError", "Workload", "WorkloadSpec", "build_model", "get_strategy", "input_shape", "load", "register_strategy",
    "run_strategy", "strategy_names",
]
__version__ = "0.1.0"

_RUNTIME = ("load", "Runner")  # imported on first use: ``import autohet`` stays light


def __getattr__(name: str) -> object:
    if name in _RUNTIME:
        from autohet import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'autohet' has no attribute {name!r}")
