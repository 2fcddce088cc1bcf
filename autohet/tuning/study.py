"""A tune's search: the Optuna study (sqlite under runs/<experiment>/, resumable), the staged first
points, OptunaSearch behind Ray Tune, and the run of the trials within the budget."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autohet.core.models import ModelSpec
from autohet.core.objectives import ObjectiveSet, TrialKey
from autohet.pool import PoolSpec
from autohet.tuning.dims import SpaceContext
from autohet.tuning.experiment import Experiment
from autohet.tuning.record import Record
from autohet.tuning.settings import TuneSettings
from autohet.tuning.sizing import space_context
from autohet.tuning.space import DefineByRun, SearchSpace

if TYPE_CHECKING:
    from autohet.tracking import TrialLogger
    from autohet.tuning.initial import FirstPoints
    from autohet.tuning.progress import Progress
    from autohet.tuning.search import StagedSearch
    from autohet.tuning.trial_setup import TrialSetup


__all__ = ["first_points", "make_searcher", "open_study", "run_search", "stopped_trials", "trial_budget_s"]


def open_study(exp: Experiment, objectives: ObjectiveSet, record: Record, resume: bool) -> Any:
    """The Optuna study's storage (sqlite under runs/<experiment>/). A resume first settles the trials
    the kill interrupted (``autohet.tuning.resume``)."""
    import optuna

    from autohet.tracking import trial_runs
    from autohet.tuning.resume import settle_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{exp.dir / 'optuna.db'}")
    if resume:
        study = optuna.load_study(study_name=exp.name, storage=storage)
        settled = settle_study(study, trial_runs(record.client, record.experiment_id, record.parent_id), objectives,
                               record.logger)
        if settled["killed"] or settled["told"]:
            print(f"autohet: resume: {settled['killed']} trial(s) the kill interrupted recorded as killed, "
                  f"{settled['told']} finished trial(s) given to the study", file=sys.stderr)
    return storage


def first_points(space: SearchSpace, pool_spec: PoolSpec, space_ctx: SpaceContext, objectives: ObjectiveSet,
                  resume: bool) -> FirstPoints | None:
    """The staged first points of a new tune (``staged_points``); None on a resume: the first run
    enqueued them in the study, which holds those not yet run."""
    from autohet.tuning.initial import staged_points

    return None if resume else staged_points(space, pool_spec, space_ctx, objectives.mode)


def make_searcher(model: ModelSpec, settings: TuneSettings, space: SearchSpace, pool_spec: PoolSpec, study_name: str,
              storage: Any, resume: bool) -> StagedSearch:
    """The search: Optuna (TPE for one objective, NSGA-II for two) behind Ray Tune, the first points
    first (``StagedSearch``)."""
    import optuna

    from autohet.tuning.search import SingleKind, StagedSearch

    objectives = settings.objectives
    pool_dims = bool(pool_spec.auto) and bool(space.pool)
    space_ctx = space_context(space, pool_spec, model, pool_dims)
    sampler = (optuna.samplers.NSGAIISampler(seed=settings.seed) if objectives.multi
               else optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=5))
    first = first_points(space, pool_spec, space_ctx, objectives, resume)
    return StagedSearch(
        DefineByRun(space, space_ctx), metric=objectives.search_metric, mode=objectives.search_mode,
        points_to_evaluate=first.singles if first else None, later=first.later() if first else None,
        kind_of=SingleKind(pool_spec), objectives=objectives, ahead=first.ahead() if first else None,
        opening=_opening(first, space, pool_dims),
        sampler=sampler, study_name=study_name, storage=storage, seed=settings.seed)


def _opening(first: FirstPoints | None, space: SearchSpace, pool_dims: bool) -> dict[str, Any] | None:
    """The first point, where it fixes its topology: every pool dim the sampler would otherwise draw (a pool
    file's value outside the space's choices is left to it, and the first trial's topology is unknown)."""
    if not first or not first.singles:
        return None
    point = first.singles[0]
    return point if not pool_dims or all(f"pool.{name}" in point for name in space.pool) else None


def trial_budget_s(settings: TuneSettings, started: float) -> float:
    """Seconds left for trials: the budget covers the whole command, the set-up so far and about 15 s
    to export at the end (at least 10 s; a note when the set-up left under 30 s)."""
    left = settings.time_budget_s - (time.time() - started) - 15.0
    if left < 30.0:
        print(f"autohet: note: the set-up took {time.time() - started:.0f} s of --time-budget "
              f"{settings.time_budget_s:g} s, leaving {max(left, 0.0):.0f} s for trials; raise --time-budget",
              file=sys.stderr)
    return max(10.0, left)


def run_search(searcher: StagedSearch, setup: TrialSetup, trials: int, budget_s: float, exp_dir: Path,
                logger: TrialLogger, progress: Progress, logged: set[str | None]) -> None:
    """Runs up to ``trials`` trials within ``budget_s`` through Ray Tune, one at a time, each logged
    to MLflow as it finishes; one the budget stopped, after the search, as ``cut`` (``stopped_trials``)."""
    from ray import tune

    from autohet.tuning.callbacks import tune_callbacks
    from autohet.tuning.trainable import tune_entry

    searcher.expect(trials, budget_s)
    trainable = tune.with_resources(tune.with_parameters(tune_entry, setup=setup), {"cpu": 0.01})
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=trials, time_budget_s=budget_s,
                                    max_concurrent_trials=1,
                                    reuse_actors=True),  # one trial process for all: no import per trial
        run_config=tune.RunConfig(name=f"tune-{int(time.time())}", storage_path=str(exp_dir),
                                  callbacks=tune_callbacks(logger, progress, logged), verbose=0,
                                  log_to_file=True),
    )
    tuner.fit()
    unlogged = [trial for trial in searcher.unreported() if trial[0] not in logged]
    manager_now = _manager_now(setup.manager_name) if unlogged else None
    for trial_id, config, result in stopped_trials(unlogged, logged, manager_now, time.time(), setup.objectives):
        logged.add(trial_id)
        t0 = time.perf_counter()
        logger.log(progress.done + 1, config, result, trial_id)
        progress.update(result, time.perf_counter() - t0)
        print(f"autohet: {result['error']}", file=sys.stderr)


def _manager_now(manager_name: str) -> dict[str, Any] | None:
    """The pool manager's ``now`` (None where it did not answer)."""
    import ray

    from autohet.core.settings import MANAGER_ANSWER_S
    from autohet.tuning.manager import ask_now

    try:
        manager = ray.get_actor(manager_name, namespace="autohet")
    except ValueError:  # gone: the record says it did not answer
        return None
    return ask_now(manager, MANAGER_ANSWER_S)


def stopped_trials(unreported: list[tuple[str, dict[str, Any], float]], logged: set[str | None],
                   manager_now: dict[str, Any] | None, now: float,
                   objectives: ObjectiveSet) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each trial suggested that never reported and was not logged otherwise (a crash is, as ``error``), with
    the result it is logged with: ``cut`` at the search's time budget, its seconds, where they went from the
    pool manager's ``now`` (``manager_now``: None where it did not answer), and each objective's worst value, as
    any trial not ok. A two-GPU vgg16 tune logged no trial in its last 100 s and said nothing of why
    (BENCHMARKS.md 47): the trial is neither lost nor unexplained."""
    from autohet.tuning.trainable import objective_metrics

    out = []
    for trial_id, config, suggested in unreported:
        if trial_id in logged:
            continue
        seconds = max(0.0, now - suggested)
        strategy = config.get("strategy", "?")
        error = (f"a {strategy} trial ({_dims(config)}) was stopped at the search's time budget after {seconds:.0f} s, "
                 f"not measured: {_where(manager_now, seconds)}")
        result: dict[str, Any] = {"status": "cut", "strategy": strategy, "error": error, TrialKey.TRIAL: seconds}
        out.append((trial_id, config, {**result, **objective_metrics(result, objectives)}))
    return out


def _dims(config: dict[str, Any]) -> str:
    """A trial's pool dims and executor params, by kind: "cpu_group_size=2; gpu batch=256, backend=inductor"."""
    _, _, executors, pool = SearchSpace.decode({"strategy": "?", **config})
    dims = ", ".join(f"{k}={v}" for k, v in sorted(pool.items()))
    execs = "; ".join(f"{kind} {', '.join(f'{k}={v}' for k, v in sorted(params.items()))}"
                      for kind, params in sorted(executors.items()))
    return "; ".join([dims or "the pool as it is", execs or "the executors as they are"])


def _where(manager_now: dict[str, Any] | None, seconds: float) -> str:
    """Where a stopped trial's seconds went, from the pool manager's ``now`` (see ``stopped_trials``)."""
    if manager_now is None:
        return "the pool manager did not answer what it was doing"
    if "doing" in manager_now:
        return f"the pool manager had been {manager_now['doing']} for its last {manager_now['for_s']:.0f} s"
    if "idle_s" in manager_now and manager_now["idle_s"] < seconds:
        return (f"its run went on for its last {manager_now['idle_s']:.0f} s, after the pool manager's "
                f"{manager_now['after']} returned")
    return "it had not asked the pool manager for anything"
