"""Executors: a CPU core group, a GPU (or a partition of one), and a simulated executor for tests."""

from __future__ import annotations

from autohet.core.models import ModelSpec
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

__all__ = ["BACKENDS", "EXECUTOR_KINDS", "EXECUTOR_PARAMS", "INDUCTOR_MODES", "PRECISIONS", "Executor",
           "ExecutorKind", "ExecutorSpec", "UnitResult", "executor_kind", "make_executor", "register_executor_kind",
           "runs_ahead"]


def runs_ahead(spec: ExecutorSpec) -> bool:
    """Whether the executor queues its next unit behind the current one when told it
    (``Executor.run_ahead``): a GPU, or a CPU group whose backend runs asynchronously (OpenVINO's infer
    requests). The dispatcher names the next unit to these while the current one drains
    (``Dispatcher.lookahead``). Here, not on the spec: the backends sit above the spec's module."""
    if spec.uses_gpu:
        return True
    if not spec.is_cpu:
        return False
    from autohet.executors.cpu_backends import CPU_BACKENDS, cpu_backend

    return spec.backend in CPU_BACKENDS and cpu_backend(spec.backend).asynchronous


def make_executor(spec: ExecutorSpec, model: ModelSpec) -> Executor:
    """The executor class of the spec's kind (imported lazily: GPU code only where it runs)."""
    return executor_kind(spec.kind).load_class()(spec, model)
