"""The Strategy extension point: a name, declared parameters, and ``run(pool, ctx, params)``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from autohet.objectives import RunMode
from autohet.params import Param, validate_params

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.measurement import Measurement
    from autohet.models import ModelSpec
    from autohet.pool import Pool, PoolSpec
    from autohet.strategies.served import Served
    from autohet.workload import Workload

__all__ = ["Strategy"]


class Strategy(ABC):
    """One way of using an executor pool.

    Subclasses set ``name``, ``family``, ``modes`` (the runs it serves: ``throughput``, ``latency``)
    and ``params``, and implement ``run``. ``run`` executes the real model on the pool's devices and
    returns a Measurement whose outputs were checked against the single-device reference
    (``RunContext.check``).
    """

    name: ClassVar[str]
    family: ClassVar[str]
    modes: ClassVar[tuple[RunMode, ...]] = (RunMode.THROUGHPUT,)
    params: ClassVar[dict[str, Param]] = {}
    # runs on the in-process engine (autohet.engine): the pool's executor actors are not started for it
    on_engine: ClassVar[bool] = False

    def validate(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in; unknown names and out-of-range values raise UserError."""
        return validate_params(f"strategy {self.name}", self.params, given)

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:  # noqa: B027
        """Optional hook: raise UserError when the params do not fit this pool."""

    def suggested_defaults(self, spec: PoolSpec) -> dict[str, Any]:
        """Optional hook: parameter values that suit this pool better than the declared defaults
        (e.g. chunk sizes in batches where devices differ 1000x in speed). They apply as one set,
        only when the user gives none of their keys, so a size the user sets keeps its unit."""
        return {}

    def space_sizes(self, model: ModelSpec, spec: PoolSpec) -> dict[str, int]:
        """Optional hook: lengths of this strategy's searchable vectors for ``model`` on this pool,
        by the names its space dims give as ``size`` (e.g. ``blocks``: one device per block)."""
        return {}

    def defaults_for(self, spec: PoolSpec, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` completed with the pool-suited defaults (when none of their keys is given)."""
        suggested = self.suggested_defaults(spec)
        return given if set(suggested) & set(given) else {**suggested, **given}

    @abstractmethod
    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        """Runs the workload with validated params and returns what was measured."""

    def serve(self, pool: Pool, model: ModelSpec, params: dict[str, Any], mode: str, sample: Workload) -> Served:
        """Optional hook: the validated params held ready for production calls (``strategies.served``),
        for a ``throughput`` or ``latency`` config. Everything is built here, once: executors started
        on ``pool`` (not started yet) with ``sample`` images, engine programs built, a plan the params
        do not give measured on ``sample``; a call never measures or plans."""
        from autohet.errors import UserError

        raise UserError(f"strategy {self.name} cannot serve inputs yet; export a config of another strategy")

    def plan_params(self, params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """Optional hook: parameters that rebuild the plan a run measured (its ``m.params`` and
        ``m.extra``) without planning again, e.g. ``start: given`` with the planned vectors; an
        exported config keeps them under ``plan`` and ``autohet.load`` applies them over ``params``.
        Empty when the params already say everything."""
        return {}
