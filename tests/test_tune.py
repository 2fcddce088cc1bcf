"""End-to-end tunes of LeNet on real Ray actors: MLflow contents, export, invalid trials, resume."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


# The executor dims of the tunes below, the same on every machine: the repo's space leaves out what a
# machine cannot run well (CPU bf16 without AVX512-BF16/AMX, inductor without g++, a backend whose package
# is missing), and a space that differs by machine changes the sampler's draws and the first points, so
# the trials a test counts (issue 24: a pipeline tune ran 4 singles and 1 pipeline on a bf16 day).
PINNED_EXECUTORS = {"cpu": {"batch": {"type": "categorical", "choices": [16, 64]},
                            "precision": {"type": "categorical", "choices": ["fp32"]},
                            "backend": {"type": "categorical", "choices": ["eager"]}}}


def pinned_spaces(tmp_path: Path) -> Path:
    """A copy of search_spaces/ whose executor dims hold only values every machine runs."""
    spaces = tmp_path / "spaces"
    shutil.copytree(REPO / "search_spaces", spaces)
    raw = yaml.safe_load((spaces / "executors.yaml").read_text())
    raw["executors"] = {**raw["executors"], **PINNED_EXECUTORS}
    (spaces / "executors.yaml").write_text(yaml.safe_dump(raw))
    return spaces


def setup_dir(tmp_path: Path, trials: int, broken: bool = False) -> tuple[Path, dict]:
    spaces = pinned_spaces(tmp_path)
    if broken:
        (spaces / "broken.yaml").write_text("strategies:\n  broken:\n    c: {type: int, low: 50, high: 100}\n")
    conf = {"trials": trials, "time_budget_s": 600, "images": 1500, "standalone_seconds": 0.1,
            "check_images": 8, "search_spaces": str(spaces), "pool": str(REPO / "actors/cpu2.yaml"),
            "finalists": 2, "final_rounds": 1, "final_within": 0.99,  # finals whatever the figures
            # never cut: beside the other test process (-n 2) a lenet run slowed 4x by its load was cut against an
            # earlier trial's figure (both finals, once in five suites), and a first single ran past the auto
            # trial timeout (20 s; its first single was cut at 32 s in one clean-clone CI run); both are tested in
            # test_manager/test_ray_pool
            "cut_factor": 0, "trial_timeout_s": 300}
    (tmp_path / "conf.yaml").write_text(yaml.safe_dump(conf))
    env = dict(os.environ, PYTHONPATH=str(REPO), AUTOHET_PLUGINS="tests.plugin_broken" if broken else "",
               RAY_TMPDIR="/tmp")
    return tmp_path, env


def autohet(args: list[str], cwd: Path, env: dict, timeout: int = 600,
            new_session: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autohet.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, start_new_session=new_session)


def client_for(cwd: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{cwd / 'runs' / 'mlflow.db'}")


def test_tune_logs_every_trial_exports_best_and_never_an_invalid_one(tmp_path, monkeypatch, capsys):
    from autohet.cli import main
    from autohet.strategies import get_strategy

    cwd, env = setup_dir(tmp_path, trials=10, broken=True)  # the first points: 2 singles, 8 strategies
    proc = autohet(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "e2e"], cwd, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    summary = re.search(r"10 trials in \d+ s: acquire \d+ s, .*acquiring executors \d+% of the wall time\); trials: "
                        r"([^;]*); .*topologies started", proc.stderr)
    assert summary, proc.stderr[-3000:]
    # by status: the broken strategy invalid, the rest ok, or refused where the figures measured beside the other
    # test process put an engine trial out of reach (a refusal reads the load's figures; one clean-clone CI run)
    statuses = dict(reversed(part.split(" ", 1)) for part in summary.group(1).split(", "))
    assert statuses.get("invalid") == "1" and int(statuses.get("ok", 0)) >= 2, summary.group(1)
    assert set(statuses) <= {"ok", "invalid", "refused"}, summary.group(1)
    assert not (cwd / "mlruns").exists()
    client = client_for(cwd)
    exp = client.get_experiment_by_name("e2e")
    assert exp.artifact_location.startswith((cwd / "runs" / "mlartifacts").as_uri())
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("autohet_kind") == "tune"]
    trials = [r for r in runs if r.data.tags.get("autohet_kind") == "trial"]
    assert len(parents) == 1 and len(trials) == 10
    parent = parents[0]
    assert parent.data.params["objective"] == "throughput" and parent.data.params["platform.cpu_cores"]
    for run in trials:
        status, name = run.data.tags["status"], run.data.params["strategy"]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert status in ("ok", "invalid", "refused")
        assert run.data.tags["valid"] == str(status == "ok").lower()
        assert {"objective_value", "time.acquire_s", "time.run_s", "time.standalone_s",
                "time.trial_s"} <= set(run.data.metrics)
        phases = sum(run.data.metrics[f"time.{p}_s"] for p in ("acquire", "run", "standalone"))
        assert phases == pytest.approx(run.data.metrics["time.trial_s"])
        if status == "refused":  # not run: logged with why, and its worst value (a refusal reads the load's figures)
            # exact: the worst value a trial not run is given
            assert run.data.tags["error"] and run.data.metrics["objective_value"] == 0.0, (name, run.data.tags)
            continue
        assert {"throughput_ips", "limit_ips", "efficiency", "share.cpu0"} <= set(run.data.metrics), (name, status)
        # a busy time summed from the run's units, or (split, coedge, channels: a few timed frames scaled)
        # an estimate, logged under its own name (issue 50)
        estimated = name in ("split", "coedge", "channels")
        assert ("busy_est.cpu1" if estimated else "busy.cpu1") in run.data.metrics
        if status == "ok":  # a true ratio: the limit bounds every executor's run speed
            assert run.data.metrics["efficiency"] <= 1.02
        files = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "measurement.json"} <= files
        if name == "broken" or get_strategy(name).family == "data_parallel":  # work units: a timeline
            assert "timeline.png" in files
    checked = [r.data.metrics for r in trials if r.data.tags["status"] in ("ok", "invalid")]
    assert all({"check.reference_computed", "check.reference_reused", "time.reference_s"} <= set(m) for m in checked)
    # the trial processes reuse the references the tuner computed and those earlier trials computed (issue 50)
    assert sum(m["check.reference_reused"] for m in checked) > sum(m["check.reference_computed"] for m in checked)
    broken = [r for r in trials if r.data.tags["strategy"] == "broken"]
    assert broken and all(r.data.tags["status"] == "invalid" for r in broken)  # wrong outputs: invalid
    # exact: the worst value a failed trial is given
    assert all(r.data.metrics["objective_value"] == 0.0 for r in broken)
    assert "differ" in broken[0].data.tags["error"] or "exactly once" in broken[0].data.tags["error"]
    assert {"comparison.png", "best.yaml"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    best = yaml.safe_load((cwd / "runs" / "e2e" / "best.yaml").read_text())
    assert best["autohet_config"] == 1 and best["strategy"] != "broken"
    assert best["measured"]["output_ok"] is True
    assert best["mlflow"]["run_id"] in {r.info.run_id for r in trials}
    assert best["platform"]["cpu_cores"] == os.cpu_count()
    # the finals: the two best distinct configurations ran again; the better final figure is exported. A
    # final run that the other test process's load slowed past its time is cut (or refused): that finalist
    # is out, tagged why (one run in five on the 2-core box), and the one standing wins; none standing: the best trial
    finals = [r for r in trials if "finalist" in r.data.tags]
    assert len(finals) == 2 and all(r.data.tags["status"] == "ok" for r in finals)
    valid = [r.data.metrics["objective_value"] for r in trials if r.data.tags["valid"] == "true"]
    assert max(valid) in {r.data.metrics["objective_value"] for r in finals}  # the best trial is one of them
    standing = [r for r in finals if r.data.tags["finalist"] == "true"]
    outs = [r.data.tags.get("finalist_out", "") for r in finals if r.data.tags["finalist"] == "out"]
    assert len(standing) + len(outs) == 2 and all(why.startswith(("cut:", "refused:")) for why in outs), outs
    finals_line = "autohet: finals (2 configurations within 99% of the best trial, "
    if standing:
        assert finals_line + "1 round(s) by turns)" in proc.stderr
        winner = max(standing, key=lambda r: r.data.metrics["final_objective_value"])
        assert parent.data.tags["final_choice"] == winner.info.run_id == best["mlflow"]["run_id"]
    else:
        assert finals_line + "no round finished" in proc.stderr and "final_choice" not in parent.data.tags
        winner = max(finals, key=lambda r: r.data.metrics["objective_value"])
        assert winner.info.run_id == best["mlflow"]["run_id"]
    assert best["measured"]["throughput_ips"] == pytest.approx(winner.data.metrics["objective_value"])

    # the rerun (in-process executors), compare and export: the command in this process, as test_cli's
    # (a subprocess each cost seconds of imports)
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(["run", "--config", "runs/e2e/best.yaml", "--in-process", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["output_ok"] is True

    assert main(["compare", "--experiment", "e2e", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["strategies"]
    assert {r["strategy"] for r in rows} >= {"single", "static", "quick", "chunk", "hat", "fifo", "fast_split"}
    assert next(r for r in rows if r["strategy"] == "broken")["best"] is None

    some = next(r for r in trials if r.data.tags["strategy"] == "fifo")
    code = main(["export", "--experiment", "e2e", "--run-id", some.info.run_id, "--out", "fifo.yaml"])
    assert code == 0, capsys.readouterr().err
    assert yaml.safe_load((cwd / "fifo.yaml").read_text())["strategy"] == "fifo"
    assert main(["export", "--experiment", "e2e", "--out", "again.yaml"]) == 0  # no run id: the finals' winner
    assert yaml.safe_load((cwd / "again.yaml").read_text())["mlflow"]["run_id"] == winner.info.run_id
    capsys.readouterr()
    assert main(["export", "--experiment", "nope"]) == 2 and "no experiment 'nope'" in capsys.readouterr().err


def test_resume_after_a_kill_with_a_trial_running_reaches_the_budget_and_loses_nothing(tmp_path, monkeypatch,
                                                                                       capsys):
    """The tune is killed (SIGKILL to its process group) at a known point: three trials logged and
    the fourth just started (the tuner's test hook, never a wall-clock poll). The resume keeps the
    three, records the fourth as killed, and runs three more: six finished, none logged twice."""
    from autohet.cli import main

    cwd, env = setup_dir(tmp_path, trials=6)
    killed = autohet(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "kill"], cwd,
                     {**env, "AUTOHET_TEST_KILL_AFTER": "3"}, new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    client = client_for(cwd)
    exp = client.get_experiment_by_name("kill")
    before = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'trial'")
    assert len(before) == 3 and all(r.data.tags["status"] != "killed" for r in before)
    monkeypatch.chdir(cwd)  # the refusal comes before Ray starts: the command in this process
    assert main(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "kill"]) == 2
    assert "--resume" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()  # and it left none here for the tests after this one
    resumed = autohet(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "kill", "--resume"],
                      cwd, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 trial(s) the kill interrupted recorded as killed" in resumed.stderr
    after = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'trial'")
    assert {r.info.run_id for r in before} <= {r.info.run_id for r in after}
    statuses = [r.data.tags["status"] for r in after]
    assert statuses.count("killed") == 1 and len(statuses) == 7  # six finished and the interrupted one
    numbers = [r.data.tags["optuna_trial"] for r in after]
    assert len(set(numbers)) == len(numbers)  # no trial logged twice
    import optuna

    study = optuna.load_study(study_name="kill", storage=f"sqlite:///{cwd / 'runs' / 'kill' / 'optuna.db'}")
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert optuna.trial.TrialState.RUNNING not in states and states.count(optuna.trial.TrialState.FAIL) == 1
    parents = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'tune'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert (cwd / "runs" / "kill" / "best.yaml").is_file()
