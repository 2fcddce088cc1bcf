"""The Strategy extension point: a name, declared parameters, and ``run(pool, workload, params)``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from autohet.params import Param, validate_params

if TYPE_CHECKING:
    from autohet.measurement import Measurement
    from autohet.pool import Pool
    from autohet.run import RunContext

__all__ = ["Strategy"]


class Strategy(ABC):
    """One way of using an executor pool.

    Subclasses set ``name``, ``family``, ``objective`` and ``params`` and implement ``run``.
    ``run`` must execute the real model on the pool's executors and return a Measurement whose
    outputs were checked against the single-device reference (``RunContext.check``).
    """

    name: ClassVar[str]
    family: ClassVar[str]
    objective: ClassVar[str] = "throughput"  # or "latency"
    params: ClassVar[dict[str, Param]] = {}

    def validate(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in; unknown names and out-of-range values raise UserError."""
        return validate_params(f"strategy {self.name}", self.params, given)

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:  # noqa: B027
        """Optional hook: raise UserError when the params do not fit this pool."""

    @abstractmethod
    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        """Runs the workload with validated params and returns what was measured."""
