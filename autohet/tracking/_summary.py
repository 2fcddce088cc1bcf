"""Reading a tune back: the best valid trial per strategy, status counts, the Pareto front."""

from __future__ import annotations

from typing import Any

from autohet.core.objectives import ObjectiveSet, TrialKey
from autohet.tracking._status import STATUSES

__all__ = ["final_pick", "front", "run_status", "summarize"]


def run_status(run: Any) -> str:
    """A trial run's status (older runs without the tag: from their valid tag)."""
    status = run.data.tags.get("status")
    if status in STATUSES:
        return status
    return "ok" if run.data.tags.get("valid") == "true" else "invalid"


def summarize(runs: list[Any], objectives: ObjectiveSet | str) -> list[dict[str, Any]]:
    """Per strategy: trials by status and the best ``ok`` trial by the first objective; best first."""
    objectives = ObjectiveSet.parse(objectives)
    primary = objectives.primary
    rows: dict[str, dict[str, Any]] = {}
    for run in runs:
        strategy = run.data.tags.get("strategy", "?")
        row = rows.setdefault(strategy, {"strategy": strategy, "trials": 0, **dict.fromkeys(STATUSES, 0),
                                         "best": None, "run_id": None, "efficiency": None})
        status = run_status(run)
        row[status] += 1
        if status == "killed":
            continue
        row["trials"] += 1
        if status != "ok":
            continue
        value = primary.value(run.data.metrics)
        if value is None:
            continue
        if row["best"] is None or primary.better(value, row["best"]):
            row.update(best=value, run_id=run.info.run_id, efficiency=run.data.metrics.get("efficiency"),
                       params={k: v for k, v in run.data.params.items() if k.startswith(strategy + ".")})
    out = list(rows.values())
    out.sort(key=lambda r: (r["best"] is None, primary.rank(r["best"] or 0.0)))
    return out


def front(runs: list[Any], objectives: ObjectiveSet) -> list[Any]:
    """The ``ok`` trials no other ``ok`` trial dominates on every objective (all measured)."""
    scored = []
    for run in runs:
        if run_status(run) != "ok":
            continue
        values = [o.value(run.data.metrics) for o in objectives.objectives]
        if all(v is not None for v in values):
            scored.append((run, values))
    keep = objectives.front([v for _, v in scored])
    return [scored[i][0] for i in keep]


def final_pick(runs: list[Any], objectives: ObjectiveSet) -> Any | None:
    """The finals' winner: among the trials of the tune that holds the best ok trial of ``runs``, the
    ok one with the best median over the finals (``TrialKey.FINAL``, the first objective's figure);
    None where that tune held no finals."""
    primary = objectives.primary
    ok = [(primary.value(run.data.metrics), run) for run in runs if run_status(run) == "ok"]
    ok = [(v, run) for v, run in ok if v is not None]
    if not ok:
        return None
    tune = min(ok, key=lambda vr: primary.rank(vr[0]))[1].data.tags.get("mlflow.parentRunId")
    scored = [(run.data.metrics[TrialKey.FINAL], run) for _, run in ok
              if TrialKey.FINAL in run.data.metrics and run.data.tags.get("mlflow.parentRunId") == tune]
    return min(scored, key=lambda vr: primary.rank(vr[0]))[1] if scored else None
