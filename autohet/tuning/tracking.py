"""MLflow: the embedded sqlite store under runs/, one parent run per tune, one child per trial."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["TrialLogger", "artifact_location", "default_tracking_uri", "ensure_experiment", "experiment_runs",
           "mlflow_client", "trial_runs", "tune_objective"]


def default_tracking_uri() -> str:
    """sqlite under runs/ (MLflow's file store is deprecated)."""
    runs = Path("runs").resolve()
    runs.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{runs / 'mlflow.db'}"


def artifact_location(experiment: str) -> str:
    return (Path("runs").resolve() / "mlartifacts" / experiment).as_uri()


def mlflow_client(uri: str | None):
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("alembic", "mlflow", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri or default_tracking_uri())


def ensure_experiment(client: Any, name: str, uri: str | None) -> str:
    """The experiment's id; a new local one gets its artifacts under runs/mlartifacts/<name>."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    local = uri is None or uri.startswith("sqlite:")
    return client.create_experiment(name, artifact_location=artifact_location(name) if local else None)


def trial_runs(client: Any, experiment_id: str, parent_run_id: str | None = None) -> list[Any]:
    """Every trial run of the experiment (of one tune when ``parent_run_id`` is given)."""
    query = "tags.autohet_kind = 'trial'"
    if parent_run_id:
        query += f" and tags.mlflow.parentRunId = '{parent_run_id}'"
    return client.search_runs([experiment_id], filter_string=query, max_results=50000)


def experiment_runs(name: str, uri: str | None) -> tuple[Any, Any, list[Any]]:
    """(client, experiment, its trial runs); an unknown experiment lists the known ones."""
    from autohet.errors import UserError

    client = mlflow_client(uri)
    found = client.get_experiment_by_name(name)
    if found is None:
        names = [e.name for e in client.search_experiments()]
        raise UserError(f"no experiment {name!r} in the tracking store; known: {', '.join(names) or 'none'}")
    return client, found, trial_runs(client, found.experiment_id)


def tune_objective(client: Any, runs: list[Any]) -> str:
    """The objective the trials' tune optimised (recorded on the parent run)."""
    parent_id = runs[0].data.tags.get("mlflow.parentRunId") if runs else None
    if parent_id:
        return client.get_run(parent_id).data.params.get("objective", "throughput")
    return "throughput"


class TrialLogger:
    """Logs one finished trial as a nested run: params, metrics, check result, timeline PNG, config."""

    def __init__(self, uri: str | None, experiment_id: str, parent_run_id: str, fingerprint: dict[str, Any]):
        self.uri = uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.fingerprint = fingerprint

    def log(self, index: int, config: dict[str, Any], result: dict[str, Any], tune_trial_id: str = "") -> str:
        from mlflow.entities import Metric, Param, RunTag

        from autohet.tuning.plots import timeline_figure

        client = mlflow_client(self.uri)
        strategy = result.get("strategy") or config.get("strategy", "?")
        valid = bool(result.get("valid"))
        run = client.create_run(self.experiment_id, run_name=f"trial-{index:03d}-{strategy}", tags={
            "mlflow.parentRunId": self.parent_run_id, "autohet_kind": "trial", "strategy": strategy,
            "valid": str(valid).lower(), "simulated": str(bool(result.get("simulated"))).lower(),
            "output_check": "passed" if valid else "failed", "trial_index": str(index),
            "tune_trial_id": tune_trial_id})
        run_id = run.info.run_id
        params = [Param("strategy", strategy)] + [
            Param(k, str(v)[:6000]) for k, v in sorted(config.items()) if k != "strategy"]
        metrics = [Metric(k, float(v), 0, 0) for k, v in result.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        tags = [RunTag("error", str(result["error"])[:5000])] if result.get("error") else []
        client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        if result.get("measurement"):
            client.log_text(run_id, result["measurement"], "measurement.json")
            m = json.loads(result["measurement"])
            names = [e["name"] for e in m["executors"]]
            if m.get("timeline"):
                fig = timeline_figure(m["timeline"], names, f"trial {index}: {strategy} "
                                      f"{m['throughput_ips']:.1f} img/s" + (" [SIMULATED]" if m["simulated"] else ""))
                client.log_figure(run_id, fig, "timeline.png")
                import matplotlib.pyplot as plt

                plt.close(fig)
        if result.get("config_yaml"):
            client.log_text(run_id, result["config_yaml"], "config.yaml")
        client.set_terminated(run_id, "FINISHED" if valid else "FAILED")
        return run_id
