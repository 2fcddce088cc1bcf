"""The MLflow store: the embedded sqlite store under runs/ by default, experiments and their trial runs."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["artifact_location", "default_tracking_uri", "empty_store", "ensure_experiment", "experiment_runs",
           "mlflow_client", "seed_sqlite_store", "trial_runs", "tune_objective"]


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

    uri = uri or default_tracking_uri()
    seed_sqlite_store(uri)
    return MlflowClient(tracking_uri=uri)


def seed_sqlite_store(uri: str) -> bool:
    """A new sqlite store starts as a copy of an empty one of this MLflow version (``empty_store``):
    MLflow builds a new one by running its schema migrations, a noticeable share of a small tune
    (docs/why.md, tracking/_store.py), in every fresh runs/ folder. False (MLflow builds it) where
    there was a store already, or no template could be made."""
    if not uri.startswith("sqlite:///"):
        return False
    target = Path(uri[len("sqlite:///"):])
    if target.exists() or not target.parent.is_dir():
        return False
    try:
        template = empty_store()
        staged = target.with_name(f".{target.name}.{os.getpid()}.seed")
        try:
            shutil.copyfile(template, staged)
            os.link(staged, target)  # never over a store another process made meanwhile
        finally:
            staged.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - a private MLflow call moved, a read-only cache, a race: MLflow builds it
        return False
    return True


def empty_store() -> Path:
    """MLflow's freshly migrated, empty sqlite schema (no experiment yet: MLflow adds its Default one
    with the artifact root of wherever the copy is opened), made once per MLflow version under the
    user's cache."""
    import mlflow

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autohet"
    path = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if path.is_file():
        return path
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables  # what MLflow runs on a database without tables

    cache.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    engine = sqlalchemy.create_engine(f"sqlite:///{staged}")
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()
    os.replace(staged, path)
    return path


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
    from autohet.core.errors import UserError

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
