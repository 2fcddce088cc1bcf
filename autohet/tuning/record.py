"""A tune's MLflow side: the parent run (its parameters, the platform, what the space left out), the
trials it already holds (a resume's), and the export of the best at the end."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from autohet.core.models import ModelSpec
from autohet.core.objectives import ObjectiveSet
from autohet.pool import PoolSpec
from autohet.tracking import TuneOutcome
from autohet.tuning.experiment import Experiment
from autohet.tuning.settings import TuneSettings
from autohet.tuning.space import SearchSpace

if TYPE_CHECKING:
    from autohet.tracking import TrialLogger
    from autohet.tuning.progress import Progress


__all__ = ["Record", "export", "open_parent_run", "start_parent", "telemetry_notes", "trials_so_far"]


@dataclass
class Record:
    """Where the tune is logged in MLflow: the client, the experiment, the parent run, the trial logger."""

    client: Any
    experiment_id: str
    parent_id: str
    platform: dict[str, Any]
    logger: TrialLogger


def open_parent_run(model: ModelSpec, settings: TuneSettings, exp: Experiment, pool_spec: PoolSpec, images: int,
                     space: SearchSpace, resume: bool, data_seed: int, npy: str | None) -> Record:
    """The tune's MLflow parent run: reopened on a resume; else created, and the state a resume needs
    written to runs/<experiment>/tune_state.json."""
    from autohet.platform.fingerprint import fingerprint
    from autohet.tracking import TrialLogger, ensure_experiment, mlflow_client

    uri = settings.tracking_uri
    client = mlflow_client(uri)
    experiment_id = ensure_experiment(client, exp.name, uri)
    platform = fingerprint()
    if resume:
        parent_id = exp.state["parent_run_id"]
        client.update_run(parent_id, status="RUNNING")
    else:
        parent_id = start_parent(client, experiment_id, model, settings, pool_spec, images, space, platform)
        exp.dir.mkdir(parents=True, exist_ok=True)
        exp.state = {"model": model.to_dict(), "parent_run_id": parent_id, "images": images,
                     "experiment_id": experiment_id, "settings": settings.to_dict(), "tracking_uri": uri,
                     "data_seed": data_seed, "npy": npy}
        exp.state_file.write_text(json.dumps(exp.state, indent=1))
    return Record(client, experiment_id, parent_id, platform, TrialLogger(uri, experiment_id, parent_id, platform))


def start_parent(client: Any, experiment_id: str, model: ModelSpec, settings: TuneSettings, pool_spec: PoolSpec,
                  images: int, space: SearchSpace, platform: dict[str, Any]) -> str:
    parent = client.create_run(experiment_id, run_name=f"tune-{model.name}-{settings.objective}",
                               tags={"autohet_kind": "tune", "model": model.name})
    parent_id = parent.info.run_id
    params = {"model": model.name, "weights_seed": model.seed, "objective": settings.objective,
              "pool": pool_spec.source, "trials": settings.trials, "time_budget_s": settings.time_budget_s,
              "images": images, "seed": settings.seed, "strategies": ",".join(space.strategies),
              "simulated": pool_spec.simulated, "max_temp": settings.max_temp}
    params.update({f"platform.{k}": v for k, v in platform.items()})
    for key, value in params.items():
        client.log_param(parent_id, key, str(value)[:6000])
    client.log_text(parent_id, yaml.safe_dump(pool_spec.to_dict(), sort_keys=False), "pool.yaml")
    return parent_id


def trials_so_far(settings: TuneSettings, record: Record) -> tuple[Progress, set[str | None]]:
    """The progress line, counting the trials an earlier run finished, and the Tune trial ids already
    logged (a trial is logged once)."""
    from autohet.tracking import trial_runs
    from autohet.tuning.progress import Progress
    from autohet.tuning.resume import finished_trials

    earlier = trial_runs(record.client, record.experiment_id, record.parent_id)
    done_before = len(finished_trials(earlier))
    logged = {r.data.tags.get("tune_trial_id") for r in earlier}
    progress = Progress(settings.trials, settings.objectives, done_before, float(settings.time_budget_s))
    return progress, logged


def export(record: Record, exp: Experiment, objectives: ObjectiveSet) -> TuneOutcome:
    """Exports the best valid trial (``record_outcome``) and closes the parent run."""
    from autohet.tracking import record_outcome

    outcome = record_outcome(record.client, exp.name, record.experiment_id, record.parent_id, objectives, exp.dir,
                             record.platform)
    record.client.set_terminated(record.parent_id, "FINISHED")
    return outcome


def telemetry_notes(settings: TuneSettings, pool_spec: PoolSpec) -> None:
    """Says once, before the trials, what an energy objective or --max-temp cannot use here."""
    from autohet.platform.sensors import read_temperatures
    from autohet.strategy_run import energy_sources

    sources = energy_sources(pool_spec)
    if any(o.name == "energy" for o in settings.objectives.objectives) and not sources.counters:
        why = "; ".join(f"{k}: {v}" for k, v in sources.unavailable.items() if k.startswith("energy"))
        print(f"autohet: note: no energy counter readable here ({why}); every trial reports the worst energy",
              file=sys.stderr)
    if settings.max_temp is not None and not read_temperatures(sources)[0]:
        why = "; ".join(f"{k}: {v}" for k, v in sources.unavailable.items() if k.startswith("temp"))
        print(f"autohet: note: --max-temp {settings.max_temp:g}: no temperature readable here ({why}); trials are "
              "neither checked against it nor spaced to cool", file=sys.stderr)
