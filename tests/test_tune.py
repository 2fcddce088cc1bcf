"""End-to-end tunes of LeNet on real Ray actors: MLflow contents, export, invalid trials, resume."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


def setup_dir(tmp_path: Path, trials: int, broken: bool = False) -> tuple[Path, dict]:
    spaces = tmp_path / "spaces"
    shutil.copytree(REPO / "search_spaces", spaces)
    if broken:
        (spaces / "broken.yaml").write_text("strategies:\n  broken:\n    c: {type: int, low: 50, high: 100}\n")
    conf = {"trials": trials, "time_budget_s": 600, "images": 1500, "standalone_seconds": 0.1,
            "check_images": 8, "search_spaces": str(spaces), "pool": str(REPO / "actors/cpu2.yaml")}
    (tmp_path / "conf.yaml").write_text(yaml.safe_dump(conf))
    env = dict(os.environ, PYTHONPATH=str(REPO), AUTOHET_PLUGINS="tests.plugin_broken" if broken else "",
               RAY_TMPDIR="/tmp")
    return tmp_path, env


def autohet(args: list[str], cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autohet.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def client_for(cwd: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{cwd / 'runs' / 'mlflow.db'}")


def test_tune_logs_every_trial_exports_best_and_never_an_invalid_one(tmp_path):
    cwd, env = setup_dir(tmp_path, trials=9, broken=True)
    proc = autohet(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "e2e"], cwd, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert re.search(r"9 trials in \d+ s: acquire \d+ s, standalone \d+ s, .*topologies started", proc.stderr)
    assert not (cwd / "mlruns").exists()
    client = client_for(cwd)
    exp = client.get_experiment_by_name("e2e")
    assert exp.artifact_location.startswith((cwd / "runs" / "mlartifacts").as_uri())
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("autohet_kind") == "tune"]
    trials = [r for r in runs if r.data.tags.get("autohet_kind") == "trial"]
    assert len(parents) == 1 and len(trials) == 9
    parent = parents[0]
    assert parent.data.params["objective"] == "throughput" and parent.data.params["platform.cpu_cores"]
    for run in trials:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {"throughput_ips", "limit_ips", "efficiency", "valid", "objective_value",
                "share.cpu0", "busy.cpu1", "time.acquire_s", "time.run_s", "time.standalone_s",
                "time.trial_s"} <= set(run.data.metrics)
        phases = sum(run.data.metrics[f"time.{p}_s"] for p in ("acquire", "run", "standalone"))
        assert phases == pytest.approx(run.data.metrics["time.trial_s"])
        assert "strategy" in run.data.params
        files = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"timeline.png", "config.yaml", "measurement.json"} <= files
    broken = [r for r in trials if r.data.tags["strategy"] == "broken"]
    assert broken and all(r.data.tags["valid"] == "false" for r in broken)
    assert all(r.data.metrics["objective_value"] == 0.0 for r in broken)
    assert "differ" in broken[0].data.tags["error"] or "exactly once" in broken[0].data.tags["error"]
    assert {"comparison.png", "best.yaml"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    best = yaml.safe_load((cwd / "runs" / "e2e" / "best.yaml").read_text())
    assert best["autohet_config"] == 1 and best["strategy"] != "broken"
    assert best["measured"]["output_ok"] is True
    assert best["mlflow"]["run_id"] in {r.info.run_id for r in trials}
    assert best["platform"]["cpu_cores"] == os.cpu_count()
    valid = [r.data.metrics["objective_value"] for r in trials if r.data.tags["valid"] == "true"]
    assert best["measured"]["throughput_ips"] == pytest.approx(max(valid))

    rerun = autohet(["run", "--config", "runs/e2e/best.yaml", "--in-process", "--json"], cwd, env)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["output_ok"] is True

    compare = autohet(["compare", "--experiment", "e2e", "--json"], cwd, env)
    rows = json.loads(compare.stdout)["strategies"]
    assert {r["strategy"] for r in rows} >= {"single", "static", "quick", "chunk", "hat", "fifo", "fast_split"}
    assert next(r for r in rows if r["strategy"] == "broken")["best"] is None

    some = next(r for r in trials if r.data.tags["strategy"] == "fifo")
    out = autohet(["export", "--experiment", "e2e", "--run-id", some.info.run_id, "--out", "fifo.yaml"], cwd, env)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load((cwd / "fifo.yaml").read_text())["strategy"] == "fifo"
    bad = autohet(["export", "--experiment", "nope"], cwd, env)
    assert bad.returncode == 2 and "no experiment 'nope'" in bad.stderr


def finished_trials(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return con.execute("select count(*) from tags where key='autohet_kind' and value='trial'").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_resume_after_sigkill_keeps_finished_trials(tmp_path):
    cwd, env = setup_dir(tmp_path, trials=6)
    db = cwd / "runs" / "mlflow.db"
    proc = subprocess.Popen([sys.executable, "-m", "autohet.cli", "tune", "--model", "lenet", "--conf", "conf.yaml",
                             "--experiment", "kill"], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while finished_trials(db) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, "the tune ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    client = client_for(cwd)
    exp = client.get_experiment_by_name("kill")
    before = {r.info.run_id for r in client.search_runs([exp.experiment_id], "tags.autohet_kind = 'trial'")}
    assert 3 <= len(before) < 6
    again = autohet(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "kill"], cwd, env)
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = autohet(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "kill", "--resume"],
                      cwd, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'trial'")
    assert before <= {r.info.run_id for r in after}
    assert len(after) == 6
    parents = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'tune'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert (cwd / "runs" / "kill" / "best.yaml").is_file()
