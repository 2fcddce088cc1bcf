"""Executor kinds by name: what class runs each, which executor parameters apply, what it needs.

One registry, as strategies have: pool files, the tuner's spaces and Ray placement all ask it
instead of naming cpu/gpu/sim themselves. A kind joins with ``register_executor_kind``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from autohet.errors import unknown_name

__all__ = ["EXECUTOR_KINDS", "ExecutorKind", "executor_kind", "register_executor_kind"]


@dataclass(frozen=True)
class ExecutorKind:
    """``target`` is ``module:Class``; ``params`` the executor parameters a trial may vary for it."""

    name: str
    target: str
    params: tuple[str, ...]
    simulated: bool = False
    needs_cores: bool = False

    def load_class(self) -> type:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)


EXECUTOR_KINDS: dict[str, ExecutorKind] = {
    "cpu": ExecutorKind("cpu", "autohet.executors.cpu:CpuExecutor",
                        ("batch", "precision", "channels_last", "backend", "inductor_mode", "streams"),
                        needs_cores=True),
    "gpu": ExecutorKind("gpu", "autohet.executors.gpu:GpuExecutor",
                        ("batch", "precision", "channels_last", "backend", "inductor_mode", "sms")),
    "sim": ExecutorKind("sim", "autohet.executors.sim:SimExecutor", ("batch",), simulated=True),
}


def executor_kind(name: str) -> ExecutorKind:
    if name not in EXECUTOR_KINDS:
        raise unknown_name("executor kind", name, list(EXECUTOR_KINDS))
    return EXECUTOR_KINDS[name]


def register_executor_kind(kind: ExecutorKind) -> None:
    EXECUTOR_KINDS[kind.name] = kind
