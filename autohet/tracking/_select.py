"""Picking one trial of a tune by constraints: the best by the first objective among the ok
trials that meet every bound given (``autohet export --max-watts/--min-ips/--max-ms``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autohet.core.errors import UserError
from autohet.core.objectives import ENERGY, LATENCY, THROUGHPUT, ObjectiveSet, TrialKey
from autohet.tracking._summary import run_status

__all__ = ["CONSTRAINTS", "Constraint", "constraints_from", "pick_trial"]


@dataclass(frozen=True)
class Constraint:
    """A bound on one trial metric: ``upper`` means at most ``bound``, else at least."""

    option: str
    metric: str
    upper: bool
    unit: str
    bound: float = 0.0

    def met(self, metrics: dict[str, float]) -> bool:
        value = metrics.get(self.metric)
        if value is None:
            return False
        return value <= self.bound if self.upper else value >= self.bound

    def achievable(self, runs: list[Any]) -> str:
        """The best value of this metric among ``runs``, as the error names it."""
        values = [r.data.metrics[self.metric] for r in runs if self.metric in r.data.metrics]
        return f"{min(values) if self.upper else max(values):.4g} {self.unit} for {self.option}"

    def __str__(self) -> str:
        return f"{self.option} {self.bound:g}"


# keyword -> the bound it sets (power_avg_w: all readable devices, over the run's timed seconds)
CONSTRAINTS = {
    "max_watts": Constraint("--max-watts", TrialKey.POWER_AVG, True, "W"),
    "min_ips": Constraint("--min-ips", THROUGHPUT.metric, False, THROUGHPUT.unit),
    "max_ms": Constraint("--max-ms", LATENCY.metric, True, LATENCY.unit),
}


def constraints_from(given: dict[str, float | None]) -> list[Constraint]:
    """The constraints among ``given`` (keyword -> bound or None) that are set."""
    from dataclasses import replace

    out = []
    for key, bound in given.items():
        if bound is None:
            continue
        if bound < 0:
            raise UserError(f"{CONSTRAINTS[key].option} must be at least 0, got {bound:g}")
        out.append(replace(CONSTRAINTS[key], bound=float(bound)))
    return out


def _why_unmeasured(runs: list[Any], metric: str, objectives: ObjectiveSet) -> str:
    """What the trials say about a figure they lack: their unavailable.* tags for it, if any."""
    if metric == LATENCY.metric and not objectives.mode.per_request:
        return f"a {objectives.name} tune times no batch-1 requests: tune with --objective latency or latency,energy"
    family = "energy" if metric in (TrialKey.POWER_AVG, ENERGY.metric) else metric.split("_")[0]
    reasons = sorted({f"{k.split('.', 1)[1]}: {v}" for r in runs for k, v in r.data.tags.items()
                      if k.startswith(f"unavailable.{family}")})
    return "; ".join(reasons[:3]) if reasons else "no trial recorded it"


def pick_trial(runs: list[Any], objectives: ObjectiveSet, constraints: list[Constraint], experiment: str) -> Any:
    """The best ok trial by the first objective among those meeting every constraint. None meeting
    them: a UserError naming the best value each bound could have had."""
    ok = [r for r in runs if run_status(r) == "ok"]
    if not ok:
        raise UserError(f"experiment {experiment} has no valid trial to export")
    for c in constraints:
        if not any(c.metric in r.data.metrics for r in ok):
            raise UserError(f"{c.option}: no ok trial of experiment {experiment} measured {c.metric} "
                            f"({_why_unmeasured(ok, c.metric, objectives)}); drop {c.option} or tune where it "
                            "is measured")
    primary = objectives.primary
    meeting = [(primary.value(r.data.metrics), r) for r in ok if all(c.met(r.data.metrics) for c in constraints)]
    meeting = [(v, r) for v, r in meeting if v is not None]
    if not meeting:
        best = ", ".join(c.achievable(ok) for c in constraints)
        alone = all(any(c.met(r.data.metrics) for r in ok) for c in constraints)
        raise UserError(f"no ok trial of experiment {experiment} meets {' '.join(map(str, constraints))}: "
                        f"best achievable: {best}" + (" (each on its own, not together)" if alone else ""))
    return min(meeting, key=lambda vr: primary.rank(vr[0]))[1]
