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
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from autohet.errors import UserError
from autohet.models import ModelSpec
from autohet.objectives import ObjectiveSet
from autohet.pool import PoolSpec
from autohet.pool.spec import POOL_DIMS
from autohet.tracking import TuneOutcome
from autohet.tuning.dims import SpaceContext
from autohet.tuning.settings import TuneSettings
from autohet.tuning.space import DefineByRun, SearchSpace, load_search_space

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
    from autohet.strategies._inprocess import default_devices

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
    import ray

    from autohet.tuning.trainable import MAX_OUTPUT_BYTES, TrialSizing

    limit = float(ray.get(manager.calibrate.remote(settings.standalone_seconds)))
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
    """Runs (or resumes) a tune and exports the best valid trial to runs/<experiment>/best.yaml."""
    import ray
    from ray import tune

    from autohet.context import RunContext
    from autohet.platform_info import fingerprint
    from autohet.pool.resolve import resolve_pool
    from autohet.ray_runtime import init_ray
    from autohet.tracking import TrialLogger, ensure_experiment, mlflow_client, record_outcome, trial_runs
    from autohet.tuning.callbacks import tune_callbacks
    from autohet.tuning.initial import staged_points
    from autohet.tuning.manager import PoolManager
    from autohet.tuning.progress import Progress
    from autohet.tuning.resume import finished_trials, settle_study
    from autohet.tuning.trainable import TrialSetup, tune_entry
    from autohet.workload import Workload, WorkloadSpec, workload_for

    started = time.time()
    objectives: ObjectiveSet = settings.objectives
    experiment = settings.experiment or model.name.replace(":", "_").replace("/", "_")
    exp_dir = (Path("runs") / experiment).resolve()
    state_file = exp_dir / "tune_state.json"
    state = _load_state(state_file, exp_dir / "tune", experiment, model, resume, exp_dir)
    space, left_out = load_search_space(settings.search_spaces).restrict(settings.strategy_list,
                                                                         objectives.mode).for_machine()
    for note in left_out:
        print(f"autohet: note: {note}", file=sys.stderr)
    if objectives.mode.per_request and list(space.strategies) == ["single"]:
        print("autohet: note: only `single` serves latency runs with these search spaces", file=sys.stderr)
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    # one logical CPU more than the machine has: the trial process (it only waits on executors)
    init_ray(address, num_cpus=None if address else (os.cpu_count() or 1) + 1)
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    logging.getLogger("ray.train").setLevel(logging.ERROR)
    pool_spec = resolve_pool(settings.pool, address)
    bank_images = _SIZED_BANK if settings.images == "auto" else int(settings.images)
    bank = workload_for(model.name, bank_images, data_seed, npy)
    bank_spec = WorkloadSpec(bank_images, bank.shape, data_seed, npy)
    manager_name = f"autohet-manager-{experiment}-{os.getpid()}"
    # restartable: if its worker crashes, Ray rebuilds it and the next trial re-creates the executors
    manager = ray.remote(PoolManager).options(name=manager_name, namespace="autohet", num_cpus=0, max_restarts=3)
    manager = manager.remote(pool_spec, model, bank_spec, f"autohet-{experiment}")
    stats: dict[str, int] | None = {}  # None: the manager did not answer at the end (see answer_or_none)
    try:
        limit: float | None = None
        sizing = None
        classes = int(RunContext(model, Workload(bank.bank, 1), 1).reference(
            np.zeros(1, dtype=np.int64), pool_spec.simulated).shape[1])
        if objectives.mode.per_request and settings.images == "auto":
            # trials time latency_runs batch-1 requests on the engine: no image count to size, and no
            # pool-wide standalone pass (it took 20-30 s of a GPU box's 100 s latency tunes)
            images = max(settings.min_images, settings.latency_runs)
        elif settings.images == "auto":
            sizing = _sizing(manager, settings, classes)
            images, limit = sizing.images(None), sizing.base_ips
        else:
            images = int(settings.images)
        if resume:
            images = int(state["images"])
        if limit is None and settings.trial_timeout_s == "auto" and not objectives.mode.per_request:
            limit = float(ray.get(manager.calibrate.remote(settings.standalone_seconds)))
        deadline_s = settings.trial_timeout(images, limit or 0.0)
        workload = Workload(bank.bank, images)
        ctx = RunContext(model, workload, settings.check_images)
        ctx.reference(workload.indices_sample(settings.check_images), pool_spec.simulated)
        if objectives.mode.per_request:
            lat = ctx.with_images(settings.latency_runs)
            lat.reference(lat.workload.indices_sample(settings.check_images), pool_spec.simulated)
        setup = TrialSetup(model, workload, objectives.name, manager_name, settings.check_images,
                           settings.standalone_seconds, settings.latency_runs, deadline_s=deadline_s,
                           cut_factor=float(settings.cut_factor), workload_seed=data_seed, npy=npy,
                           reference=dict(ctx._reference), max_temp=settings.max_temp,
                           cool_margin_c=settings.cool_margin_c, cool_max_s=settings.cool_max_s,
                           pool_spec=pool_spec, sizing=sizing)
        _telemetry_notes(settings, pool_spec)

        uri = settings.tracking_uri
        client = mlflow_client(uri)
        experiment_id = ensure_experiment(client, experiment, uri)
        platform = fingerprint()
        if resume:
            parent_id = state["parent_run_id"]
            client.update_run(parent_id, status="RUNNING")
        else:
            parent_id = _start_parent(client, experiment_id, model, settings, pool_spec, images, space, platform)
            exp_dir.mkdir(parents=True, exist_ok=True)
            state = {"model": model.to_dict(), "parent_run_id": parent_id, "images": images,
                     "experiment_id": experiment_id, "settings": settings.to_dict(), "tracking_uri": uri,
                     "data_seed": data_seed, "npy": npy}
            state_file.write_text(json.dumps(state, indent=1))
        logger = TrialLogger(uri, experiment_id, parent_id, platform)

        import optuna

        from autohet.tuning.search import SingleKind, StagedSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.RDBStorage(f"sqlite:///{exp_dir / 'optuna.db'}")
        if resume:
            study = optuna.load_study(study_name=experiment, storage=storage)
            settled = settle_study(study, trial_runs(client, experiment_id, parent_id), objectives, logger)
            if settled["killed"] or settled["told"]:
                print(f"autohet: resume: {settled['killed']} trial(s) the kill interrupted recorded as killed, "
                      f"{settled['told']} finished trial(s) given to the study", file=sys.stderr)
        earlier = trial_runs(client, experiment_id, parent_id)
        done_before = len(finished_trials(earlier))
        logged = {r.data.tags.get("tune_trial_id") for r in earlier}
        remaining = settings.trials - done_before
        progress = Progress(settings.trials, objectives, done_before, float(settings.time_budget_s))
        if remaining > 0:
            pool_dims = bool(pool_spec.auto) and bool(space.pool)
            space_ctx = space_context(space, pool_spec, model, pool_dims)
            metric, mode = objectives.search_metric, objectives.search_mode
            sampler = (optuna.samplers.NSGAIISampler(seed=settings.seed) if objectives.multi
                       else optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=5))
            # the first points were enqueued in the study by the first run; a resume finds the rest there
            first = None if resume else staged_points(space, pool_spec, space_ctx, objectives.mode)
            searcher = StagedSearch(
                DefineByRun(space, space_ctx), metric=metric, mode=mode,
                points_to_evaluate=first.singles if first else None, later=first.strategies if first else None,
                kind_of=SingleKind(pool_spec), objectives=objectives,
                sampler=sampler, study_name=experiment, storage=storage, seed=settings.seed)
            # the budget covers the whole command: set-up so far, and about 15 s to export at the end
            left = settings.time_budget_s - (time.time() - started) - 15.0
            if left < 30.0:
                print(f"autohet: note: the set-up took {time.time() - started:.0f} s of --time-budget "
                      f"{settings.time_budget_s:g} s, leaving {max(left, 0.0):.0f} s for trials; raise --time-budget",
                      file=sys.stderr)
            budget = max(10.0, left)
            trainable = tune.with_resources(tune.with_parameters(tune_entry, setup=setup), {"cpu": 0.01})
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(search_alg=searcher, num_samples=remaining, time_budget_s=budget,
                                            max_concurrent_trials=1,
                                            reuse_actors=True),  # one trial process for all: no import per trial
                run_config=tune.RunConfig(name=f"tune-{int(time.time())}", storage_path=str(exp_dir),
                                          callbacks=tune_callbacks(logger, progress, logged), verbose=0,
                                          log_to_file=True),
            )
            tuner.fit()
        if sys.stderr.isatty():
            print(file=sys.stderr)
        stats = answer_or_none(manager.stats.remote(), MANAGER_ANSWER_S)
        print(progress.breakdown(stats), file=sys.stderr, flush=True)
        outcome = record_outcome(client, experiment, experiment_id, parent_id, objectives, exp_dir, platform)
        client.set_terminated(parent_id, "FINISHED")
        return outcome
    finally:
        try:
            if stats is not None:  # an idle manager ends its executors itself
                ray.get(manager.shutdown.remote())
            ray.kill(manager)  # a busy one with them: they are its actors and end with it
        except Exception:  # the manager is already gone when Ray is shutting down
            logging.getLogger(__name__).debug("manager already stopped")


# how long the end of a tune waits for the manager: a trial stopped by the time budget may have left
# it inside an executor set-up that cannot be interrupted (on the 2-core box a vgg16 CPU executor
# compiling with inductor at batch 256 held the end of the README's main job 97 s past its budget)
MANAGER_ANSWER_S = 10.0


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
    from autohet.running import energy_sources
    from autohet.telemetry import read_temperatures

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
