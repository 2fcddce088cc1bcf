"""Simulated executors on a virtual clock (tests and planning; always labelled simulated)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autohet.core.models import ModelSpec
from autohet.core.workload import Workload
from autohet.pool.base import Pool
from autohet.pool.dispatch import Dispatcher, VirtualClockDispatcher
from autohet.pool.spec import PoolSpec

if TYPE_CHECKING:
    pass

__all__ = ["VirtualPool"]


class VirtualPool(Pool):
    """Simulated executors on a virtual clock: deterministic figures, always labelled simulated."""

    def __init__(self, spec: PoolSpec, die_at: dict[int, float] | None = None) -> None:
        super().__init__(spec)
        self.die_at = die_at or {}

    def start(self, model: ModelSpec, workload: Workload) -> float:
        self.started_for = (model, workload.images)
        return 0.0

    def set_workload(self, workload: Workload) -> list[int]:
        return []  # simulated units read no images

    def dispatcher(self) -> Dispatcher:
        execs = self.spec.executors
        return VirtualClockDispatcher(self.names, [e.speed_ips for e in execs], [e.overhead_s for e in execs],
                                      self.die_at, [e.needs_gpu for e in execs])

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        out = []
        chosen = range(len(self.spec.executors)) if indices is None else indices
        for e in (self.spec.executors[i] for i in chosen):
            unit = max(1, min(e.batch, max_images or e.batch))
            out.append(unit / (e.overhead_s + unit / e.speed_ips))
        return out


