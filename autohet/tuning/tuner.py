"""``autohet tune``: Ray Tune + OptunaSearch over the YAML spaces, every trial logged to MLflow.

One trial at a time (trials share the devices). Executors are created once per pool topology by
a manager actor and reused by every trial. The Optuna study (sqlite) lives under
runs/<experiment>/ and MLflow holds every finished trial: a killed tune continues with --resume,
keeps every finished trial, settles the trial the kill interrupted (``autohet.tuning.resume``) and
runs the budget that remains.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.objectives import ObjectiveSet
from autohet.core.settings import MANAGER_ANSWER_S
from autohet.core.workload import Workload
from autohet.platform.ray_cluster import get_interruptibly
from autohet.pool import PoolSpec
from autohet.pool.spec import POOL_DIMS
from autohet.strategies import BASELINE
from autohet.tracking import TuneOutcome
from autohet.tuning.dims import SpaceContext
from autohet.tuning.finals import FINAL_SHARE
from autohet.tuning.settings import TuneSettings
from autohet.tuning.space import DefineByRun, SearchSpace, load_search_space

if TYPE_CHECKING:
    from autohet.tracking import TrialLogger
    from autohet.tuning.initial import FirstPoints
    from autohet.tuning.progress import Progress
    from autohet.tuning.search import StagedSearch
    from autohet.tuning.trainable import TrialSetup, TrialSizing

__all__ = ["space_context", "strategy_sizes", "tune_model"]


_SIZES: dict[tuple, dict[str, int]] = {}


def strategy_sizes(strategy: str, model: ModelSpec, pool: PoolSpec) -> dict[str, int]:
    """A strategy's vector lengths for this model and pool (partitioning takes seconds: cached)."""
    from autohet.strategies import get_strategy

    key = (strategy, model, tuple(pool.executors))
    if key not in _SIZES:
        _SIZES[key] = get_strategy(strategy).space_sizes(model, pool)
    return _SIZES[key]


def space_context(space: SearchSpace, pool: PoolSpec, model: ModelSpec, pool_dims: bool) -> SpaceContext:
    """Sizes of the space's vectors: the pool's executors and in-process devices, and what each
    strategy of the space declares (``Strategy.space_sizes``; only for the vectors the space searches)."""
    from autohet.strategies import default_devices

    kinds = frozenset(e.kind for e in pool.executors)
    sizes = {"executors": _max_pool_size(pool, space, pool_dims), "devices": len(default_devices(pool))}
    needed = space.vector_sizes() - set(sizes)
    if needed:
        for name in space.strategies:
            sizes.update((k, v) for k, v in strategy_sizes(name, model, pool).items() if k in needed)
    return SpaceContext(sizes, kinds, pool_dims)


def _max_pool_size(pool: PoolSpec, space: SearchSpace, pool_dims: bool) -> int:
    """Executors in the largest topology the space can ask for (sizes pool_index and weights)."""
    if not pool_dims or not set(space.pool) & set(POOL_DIMS):
        return len(pool.executors)
    import itertools

    from autohet.tuning.manager import regroup

    def values(name: str) -> list[Any]:
        dim = space.pool.get(name)
        if dim is None:
            return [None]
        return dim.values() or list(range(int(dim.low), int(dim.high) + 1))

    choices = {name: values(name) for name in POOL_DIMS}
    return max(len(regroup(pool, dict(zip(choices, combo, strict=True))).executors)
               for combo in itertools.product(*choices.values()))


# the synthetic bank of a tune whose trials are sized by speed: images past its distinct ones cycle
# (``workload.MAX_DISTINCT_BYTES``), so the count only bounds the indices
_SIZED_BANK = 1 << 30


def _sizing(manager: Any, settings: TuneSettings, classes: int) -> Any:
    """How throughput trials are sized: from the base pool's summed standalone throughput, measured now."""
    from autohet.tuning.trainable import MAX_OUTPUT_BYTES, TrialSizing

    limit = float(get_interruptibly(manager.calibrate.remote(settings.standalone_seconds)))
    cap = int(settings.max_images) if settings.max_images != "auto" else MAX_OUTPUT_BYTES // (4 * max(1, classes))
    timeout = None if settings.trial_timeout_s == "auto" else float(settings.trial_timeout_s)
    return TrialSizing(float(settings.target_trial_seconds), int(settings.min_images), max(cap, 1), limit, timeout)


def _load_state(state_file: Path, tune_dir: Path, experiment: str, model: ModelSpec, resume: bool,
                exp_dir: Path) -> dict[str, Any]:
    if resume:
        if not state_file.is_file():
            raise UserError(f"nothing to resume for experiment {experiment!r} (no {state_file}); "
                            "run `autohet tune` without --resume")
        state = json.loads(state_file.read_text())
        if state["model"] != model.to_dict():
            raise UserError(f"experiment {experiment!r} tuned model {state['model']['name']}; resume it with "
                            f"--model {state['model']['name']} or pick another --experiment")
        return state
    if state_file.is_file():
        raise UserError(f"experiment {experiment!r} already has a tune in {exp_dir}; add --resume to continue "
                        "it or pass --experiment NEW_NAME")
    return {}


def tune_model(model: ModelSpec, settings: TuneSettings, address: str | None = None, resume: bool = False,
               data_seed: int = 0, npy: str | None = None) -> TuneOutcome:
    """Runs (or resumes) a tune and exports the best valid trial to runs/<experiment>/best.yaml.

    The steps, in order: the experiment and its saved state, the search space, Ray, the pool and its
    manager, the trials' size and reference outputs, the MLflow parent run, the Optuna study, the
    search, the finals (the best few configurations again, by turns), the summary and the export;
    the manager is stopped at the end whatever happened."""
    started = time.time()
    objectives: ObjectiveSet = settings.objectives
    exp = _open_experiment(model, settings, resume)
    space = _search_space(settings)
    _start_ray(address)
    pool = _start_pool(model, settings, address, exp.name, data_seed, npy)
    space = space.for_pool(pool.spec)
    stats: dict[str, int] | None = {}  # None: the manager did not answer at the end (see answer_or_none)
    try:
        plan = _size_trials(model, settings, pool, exp.state if resume else None)
        workload = Workload(pool.bank.bank, plan.images)
        setup = _trial_setup(model, settings, pool, plan, workload,
                             _reference_outputs(model, settings, pool.spec, workload), data_seed, npy)
        _telemetry_notes(settings, pool.spec)
        record = _open_parent_run(model, settings, exp, pool.spec, plan.images, space, resume, data_seed, npy)
        storage = _open_study(exp, objectives, record, resume)
        progress, logged = _trials_so_far(settings, record)
        remaining = settings.trials - progress.done
        budget_s = _trial_budget_s(settings, started)
        finals_end = time.monotonic() + budget_s
        finals = _finals_on(settings)
        if remaining > 0:
            searcher = _searcher(model, settings, space, pool.spec, exp.name, storage, resume)
            _run_search(searcher, setup, remaining, budget_s * (1 - FINAL_SHARE) if finals else budget_s, exp.dir,
                        record.logger, progress, logged)
        if finals:
            _hold_finals(setup, settings, record, progress, finals_end)
        stats = _summarize(pool.manager, progress)
        return _export(record, exp, objectives)
    finally:
        _stop_manager(pool.manager, answered=stats is not None)


@dataclass
class _Experiment:
    """Where a tune lives: its name, runs/<name>/, and the state a resume reads back (empty: a new tune)."""

    name: str
    dir: Path
    state: dict[str, Any]

    @property
    def state_file(self) -> Path:
        return self.dir / "tune_state.json"


def _open_experiment(model: ModelSpec, settings: TuneSettings, resume: bool) -> _Experiment:
    """The experiment's name and directory, and its saved state: a resume's must exist and be this
    model's; a new tune's must not exist yet."""
    name = settings.experiment or model.name.replace(":", "_").replace("/", "_")
    exp_dir = (Path("runs") / name).resolve()
    state = _load_state(exp_dir / "tune_state.json", exp_dir / "tune", name, model, resume, exp_dir)
    return _Experiment(name, exp_dir, state)


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


@dataclass
class _TunePool:
    """The tune's pool: its spec, the image bank trials draw from, and the manager actor that owns the
    executors (by name: trials find it with ``ray.get_actor``)."""

    spec: PoolSpec
    bank: Any  # ``workload_for``'s bank: ``.bank`` (the images) and ``.shape``
    manager_name: str
    manager: Any


def _start_pool(model: ModelSpec, settings: TuneSettings, address: str | None, experiment: str, data_seed: int,
                npy: str | None) -> _TunePool:
    """Resolves the pool, builds the image bank and starts the pool manager actor."""
    import ray

    from autohet.core.workload import WorkloadSpec, workload_for
    from autohet.pool.resolve import resolve_pool
    from autohet.tuning.manager import PoolManager

    pool_spec = resolve_pool(settings.pool, address)
    bank_images = _SIZED_BANK if settings.images == "auto" else int(settings.images)
    bank = workload_for(model.name, bank_images, data_seed, npy)
    bank_spec = WorkloadSpec(bank_images, bank.shape, data_seed, npy)
    manager_name = f"autohet-manager-{experiment}-{os.getpid()}"
    # restartable: if its worker crashes, Ray rebuilds it and the next trial re-creates the executors
    manager = ray.remote(PoolManager).options(name=manager_name, namespace="autohet", num_cpus=0, max_restarts=3)
    manager = manager.remote(pool_spec, model, bank_spec, f"autohet-{experiment}")
    return _TunePool(pool_spec, bank, manager_name, manager)


@dataclass
class _TrialPlan:
    """How many images a trial runs, how throughput trials are sized by speed (None: all run
    ``images``) and the trial timeout."""

    images: int
    sizing: TrialSizing | None
    deadline_s: float


def _size_trials(model: ModelSpec, settings: TuneSettings, pool: _TunePool, state: dict[str, Any] | None) -> _TrialPlan:
    """The trials' images and timeout: latency trials run ``latency_runs`` requests, throughput trials
    are sized from the pool's measured speed (``images: auto``) or run the given count; a resume
    (``state``) keeps the images of the first run."""
    per_request = settings.objectives.mode.per_request
    limit: float | None = None
    sizing = None
    classes = _output_classes(model, pool)
    if per_request and settings.images == "auto":
        # trials time latency_runs batch-1 requests on the engine: no image count to size, and no
        # pool-wide standalone pass (it took 20-30 s of a GPU box's 100 s latency tunes)
        images = max(settings.min_images, settings.latency_runs)
    elif settings.images == "auto":
        sizing = _sizing(pool.manager, settings, classes)
        images, limit = sizing.images(None), sizing.base_ips
    else:
        images = int(settings.images)
    if state is not None:
        images = int(state["images"])
    if limit is None and settings.trial_timeout_s == "auto" and not per_request:
        limit = float(get_interruptibly(pool.manager.calibrate.remote(settings.standalone_seconds)))
    return _TrialPlan(images, sizing, settings.trial_timeout(images, limit or 0.0))


def _output_classes(model: ModelSpec, pool: _TunePool) -> int:
    """The model's output width (classes), from the reference output of one image."""
    from autohet.context import RunContext
    from autohet.core.workload import Workload

    ctx = RunContext(model, Workload(pool.bank.bank, 1), 1)
    return int(ctx.reference(np.zeros(1, dtype=np.int64), pool.spec.simulated).shape[1])


def _reference_outputs(model: ModelSpec, settings: TuneSettings, pool_spec: PoolSpec,
                       workload: Workload) -> dict[str, np.ndarray]:
    """The single-device outputs the trials' output checks compare with, computed once here: the
    sample of ``workload`` and, for latency trials, the sample of their ``latency_runs`` requests."""
    from autohet.context import RunContext

    ctx = RunContext(model, workload, settings.check_images)
    ctx.reference(workload.indices_sample(settings.check_images), pool_spec.simulated)
    if settings.objectives.mode.per_request:
        lat = ctx.with_images(settings.latency_runs)  # shares ctx's references: computed into the same store
        lat.reference(lat.workload.indices_sample(settings.check_images), pool_spec.simulated)
    return ctx.references()


def _trial_setup(model: ModelSpec, settings: TuneSettings, pool: _TunePool, plan: _TrialPlan, workload: Workload,
                 references: dict[str, np.ndarray], data_seed: int, npy: str | None) -> TrialSetup:
    """What every trial shares (``TrialSetup``), handed to Ray Tune once."""
    from autohet.tuning.trainable import TrialSetup

    return TrialSetup(model, workload, settings.objectives.name, pool.manager_name, settings.check_images,
                      settings.standalone_seconds, settings.latency_runs, deadline_s=plan.deadline_s,
                      cut_factor=float(settings.cut_factor), workload_seed=data_seed, npy=npy,
                      reference=references, max_temp=settings.max_temp,
                      cool_margin_c=settings.cool_margin_c, cool_max_s=settings.cool_max_s,
                      pool_spec=pool.spec, sizing=plan.sizing)


@dataclass
class _Record:
    """Where the tune is logged in MLflow: the client, the experiment, the parent run, the trial logger."""

    client: Any
    experiment_id: str
    parent_id: str
    platform: dict[str, Any]
    logger: TrialLogger


def _open_parent_run(model: ModelSpec, settings: TuneSettings, exp: _Experiment, pool_spec: PoolSpec, images: int,
                     space: SearchSpace, resume: bool, data_seed: int, npy: str | None) -> _Record:
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
        parent_id = _start_parent(client, experiment_id, model, settings, pool_spec, images, space, platform)
        exp.dir.mkdir(parents=True, exist_ok=True)
        exp.state = {"model": model.to_dict(), "parent_run_id": parent_id, "images": images,
                     "experiment_id": experiment_id, "settings": settings.to_dict(), "tracking_uri": uri,
                     "data_seed": data_seed, "npy": npy}
        exp.state_file.write_text(json.dumps(exp.state, indent=1))
    return _Record(client, experiment_id, parent_id, platform, TrialLogger(uri, experiment_id, parent_id, platform))


def _open_study(exp: _Experiment, objectives: ObjectiveSet, record: _Record, resume: bool) -> Any:
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


def _trials_so_far(settings: TuneSettings, record: _Record) -> tuple[Progress, set[str | None]]:
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


def _first_points(space: SearchSpace, pool_spec: PoolSpec, space_ctx: SpaceContext, objectives: ObjectiveSet,
                  resume: bool) -> FirstPoints | None:
    """The staged first points of a new tune (``staged_points``); None on a resume: the first run
    enqueued them in the study, which holds those not yet run."""
    from autohet.tuning.initial import staged_points

    return None if resume else staged_points(space, pool_spec, space_ctx, objectives.mode)


def _searcher(model: ModelSpec, settings: TuneSettings, space: SearchSpace, pool_spec: PoolSpec, study_name: str,
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
    first = _first_points(space, pool_spec, space_ctx, objectives, resume)
    return StagedSearch(
        DefineByRun(space, space_ctx), metric=objectives.search_metric, mode=objectives.search_mode,
        points_to_evaluate=first.singles if first else None, later=first.later() if first else None,
        kind_of=SingleKind(pool_spec), objectives=objectives,
        sampler=sampler, study_name=study_name, storage=storage, seed=settings.seed)


def _trial_budget_s(settings: TuneSettings, started: float) -> float:
    """Seconds left for trials: the budget covers the whole command, the set-up so far and about 15 s
    to export at the end (at least 10 s; a note when the set-up left under 30 s)."""
    left = settings.time_budget_s - (time.time() - started) - 15.0
    if left < 30.0:
        print(f"autohet: note: the set-up took {time.time() - started:.0f} s of --time-budget "
              f"{settings.time_budget_s:g} s, leaving {max(left, 0.0):.0f} s for trials; raise --time-budget",
              file=sys.stderr)
    return max(10.0, left)


def _run_search(searcher: StagedSearch, setup: TrialSetup, trials: int, budget_s: float, exp_dir: Path,
                logger: TrialLogger, progress: Progress, logged: set[str | None]) -> None:
    """Runs up to ``trials`` trials within ``budget_s`` through Ray Tune, one at a time, each logged
    to MLflow as it finishes."""
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


def _finals_on(settings: TuneSettings) -> bool:
    """Finals need two finalists and one figure to rank them by (a Pareto tune exports its front)."""
    return int(settings.finalists) >= 2 and not settings.objectives.multi


def _hold_finals(setup: TrialSetup, settings: TuneSettings, record: _Record, progress: Progress,
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


def _summarize(manager: Any, progress: Progress) -> dict[str, int] | None:
    """Prints where the tune's wall time went; returns the manager's stats (None: it did not answer)."""
    if sys.stderr.isatty():
        print(file=sys.stderr)
    stats = answer_or_none(manager.stats.remote(), MANAGER_ANSWER_S)
    print(progress.breakdown(stats), file=sys.stderr, flush=True)
    return stats


def _export(record: _Record, exp: _Experiment, objectives: ObjectiveSet) -> TuneOutcome:
    """Exports the best valid trial (``record_outcome``) and closes the parent run."""
    from autohet.tracking import record_outcome

    outcome = record_outcome(record.client, exp.name, record.experiment_id, record.parent_id, objectives, exp.dir,
                             record.platform)
    record.client.set_terminated(record.parent_id, "FINISHED")
    return outcome


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
    or restarting (Ray's memory monitor killed the manager of a 2-core box's README vgg16 tune after
    its last trial: the finished trials must still be exported)."""
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):  # ActorUnavailableError is one
        return None


def _telemetry_notes(settings: TuneSettings, pool_spec: PoolSpec) -> None:
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


def _start_parent(client: Any, experiment_id: str, model: ModelSpec, settings: TuneSettings, pool_spec: PoolSpec,
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
