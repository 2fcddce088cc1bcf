"""Executors: a CPU core group, a GPU (or a partition of one), and a simulated executor for tests."""

from __future__ import annotations

from autohet.executors.base import (
    BACKENDS,
    EXECUTOR_PARAMS,
    INDUCTOR_MODES,
    PRECISIONS,
    Executor,
    ExecutorSpec,
    UnitResult,
)
from autohet.executors.kinds import EXECUTOR_KINDS, ExecutorKind, executor_kind, register_executor_kind
from autohet.models import ModelSpec

__all__ = ["BACKENDS", "EXECUTOR_KINDS", "EXECUTOR_PARAMS", "INDUCTOR_MODES", "PRECISIONS", "Executor",
           "ExecutorKind", "ExecutorSpec", "UnitResult", "executor_kind", "make_executor", "register_executor_kind"]


def make_executor(spec: ExecutorSpec, model: ModelSpec) -> Executor:
    """The executor class of the spec's kind (imported lazily: GPU code only where it runs)."""
    return executor_kind(spec.kind).load_class()(spec, model)
