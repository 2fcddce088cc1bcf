"""What a run measured: throughput against the limit, per-executor figures, the timeline, the check."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ExecutorReport", "Measurement", "WorkUnit", "percentile"]


@dataclass
class WorkUnit:
    """One work unit as the driver saw it: seconds since the run started."""

    executor: str
    start_image: int
    size: int
    start_s: float
    end_s: float
    compute_s: float
    ok: bool = True


@dataclass
class ExecutorReport:
    """One executor's part of a run. ``busy_estimated``: ``busy_s`` is an estimate (a few timed frames
    scaled to the run's, or a stage's frame time where no timeline came back), not the sum of the run's
    own units; reports print it marked and MLflow logs it as ``busy_est.<executor>``."""

    name: str
    device: str
    images: int = 0
    busy_s: float = 0.0
    standalone_ips: float = 0.0
    simulated: bool = False
    died: bool = False
    busy_estimated: bool = False


@dataclass
class Measurement:
    """One run's figures. ``simulated`` is true when any executor was simulated."""

    model: str
    strategy: str
    params: dict[str, Any]
    images: int
    wall_s: float
    throughput_ips: float
    limit_ips: float | None  # None where no bound was measured (latency runs)
    efficiency: float | None
    output_ok: bool
    max_abs_diff: float
    tolerance: float
    executors: list[ExecutorReport]
    timeline: list[WorkUnit] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    simulated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def waste(self) -> float | None:
        return None if self.efficiency is None else 1.0 - self.efficiency

    def losses(self) -> dict[str, dict[str, float]]:
        """Where the gap to the limit went, per executor, as shares of limit x wall (all shares
        add up to the waste): ``before`` its first unit, ``between`` units, ``after`` its last
        (idle time, weighted by its standalone speed), and ``slow``: images short of its
        standalone speed while it had a unit (round trips, host contention, partial batches)."""
        out: dict[str, dict[str, float]] = {}
        scale = (self.limit_ips or 0.0) * self.wall_s
        if scale <= 0:
            return out
        for e in self.executors:
            units = sorted((u for u in self.timeline if u.executor == e.name and u.ok), key=lambda u: u.start_s)
            v = e.standalone_ips
            if not units:
                out[e.name] = {"before": v * self.wall_s / scale, "between": 0.0, "after": 0.0, "slow": 0.0}
                continue
            gaps = sum(max(0.0, b.start_s - a.end_s) for a, b in zip(units, units[1:], strict=False))
            busy = sum(u.end_s - u.start_s for u in units)
            out[e.name] = {"before": v * units[0].start_s / scale, "between": v * gaps / scale,
                           "after": v * max(0.0, self.wall_s - units[-1].end_s) / scale,
                           "slow": (v * busy - e.images) / scale}
        return out

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        out = asdict(self)
        out["waste"] = self.waste
        if not timeline:
            out.pop("timeline")
        return out

    def to_json(self, timeline: bool = False) -> str:
        return json.dumps(self.to_dict(timeline), default=float)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
