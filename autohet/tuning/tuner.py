"""``autohet tune``: Ray Tune + OptunaSearch over the YAML spaces, every trial logged to MLflow.

One trial at a time (trials share the devices). Executors are created once per pool topology by
a manager actor and reused by every trial. The Optuna study (sqlite) lives under
runs/<experiment>/ and MLflow holds every finished trial: a killed tune continues with --resume,
keeps every finished trial, settles the trial the kill interrupted (``autohet.tuning.resume``) and
runs the budget that remains.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from autohet.core.models import ModelSpec
from autohet.core.objectives import ObjectiveSet
from autohet.core.settings import MANAGER_ANSWER_S
from autohet.core.workload import Workload
from autohet.strategies import BASELINE, get_strategy
from autohet.tracking import TuneOutcome
from autohet.tuning.experiment import TunePool, open_experiment
from autohet.tuning.finals import FINAL_SHARE
from autohet.tuning.record import Record, export, open_parent_run, telemetry_notes, trials_so_far
from autohet.tuning.settings import TuneSettings
from autohet.tuning.sizing import (
    SIZED_BANK,
    reference_outputs,
    size_trials,
    trial_setup,
)
from autohet.tuning.space import SearchSpace, load_search_space
from autohet.tuning.study import make_searcher, open_study, run_search, trial_budget_s

if TYPE_CHECKING:
    from autohet.tuning.progress import Progress
    from autohet.tuning.trial_setup import TrialSetup

__all__ = ["tune_model"]


def tune_model(model: ModelSpec, settings: TuneSettings, address: str | None = None, resume: bool = False,
               data_seed: int = 0, npy: str | None = None) -> TuneOutcome:
    """Runs (or resumes) a tune and exports the best valid trial to runs/<experiment>/best.yaml.

    The steps, in order: the experiment and its saved state, the search space, Ray, the pool and its
    manager, the trials' size and reference outputs, the MLflow parent run, the Optuna study, the
    search, the finals (the best few configurations again, by turns), the summary and the export;
    the manager is stopped at the end whatever happened."""
    started = time.time()
    objectives: ObjectiveSet = settings.objectives
    exp = open_experiment(model, settings, resume)
    space = _search_space(settings)
    _start_ray(address)
    pool = _start_pool(model, settings, address, exp.name, data_seed, npy)
    space = space.for_pool(pool.spec)
    stats: dict[str, Any] | None = {}  # None: the manager did not answer at the end (see answer_or_none)
    try:
        plan = size_trials(model, settings, pool, exp.state if resume else None)
        workload = Workload(pool.bank.bank, plan.images)
        setup = trial_setup(model, settings, pool, plan, workload,
                             reference_outputs(model, settings, pool.spec, workload), data_seed, npy)
        telemetry_notes(settings, pool.spec)
        record = open_parent_run(model, settings, exp, pool.spec, plan.images, space, resume, data_seed, npy)
        storage = open_study(exp, objectives, record, resume)
        progress, logged = trials_so_far(settings, record)
        remaining = settings.trials - progress.done
        budget_s = trial_budget_s(settings, started)
        finals_end = time.monotonic() + budget_s
        finals = _finals_on(settings)
        if remaining > 0:
            search = make_searcher(model, settings, space, pool.spec, exp.name, storage, resume)
            _plan_ahead(pool.manager, search.ahead, objectives, search.opening)
            run_search(search, setup, remaining, budget_s * (1 - FINAL_SHARE) if finals else budget_s, exp.dir,
                        record.logger, progress, logged)
        if finals:
            _hold_finals(setup, settings, record, progress, finals_end)
        stats = _summarize(pool.manager, progress)
        return export(record, exp, objectives)
    finally:
        _stop_manager(pool.manager, answered=stats is not None)


def _search_space(settings: TuneSettings) -> SearchSpace:
    """The YAML spaces restricted to the tune's strategies, run mode and this machine; says what it left out."""
    mode = settings.objectives.mode
    space, left_out = load_search_space(settings.search_spaces).restrict(settings.strategy_list,
                                                                         mode).for_machine()
    for note in left_out:
        print(f"autohet: note: {note}", file=sys.stderr)
    if mode.per_request and list(space.strategies) == [BASELINE]:
        print("autohet: note: only `single` serves latency runs with these search spaces", file=sys.stderr)
    return space


def _start_ray(address: str | None) -> None:
    """Starts (or joins) Ray for the tune, without Tune's periodic checkpoints and with its logs quietened."""
    from autohet.platform.ray_cluster import init_ray

    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    # one logical CPU more than the machine has: the trial process (it only waits on executors)
    init_ray(address, num_cpus=None if address else (os.cpu_count() or 1) + 1)
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    logging.getLogger("ray.train").setLevel(logging.ERROR)


def _start_pool(model: ModelSpec, settings: TuneSettings, address: str | None, experiment: str, data_seed: int,
                npy: str | None) -> TunePool:
    """Resolves the pool, builds the image bank and starts the pool manager actor."""
    from autohet.core.workload import WorkloadSpec, workload_for
    from autohet.pool.resolve import resolve_pool
    from autohet.tuning.manager import remote_manager

    pool_spec = resolve_pool(settings.pool, address)
    bank_images = SIZED_BANK if settings.images == "auto" else int(settings.images)
    bank = workload_for(model.name, bank_images, data_seed, npy)
    bank_spec = WorkloadSpec(bank_images, bank.shape, data_seed, npy)
    manager_name = f"autohet-manager-{experiment}-{os.getpid()}"
    manager = remote_manager(manager_name).remote(pool_spec, model, bank_spec, f"autohet-{experiment}")
    return TunePool(pool_spec, bank, manager_name, manager)


def _plan_ahead(manager: Any, plan: list[dict[str, dict[str, Any]]], objectives: ObjectiveSet,
                opening: dict[str, Any] | None = None) -> None:
    """The first points' plan to the manager (``autohet.tuning.ahead``), taken before the first trial asks
    for executors, with the topology and executors of the first trial (``opening``): the idle GPUs start
    on the plan while Ray Tune starts its trial process. None where energy is an objective: work beside a
    trial would count in its energy."""
    if not plan or objectives.meters_energy:
        return
    import ray

    first = None
    if opening is not None:
        strategy, params, _, pool_params = SearchSpace.decode(opening)
        first = (pool_params, get_strategy(strategy).executors_used(params))
    ray.get(manager.plan_ahead.remote(plan, first))


def _finals_on(settings: TuneSettings) -> bool:
    """Finals need two finalists and one figure to rank them by (a Pareto tune exports its front)."""
    return int(settings.finalists) >= 2 and not settings.objectives.multi


def _hold_finals(setup: TrialSetup, settings: TuneSettings, record: Record, progress: Progress,
                 end: float) -> None:
    """The finals (``autohet.tuning.finals``) until ``end`` (``time.monotonic``), printed and logged
    to MLflow; the export reads their winner from there."""
    from autohet.tracking import trial_runs
    from autohet.tuning.finals import (
        final_choice,
        final_scale,
        finalists_of,
        finals_table,
        log_finals,
        pick_finalists,
        run_finals,
        trial_runner,
    )

    primary = settings.objectives.primary
    runs = trial_runs(record.client, record.experiment_id, record.parent_id)
    finalists = pick_finalists(finalists_of(runs, primary), primary, int(settings.finalists),
                               float(settings.final_within))
    if not finalists:
        return
    scale = final_scale(finalists, int(settings.final_rounds), end - time.monotonic()) if setup.sizing else 1.0
    for f in finalists:
        f.trial_s *= scale  # what a final run is expected to take
    rounds = run_finals(finalists, trial_runner(setup.longer(scale), progress.add_final), primary,
                        int(settings.final_rounds), end)
    winner = final_choice(finalists, primary)
    log_finals(record.client, record.parent_id, finalists, winner, primary)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    head = (f"{rounds} round(s) by turns" if rounds else "no round finished within the time budget: the best trial "
            "is exported") + (f", each run {scale:.2g}x its trial's length" if scale > 1 else "")
    within = 100 * float(settings.final_within)
    print(f"autohet: finals ({len(finalists)} configurations within {within:.0f}% of the best trial, "
          f"{head}):\n{finals_table(finalists, primary, winner)}", file=sys.stderr, flush=True)


def _summarize(manager: Any, progress: Progress) -> dict[str, Any] | None:
    """Prints where the tune's wall time went; returns the manager's stats (None: it did not answer)."""
    if sys.stderr.isatty():
        print(file=sys.stderr)
    stats = answer_or_none(manager.stats.remote(), MANAGER_ANSWER_S)
    print(progress.breakdown(stats), file=sys.stderr, flush=True)
    return stats


def _stop_manager(manager: Any, answered: bool) -> None:
    """Ends the manager: one that answered at the end (idle) ends its executors itself first; a busy
    one's executors are its actors and end with it."""
    import ray

    try:
        if answered:
            ray.get(manager.shutdown.remote())
        ray.kill(manager)
    except Exception:  # the manager is already gone when Ray is shutting down
        logging.getLogger(__name__).debug("manager already stopped")


def answer_or_none(ref: Any, timeout_s: float) -> Any:
    """The value of a Ray call, or None when it has not come within ``timeout_s`` or its actor is gone
    or restarting (Ray's memory monitor can kill the manager after the last trial, and the finished
    trials must still be exported: docs/why.md, tuning/tuner.py)."""
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):  # ActorUnavailableError is one
        return None
