"""Executors: a CPU core group, a GPU, and a simulated executor for tests and planning."""

from __future__ import annotations

from autohet.executors.base import EXECUTOR_PARAMS, PRECISIONS, Executor, ExecutorSpec, UnitResult
from autohet.models import ModelSpec

__all__ = ["EXECUTOR_PARAMS", "PRECISIONS", "Executor", "ExecutorSpec", "UnitResult", "executor_class",
           "make_executor"]


def executor_class(kind: str) -> type[Executor]:
    """The executor class for a kind (imports lazily: GPU code only where it is asked for)."""
    if kind == "cpu":
        from autohet.executors.cpu import CpuExecutor

        return CpuExecutor
    if kind == "gpu":
        from autohet.executors.gpu import GpuExecutor

        return GpuExecutor
    if kind == "sim":
        from autohet.executors.sim import SimExecutor

        return SimExecutor
    raise ValueError(f"unknown executor kind {kind!r}")


def make_executor(spec: ExecutorSpec, model: ModelSpec) -> Executor:
    """An executor for the spec, not loaded yet."""
    return executor_class(spec.kind)(spec, model)
