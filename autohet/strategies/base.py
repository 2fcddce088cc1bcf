"""The Strategy extension point: a name, declared parameters, and ``run(pool, ctx, params)``;
``EngineStrategy``, the same for a family whose job runs on the in-process engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from autohet.core.objectives import RunMode
from autohet.core.params import ChoiceParam, Param, validate_params

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.core.measurement import Measurement
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload
    from autohet.engine import Engine, EngineJob, EngineResult, Program
    from autohet.executors import ExecutorSpec
    from autohet.pool import Pool, PoolSpec
    from autohet.strategies.served import Served

__all__ = ["EngineStrategy", "ServedBuild", "Strategy", "start_param"]


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
    # runs every image on one executor of the pool (its ``executor`` parameter): a config of it is served
    # by that executor alone, the others not started
    one_executor: ClassVar[bool] = False

    def executors_used(self, params: dict[str, Any]) -> list[int] | None:
        """The pool executors whose actors a run with ``params`` uses (None: all of them). A tune sets
        up (and compiles for) only these before the trial, the others when they are next measured or
        run: a single's new GPU setting was compiled on every GPU of its topology at once (docs/why.md,
        strategies/base.py)."""
        if self.on_engine:
            return []
        index = params.get("executor")
        return [index] if self.one_executor and isinstance(index, int) else None

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

    def serve(self, pool: Pool, model: ModelSpec, params: dict[str, Any], mode: RunMode, sample: Workload) -> Served:
        """Optional hook: the validated params held ready for production calls (``strategies.served``),
        for a ``throughput`` or ``latency`` config. Everything is built here, once: executors started
        on ``pool`` (not started yet) with ``sample`` images, engine programs built, a plan the params
        do not give measured on ``sample``; a call never measures or plans."""
        raise _cannot_serve(self.name)

    def plan_params(self, params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """Optional hook: parameters that rebuild the plan a run measured (its ``m.params`` and
        ``m.extra``) without planning again, e.g. ``start: given`` with the planned vectors; an
        exported config keeps them under ``plan`` and ``autohet.load`` applies them over ``params``.
        Empty when the params already say everything."""
        return {}


def start_param(help: str) -> ChoiceParam:
    """An engine family's ``start``: ``greedy`` (its planner, from measured costs) or ``given`` (its vectors)."""
    return ChoiceParam("start", "greedy", choices=("greedy", "given"), help=help)


def _cannot_serve(name: str) -> Exception:
    from autohet.core.errors import UserError

    return UserError(f"strategy {name} cannot serve inputs yet; export a config of another strategy")


# what a family's served form builds on its engine, once: (the program, frames in flight, the plan)
ServedBuild = Callable[["Engine"], tuple["Program", int, dict[str, Any]]]


class EngineStrategy(Strategy):
    """A family run as one job on the in-process engine (``autohet.engine``) over chosen executors
    (``devices``: the default choice is every GPU and the largest CPU group).

    A family supplies ``make_job`` (the job of a run) and ``measurement`` (the job's output as a
    Measurement); optionally ``check_devices`` (params checked against the chosen devices: in
    ``check_pool``, ``run`` and ``serve``), ``vector_sizes`` (``space_sizes`` with two devices or
    more; with fewer there is nothing to search), ``run_params`` (params completed for the run),
    ``execute`` (where the job runs) and ``served`` (what ``serve`` builds on an engine).
    """

    on_engine: ClassVar[bool] = True

    def chosen(self, pool: Pool, params: dict[str, Any]) -> list[ExecutorSpec]:
        """The executors ``devices`` names (or the default choice), checked."""
        from autohet.strategies._inprocess import chosen_devices

        specs = chosen_devices(pool, params, self.name)
        self.check_devices(params, [s.name for s in specs])
        return specs

    def check_devices(self, params: dict[str, Any], devices: list[str]) -> None:  # noqa: B027
        """Optional hook: raise UserError when the params do not fit these devices (names, in order)."""

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:
        self.chosen(pool, params)

    def space_sizes(self, model: ModelSpec, spec: PoolSpec) -> dict[str, int]:
        """The family's ``vector_sizes`` for the default devices; none with fewer than two of them."""
        from autohet.strategies._inprocess import default_devices

        devices = len(default_devices(spec))
        return self.vector_sizes(model, spec, devices) if devices >= 2 else {}

    def vector_sizes(self, model: ModelSpec, spec: PoolSpec, devices: int) -> dict[str, int]:
        """Optional hook: ``space_sizes`` over ``devices`` (two or more) default devices."""
        return {}

    def run_params(self, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any]) -> dict[str, Any]:
        """Optional hook: the params a run's job and measurement use (defaults that depend on the run)."""
        return params

    @abstractmethod
    def make_job(self, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any]) -> EngineJob:
        """The job that measures the run on an engine over ``specs``' devices."""

    def execute(self, pool: Pool, ctx: RunContext, specs: list[ExecutorSpec], job: EngineJob) -> EngineResult:
        """The job's output: on the pool's devices, cut past the run's deadline (``run_on_engine``)."""
        from autohet.strategies._inprocess import run_on_engine

        return run_on_engine(pool, job, specs, ctx.deadline_s, self.name)

    @abstractmethod
    def measurement(self, pool: Pool, ctx: RunContext, specs: list[ExecutorSpec], params: dict[str, Any],
                    out: EngineResult) -> Measurement:
        """The job's output as the run's Measurement (outputs checked, reports, ``m.extra``)."""

    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        specs = self.chosen(pool, params)
        params = self.run_params(ctx, specs, params)
        out = self.execute(pool, ctx, specs, self.make_job(ctx, specs, params))
        return self.measurement(pool, ctx, specs, params, out)

    def served(self, pool: Pool, specs: list[ExecutorSpec], model: ModelSpec, params: dict[str, Any],
               mode: RunMode, sample: Workload) -> tuple[ServedBuild, int]:
        """Optional hook: what ``serve`` builds on an engine of this process, and the frame size."""
        raise _cannot_serve(self.name)

    def serve(self, pool: Pool, model: ModelSpec, params: dict[str, Any], mode: RunMode, sample: Workload) -> Served:
        """The family's program on an engine of this process over the chosen executors (``served``)."""
        from autohet.strategies._inprocess import serve_on_engine

        specs = self.chosen(pool, params)
        build, batch = self.served(pool, specs, model, params, mode, sample)
        return serve_on_engine(specs, build, batch)
