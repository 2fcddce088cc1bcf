"""Resuming a killed tune: MLflow holds the finished trials, the Optuna study holds what was asked.

A kill can land anywhere: before a finished trial reached MLflow, while a trial ran, or between
MLflow and the study. The resume settles the study from MLflow, the record of what finished: a
trial the study still has running is told its logged result if MLflow has it, else it is failed
in the study and recorded in MLflow as ``killed`` (so it is neither lost nor counted). The resumed
tune then runs the trial budget that remains; enqueued first points not yet run stay queued.
"""

from __future__ import annotations

from typing import Any

from autohet.core.objectives import PRIMARY_METRIC, ObjectiveSet
from autohet.tracking import FINISHED, TrialLogger, run_status

__all__ = ["finished_trials", "settle_study"]


def finished_trials(runs: list[Any]) -> list[Any]:
    """Trial runs that count towards the budget (every status but killed)."""
    return [r for r in runs if run_status(r) in FINISHED]


def settle_study(study: Any, runs: list[Any], objectives: ObjectiveSet, logger: TrialLogger) -> dict[str, int]:
    """Closes the study's RUNNING trials (see module doc); returns how many were told / killed."""
    import optuna

    by_number = {r.data.tags.get("optuna_trial"): r for r in runs}
    told = killed = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        run = by_number.get(str(trial.number))
        if run is not None and run_status(run) in FINISHED:
            values = [run.data.metrics.get(o.key, run.data.metrics.get(PRIMARY_METRIC, o.worst))
                      for o in objectives.objectives]
            study.tell(trial.number, values if objectives.multi else values[0])
            told += 1
            continue
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        config = {"strategy": trial.params.get("strategy", "?"), **trial.params, "optuna_trial": trial.number}
        logger.log(len(runs) + killed + 1, config, {"status": "killed", "strategy": config["strategy"],
                                                   "error": "running when the tune was killed; not measured"})
        killed += 1
    return {"told": told, "killed": killed}
