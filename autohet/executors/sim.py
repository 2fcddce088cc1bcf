"""A simulated executor with a given speed and per-call overhead, for tests and planning only.

Its outputs encode the image index (output[i] == i), so ordering and exactly-once can be
checked; every measurement that includes it is labelled simulated.
"""

from __future__ import annotations

import time

import numpy as np

from autohet.core.workload import Workload
from autohet.executors.base import Executor, UnitResult

__all__ = ["SimExecutor", "sim_outputs"]


def sim_outputs(start: int, size: int) -> np.ndarray:
    """What a simulated executor returns for images [start, start + size)."""
    return np.arange(start, start + size, dtype=np.float32).reshape(size, 1)


class SimExecutor(Executor):
    simulated = True

    def load(self, workload: Workload) -> None:
        if self.spec.speed_ips <= 0:
            from autohet.core.errors import UserError

            raise UserError(f"simulated executor {self.spec.name} needs speed_ips > 0 in the pool file")
        self.workload = workload
        self.units = 0

    def duration(self, size: int) -> float:
        """Seconds a unit of ``size`` images takes: overhead + size / speed."""
        return self.spec.overhead_s + size / self.spec.speed_ips

    runs_staged = True

    def launch_staged(self, staged: object, start: int, count: int) -> UnitResult:
        return self.run(start, count)

    def run(self, start: int, size: int) -> UnitResult:
        self.units += 1
        die_after = self.spec.extra.get("die_after_units")
        if die_after is not None and self.units > die_after:
            import os

            os._exit(1)  # fault injection for tests: the process dies like a killed actor
        seconds = self.duration(size)
        time.sleep(seconds)
        return UnitResult(sim_outputs(start, size), seconds)

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None) -> float:
        unit = max(1, min(self.spec.batch, max_images or self.spec.batch))
        return unit / self.duration(unit)
