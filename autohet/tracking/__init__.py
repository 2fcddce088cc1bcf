"""MLflow: one parent run per tune, one nested run per trial; reading tunes back and exporting configs."""

from __future__ import annotations

from autohet.tracking._export import TuneOutcome, export_run, record_outcome
from autohet.tracking._logger import CONFIG_TAG, TrialLogger
from autohet.tracking._select import CONSTRAINTS, Constraint, constraints_from, pick_trial
from autohet.tracking._status import FINISHED, STATUSES
from autohet.tracking._store import (
    artifact_location,
    default_tracking_uri,
    ensure_experiment,
    experiment_runs,
    mlflow_client,
    seed_sqlite_store,
    trial_runs,
    tune_objective,
)
from autohet.tracking._summary import final_pick, front, run_status, summarize

__all__ = [
    "CONFIG_TAG", "CONSTRAINTS", "FINISHED", "STATUSES", "Constraint", "TrialLogger", "TuneOutcome",
    "artifact_location", "constraints_from", "default_tracking_uri", "ensure_experiment", "experiment_runs",
    "export_run", "final_pick", "front", "mlflow_client", "pick_trial", "record_outcome", "run_status",
    "seed_sqlite_store", "summarize", "trial_runs", "tune_objective",
]
