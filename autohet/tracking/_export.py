"""Exporting trials as configs that production runs load, and recording a tune's outcome."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autohet.config import load_config, write_config
from autohet.core.errors import UserError
from autohet.core.objectives import ObjectiveSet, TrialKey
from autohet.tracking._store import trial_runs
from autohet.tracking._summary import final_pick, front, run_status, summarize

__all__ = ["TuneOutcome", "export_run", "record_outcome"]


def _param_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def export_run(client: Any, run_id: str, out: Path, platform: dict[str, Any] | None, experiment: str) -> dict:
    """Writes the trial's config (schema-versioned YAML) with its MLflow run id and platform."""
    from mlflow.artifacts import download_artifacts

    run = client.get_run(run_id)
    if run.data.tags.get("autohet_kind") != "trial":
        raise UserError(f"run {run_id} is not an autohet trial; pick a trial run id from `autohet compare`")
    status = run_status(run)
    if status != "ok":
        raise UserError(f"trial {run_id} is {status}, not a valid result; export an ok trial (see `autohet compare`)")
    try:
        local = download_artifacts(run_id=run_id, artifact_path="config.yaml", tracking_uri=client.tracking_uri)
    except Exception as exc:
        raise UserError(f"trial {run_id} has no config.yaml (it failed before running: "
                        f"{run.data.tags.get('error', 'no measurement')[:200]})") from exc
    config = load_config(local)
    config.mlflow = {"experiment": experiment, "run_id": run_id}
    if platform is not None:
        config.platform = platform
    else:
        parent = client.get_run(run.data.tags["mlflow.parentRunId"]).data.params
        if "platform.cpu_model" in parent:
            config.platform = {k.split(".", 1)[1]: _param_value(v) for k, v in parent.items()
                               if k.startswith("platform.")}
    write_config(config, out)
    return config.to_dict()


@dataclass
class TuneOutcome:
    experiment: str
    parent_run_id: str
    best_path: Path | None
    best: dict[str, Any] | None
    summary: list[dict[str, Any]]
    trials_done: int
    front: list[dict[str, Any]]
    front_note: str | None = None  # why a two-objective tune has no front (a figure never measured)


def record_outcome(client: Any, experiment: str, experiment_id: str, parent_id: str, objectives: ObjectiveSet,
                   exp_dir: Path, platform: dict[str, Any]) -> TuneOutcome:
    """Exports the best valid trial (the finals' winner where they ran, else the first objective's
    best trial; with two objectives the front is tagged ``pareto`` and plotted), logs the comparison
    plot, and returns the tune's outcome. The front holds only trials that measured every objective:
    where energy could not be read, it is empty and ``front_note`` says why (the trials'
    ``unavailable.*`` reasons)."""
    from autohet.tracking.plots import comparison_figure, pareto_figure

    runs = trial_runs(client, experiment_id, parent_id)
    rows = summarize(runs, objectives)
    valid = [r for r in rows if r["best"] is not None]
    best_path, best = None, None
    front_rows: list[dict[str, Any]] = []
    front_note: str | None = None
    if objectives.multi:
        points = front(runs, objectives)
        for run in points:
            client.set_tag(run.info.run_id, "pareto", "true")
            front_rows.append({"run_id": run.info.run_id, "strategy": run.data.tags.get("strategy"),
                               **{o.name: o.value(run.data.metrics) for o in objectives.objectives}})
        front_rows.sort(key=lambda r: objectives.primary.rank(r[objectives.primary.name]))
        if front_rows:
            fig = pareto_figure(runs, points, objectives, f"{experiment}: Pareto front")
            client.log_figure(parent_id, fig, "pareto.png")
        else:
            front_note = _no_front(runs, objectives)
            client.set_tag(parent_id, "pareto", front_note[:5000])
    if valid:
        chosen = final_pick(runs, objectives) if not objectives.multi else None  # the finals' winner
        best_row = valid[0] if chosen is None else {
            "run_id": chosen.info.run_id, "strategy": chosen.data.tags.get("strategy", "?"),
            "best": objectives.primary.value(chosen.data.metrics)}
        best_path = exp_dir / "best.yaml"
        best = export_run(client, best_row["run_id"], best_path, platform, experiment)
        client.log_artifact(parent_id, str(best_path))
        fig = comparison_figure({r["strategy"]: r["best"] for r in valid}, objectives.primary.metric,
                                f"{experiment}: best valid trial per strategy")
        client.log_figure(parent_id, fig, "comparison.png")
        client.log_metric(parent_id, TrialKey.BEST_PRIMARY, float(best_row["best"]))
        client.set_tag(parent_id, "best_run_id", best_row["run_id"])
        client.set_tag(parent_id, "best_strategy", best_row["strategy"])
    return TuneOutcome(experiment, parent_id, best_path, best, rows, len(runs), front_rows, front_note)


def _no_front(runs: list[Any], objectives: ObjectiveSet) -> str:
    """Why no trial is on the front: no ok trial, or the objectives no ok trial measured (and why)."""
    ok = [r for r in runs if run_status(r) == "ok"]
    if not ok:
        return "no Pareto front: no ok trial"
    missing = [o for o in objectives.objectives if not any(o.value(r.data.metrics) is not None for r in ok)]
    parts = []
    for o in missing:
        family = o.metric.split("_")[0]
        reasons = sorted({f"{k.split('.', 1)[1]}: {v}" for r in ok for k, v in r.data.tags.items()
                          if k.startswith(f"unavailable.{family}")})
        why = f" ({'; '.join(reasons)})" if reasons else ""
        parts.append(f"{o.name} ({o.metric}) was measured in no ok trial{why}")
    return "no Pareto front: " + ("; ".join(parts) or "no ok trial measured every objective")
