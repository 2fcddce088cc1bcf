"""Executors: a CPU core group, a GPU, and a simulated executor for tests and planning."""

from __future__ import annotations

from autohet.executors.base import EXECUTOR_PARAMS, PRECISIONS, Executor, ExecutorSpec, UnitResult
from autohet.models import ModelSpec

__all__ = ["EXECUTOR_PARAMS", "PRECISIONS", "Executor", "ExecutorSpec", "UnitResult", "make_executor"]


def make_executor(spec: ExecutorSpec, model: ModelSpec) -> Executor:
    """The executor class for a spec's kind (imports lazily: GPU code only where it runs)."""
    if spec.kind == "cpu":
        from autohet.executors.cpu import CpuExecutor

        return CpuExecutor(spec, model)
    if spec.kind == "gpu":
        from autohet.executors.gpu import GpuExecutor

        return GpuExecutor(spec, model)
    if spec.kind == "sim":
        from autohet.executors.sim import SimExecutor

        return SimExecutor(spec, model)
    raise ValueError(f"unknown executor kind {spec.kind!r}")
