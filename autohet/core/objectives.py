"""Objectives: what a tune optimises, one small type each, combinable into a Pareto search.

An objective names the trial metric it reads, its direction and unit, and the kind of run it
needs: ``throughput`` (a stream of images through the pool) or ``latency`` (batch-1 requests one
after another). ``energy`` (joules per image) is measured in either run. Two objectives give a
Pareto front (``ObjectiveSet``); one objective compares trials by ``better``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from autohet.core.errors import UserError, unknown_name

__all__ = ["ENERGY", "LATENCY", "OBJECTIVES", "PRIMARY_METRIC", "RUN_MODES", "THROUGHPUT", "Objective", "ObjectiveSet",
           "RunMode", "TrialKey"]

T = TypeVar("T")


class RunMode(str, Enum):
    """The two kinds of run a strategy can serve, each owning what differs between them: a throughput
    run streams every image through the pool in frames of the tuned batch; a latency run times
    batch-1 requests one by one. A str (it compares equal to its name and stores as it in configs)."""

    THROUGHPUT = "throughput"
    LATENCY = "latency"

    def __str__(self) -> str:
        return self.value

    @property
    def per_request(self) -> bool:
        """Images are requests of one, timed one by one (latency), not a stream."""
        return self is RunMode.LATENCY

    def frame(self, batch: int) -> int:
        """Images per frame: one per request in a latency run, ``batch`` in a throughput run."""
        return 1 if self is RunMode.LATENCY else int(batch)

    def pick(self, latency: T, throughput: T) -> T:
        """The one of two things that belongs to this kind of run (a figure's key, a direction)."""
        return latency if self is RunMode.LATENCY else throughput


RUN_MODES = tuple(RunMode)

class TrialKey:
    """The keys of a trial's figures as the trial reports them to Tune and MLflow logs them, spelled once."""

    THROUGHPUT = "throughput_ips"
    LIMIT = "limit_ips"
    EFFICIENCY = "efficiency"
    MAX_ABS_DIFF = "max_abs_diff"
    WALL = "wall_s"
    IMAGES = "images"
    SIMULATED = "simulated"
    LATENCY_P50 = "latency_p50_ms"
    ENERGY_PER_IMAGE = "energy_j_per_image"  # these three: ``meter.EnergyResult``'s figures
    POWER_AVG = "power_avg_w"
    TEMP_MAX = "temp_max_c"
    PRIMARY = "objective_value"  # the first objective's figure, as the searcher reads it
    BEST_PRIMARY = "best_objective_value"  # the parent run's: the best trial's PRIMARY
    FINAL = "final_objective_value"  # a finalist's median PRIMARY over the finals (autohet.tuning.finals)
    PHASE_PREFIX = "time."  # where a trial's seconds went: ``phase(name)``
    ACQUIRE = "time.acquire_s"
    STANDALONE = "time.standalone_s"
    COOL = "time.cool_s"
    COMPILE = "time.compile_s"
    TRIAL = "time.trial_s"
    RUN = "time.run_s"
    REFERENCE = "time.reference_s"  # computing reference outputs this trial's check needed (inside RUN)
    REFERENCE_COMPUTED = "check.reference_computed"  # images whose reference this trial computed
    REFERENCE_REUSED = "check.reference_reused"  # images whose reference the tuner or an earlier trial had

    @staticmethod
    def latency(stat: str) -> str:
        """A latency percentile's key: ``latency("p95")`` is ``latency_p95_ms``."""
        return f"latency_{stat}_ms"

    @staticmethod
    def objective(name: str) -> str:
        """An objective's figure as the searcher reads it: ``objective.<name>``."""
        return f"objective.{name}"

    @staticmethod
    def share(executor: str) -> str:
        """The share of the images an executor ran."""
        return f"share.{executor}"

    @staticmethod
    def busy(executor: str) -> str:
        """The share of the run's wall time an executor was busy (summed from its units)."""
        return f"busy.{executor}"

    @staticmethod
    def busy_estimated(executor: str) -> str:
        """The same share where the run could only estimate it (``ExecutorReport.busy_estimated``)."""
        return f"busy_est.{executor}"


# The first objective's figure as the searcher reads it in a trial's results (and MLflow logs it).
PRIMARY_METRIC = TrialKey.PRIMARY


@dataclass(frozen=True)
class Objective:
    """One figure to optimise: ``metric`` in a trial's metrics, ``direction`` max or min."""

    name: str
    direction: str
    unit: str
    metric: str
    mode: RunMode | None  # the run it needs; None: measured in any run

    @property
    def key(self) -> str:
        """This objective's figure as the searcher reads it in a trial's results (and MLflow logs it)."""
        return TrialKey.objective(self.name)

    @property
    def worst(self) -> float:
        """The value a trial without this figure reports to the searcher: never the best."""
        return 0.0 if self.direction == "max" else 1e12

    def value(self, metrics: Mapping[str, float]) -> float | None:
        """This objective's figure in ``metrics``, or None when the trial did not measure it."""
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(float(value)):
            return None
        return float(value)

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` beats ``b``."""
        return a > b if self.direction == "max" else a < b

    def share_of(self, value: float, best: float) -> float:
        """How close ``value`` comes to ``best``: 1.0 at it, 0.5 at half the throughput or twice the
        latency."""
        if value <= 0 or best <= 0:
            return 0.0
        return value / best if self.direction == "max" else best / value

    def rank(self, value: float) -> float:
        """A sort key that puts the best value first (ascending)."""
        return -value if self.direction == "max" else value

    def best_of(self, values: Iterable[float]) -> float | None:
        items = list(values)
        if not items:
            return None
        return max(items) if self.direction == "max" else min(items)


THROUGHPUT = Objective("throughput", "max", "img/s", TrialKey.THROUGHPUT, RunMode.THROUGHPUT)
LATENCY = Objective("latency", "min", "ms p50", TrialKey.LATENCY_P50, RunMode.LATENCY)
ENERGY = Objective("energy", "min", "J/img", TrialKey.ENERGY_PER_IMAGE, None)
OBJECTIVES: dict[str, Objective] = {o.name: o for o in (THROUGHPUT, LATENCY, ENERGY)}


@dataclass(frozen=True)
class ObjectiveSet:
    """The objectives of one tune (one, or two for a Pareto front) and the run they need."""

    objectives: tuple[Objective, ...]

    @classmethod
    def parse(cls, given: str | Sequence[str] | ObjectiveSet) -> ObjectiveSet:
        """``"throughput"``, ``"latency,energy"``...: unknown names list the valid ones."""
        if isinstance(given, ObjectiveSet):
            return given
        names = [n.strip() for n in (given.split(",") if isinstance(given, str) else given) if n.strip()]
        if not names:
            raise UserError(f"--objective needs a name; valid: {', '.join(OBJECTIVES)}")
        for name in names:
            if name not in OBJECTIVES:
                raise unknown_name("objective", name, list(OBJECTIVES))
        if len(set(names)) != len(names) or len(names) > 2:
            raise UserError(f"--objective takes one or two different objectives, got {','.join(names)}; "
                            "e.g. throughput,energy")
        modes = {OBJECTIVES[n].mode for n in names} - {None}
        if len(modes) > 1:
            raise UserError("throughput and latency need different runs; pair either with energy instead "
                            "(throughput,energy or latency,energy)")
        return cls(tuple(OBJECTIVES[n] for n in names))

    @property
    def name(self) -> str:
        return ",".join(o.name for o in self.objectives)

    @property
    def primary(self) -> Objective:
        return self.objectives[0]

    @property
    def mode(self) -> RunMode:
        """The run every trial makes: latency when an objective needs it, else throughput."""
        return RunMode.LATENCY if RunMode.LATENCY in {o.mode for o in self.objectives} else RunMode.THROUGHPUT

    @property
    def multi(self) -> bool:
        return len(self.objectives) > 1

    @property
    def meters_energy(self) -> bool:
        """An objective is read from the energy meter, which counts every GPU of the pool and the CPU
        packages during a run: work beside the trial (``autohet.tuning.ahead``) would count in it."""
        return ENERGY in self.objectives

    @property
    def search_metric(self) -> str | list[str]:
        """The result keys the searcher optimises: every objective's for a front, else the primary's."""
        return [o.key for o in self.objectives] if self.multi else PRIMARY_METRIC

    @property
    def search_mode(self) -> str | list[str]:
        """Their directions, in the same form."""
        return [o.direction for o in self.objectives] if self.multi else self.primary.direction

    def values(self, metrics: Mapping[str, float]) -> list[float]:
        """One number per objective for the searcher; a figure not measured counts as the worst."""
        out = []
        for o in self.objectives:
            value = o.value(metrics)
            out.append(o.worst if value is None else value)
        return out

    def dominates(self, a: Sequence[float], b: Sequence[float]) -> bool:
        """Pareto dominance: ``a`` no worse on every objective and better on one."""
        no_worse = all(not o.better(y, x) for o, x, y in zip(self.objectives, a, b, strict=True))
        return no_worse and any(o.better(x, y) for o, x, y in zip(self.objectives, a, b, strict=True))

    def front(self, points: Sequence[Sequence[float]]) -> list[int]:
        """Indices of the non-dominated points (ties kept)."""
        return [i for i, p in enumerate(points)
                if not any(self.dominates(q, p) for j, q in enumerate(points) if j != i)]
