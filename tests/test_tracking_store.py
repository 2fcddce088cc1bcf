"""The sqlite tracking store: a new one starts as a copy of MLflow's empty schema (no Ray)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from autohet.tracking import _store, mlflow_client, seed_sqlite_store


def schema(db: Path) -> tuple[str, dict[str, list[str]]]:
    """The alembic revision and every table's and index's SQL, its lines sorted: MLflow's own builds
    list a table's constraints in a different order from one process to the next."""
    with sqlite3.connect(db) as con:
        version = con.execute("select version_num from alembic_version").fetchone()[0]
        sql = con.execute("select name, sql from sqlite_master where name not like 'sqlite_%'").fetchall()
    return version, {name: sorted(line.strip().rstrip(",") for line in (text or "").splitlines())
                     for name, text in sql}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "autohet"


def test_a_seeded_store_is_the_store_mlflow_builds_and_opens_with_its_default_experiment(tmp_path, cache):
    from mlflow.tracking import MlflowClient

    built = tmp_path / "built" / "mlflow.db"
    built.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{built}").search_experiments()  # MLflow's own migrations
    seeded = tmp_path / "seeded" / "mlflow.db"
    seeded.parent.mkdir()
    assert seed_sqlite_store(f"sqlite:///{seeded}")
    assert len(list(cache.glob("mlflow-*-empty.db"))) == 1
    assert schema(seeded) == schema(built)
    client = mlflow_client(f"sqlite:///{seeded}")
    assert [e.name for e in client.search_experiments()] == ["Default"]  # MLflow added it on opening
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "m", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}


def test_an_existing_store_is_never_replaced(tmp_path, cache):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"someone's store")
    assert not seed_sqlite_store(f"sqlite:///{db}")
    assert db.read_bytes() == b"someone's store"
    assert not seed_sqlite_store("postgresql://host/db")  # only local sqlite files are seeded
    assert not cache.exists()


def test_no_template_leaves_the_building_to_mlflow(tmp_path, cache, monkeypatch):
    def broken() -> Path:
        raise ImportError("mlflow.store.db.utils._initialize_tables moved")

    monkeypatch.setattr(_store, "empty_store", broken)
    db = tmp_path / "mlflow.db"
    assert not seed_sqlite_store(f"sqlite:///{db}") and not db.exists()
    assert [e.name for e in mlflow_client(f"sqlite:///{db}").search_experiments()] == ["Default"]
    assert list(tmp_path.glob(".mlflow.db.*")) == []  # no staged copy left behind
