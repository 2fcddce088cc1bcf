"""``autohet tune``: Ray Tune + OptunaSearch over the YAML spaces, every trial logged to MLflow.

One trial at a time (trials share the devices). Executors are created once per pool topology by
a manager actor and reused by every trial. The Optuna study (sqlite) and Tune's experiment state
live under runs/<experiment>/, so a killed tune continues with --resume and keeps finished trials.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autohet.errors import UserError
from autohet.models import ModelSpec
from autohet.pool import PoolSpec
from autohet.tuning.settings import TuneSettings
from autohet.tuning.space import SearchSpace, SpaceContext, load_search_space

__all__ = ["DefineByRun", "TuneOutcome", "export_run", "space_context", "tune_model"]


class DefineByRun:
    """The define-by-run space as a picklable callable (Tune checkpoints its searcher)."""

    def __init__(self, space: SearchSpace, ctx: SpaceContext) -> None:
        self.space, self.ctx = space, ctx

    def __call__(self, trial: Any) -> None:
        self.space.define(trial, self.ctx)


@functools.lru_cache(maxsize=8)
def block_count(model: ModelSpec) -> int:
    """Blocks of ``partition(model, batch=1)``: the length of a placement vector (seconds for vgg16, so cached)."""
    from autohet.partition import partition

    return len(partition(model.name, batch=1, seed=model.seed).blocks)


def space_context(space: SearchSpace, pool: PoolSpec, model: ModelSpec, pool_dims: bool) -> SpaceContext:
    """Sizes for the space's dims; partitions the model only when a block vector can be searched."""
    kinds = frozenset(e.kind for e in pool.executors)
    devices = SpaceContext.devices_for(kinds)
    blocks = block_count(model) if devices > 1 and space.has_type("block_devices") else 0
    return SpaceContext(_max_pool_size(pool, space, pool_dims), kinds, pool_dims, blocks, devices)


def _fits(dim: Any, value: Any) -> bool:
    if value is None:
        return False
    if dim.type in ("int", "float"):
        return dim.low <= value <= dim.high
    if dim.type == "categorical":
        return value in dim.choices
    return False


def initial_points(space: SearchSpace, pool: PoolSpec) -> list[dict[str, Any]]:
    """Single on the first executor of each device kind (a GPU at each of its batch choices), then
    every strategy at its defaults."""
    from autohet.strategies import get_strategy

    exec_defaults: dict[str, Any] = {}
    for kind in sorted({e.kind for e in pool.executors}):
        first = next(e for e in pool.executors if e.kind == kind)
        for name, dim in space.executors.get(kind, {}).items():
            value = first.executor_params().get(name)
            if _fits(dim, value):
                exec_defaults[f"exec.{kind}.{name}"] = value
    points = []
    seen_kinds: set[str] = set()
    for i, e in enumerate(pool.executors):
        if (e.kind, e.threads) not in seen_kinds:
            seen_kinds.add((e.kind, e.threads))
            points.append({"strategy": "single", "single.executor": i, **exec_defaults})
            # a GPU alone is the figure every mixed config must beat: try it at each batch choice
            batch = space.executors.get(e.kind, {}).get("batch")
            if e.kind == "gpu" and batch is not None and batch.type == "categorical":
                points += [{"strategy": "single", "single.executor": i, **exec_defaults, "exec.gpu.batch": b}
                           for b in batch.choices if b != exec_defaults.get("exec.gpu.batch")]
    for name, dims in space.strategies.items():
        if name == "single":
            continue
        defaults = get_strategy(name).validate({})
        point = {"strategy": name, **exec_defaults}
        point.update({f"{name}.{p}": defaults[p] for p, dim in dims.items() if _fits(dim, defaults[p])})
        points.append(point)
    return points


@dataclass
class TuneOutcome:
    experiment: str
    parent_run_id: str
    best_path: Path | None
    best: dict[str, Any] | None
    summary: list[dict[str, Any]]
    trials_done: int


class _Progress:
    """A live line on stderr: trials done / budget, elapsed, best so far and its strategy."""

    def __init__(self, budget: int, objective: str, done_before: int) -> None:
        self.budget, self.objective = budget, objective
        self.done = done_before
        self.start = time.time()
        self.best: tuple[float, str] | None = None
        self.tty = sys.stderr.isatty()
        self.seconds: dict[str, float] = {}  # summed trial phases (time.*), and MLflow logging
        self.cut = 0

    def update(self, result: dict[str, Any], logging_s: float = 0.0) -> None:
        self.done += 1
        for key, value in result.items():
            if key.startswith("time.") and isinstance(value, int | float):
                self.seconds[key[5:]] = self.seconds.get(key[5:], 0.0) + float(value)
        self.seconds["mlflow_log_s"] = self.seconds.get("mlflow_log_s", 0.0) + logging_s
        self.cut += int(result.get("timed_out", 0))
        if result.get("valid"):
            value = float(result["objective_value"])
            better = self.best is None or (value > self.best[0] if self.objective == "throughput"
                                           else value < self.best[0])
            if better:
                self.best = (value, result.get("strategy", "?"))
        unit = "img/s" if self.objective == "throughput" else "ms p50"
        best = f"best {self.best[0]:.4g} {unit} ({self.best[1]})" if self.best else "no valid trial yet"
        elapsed = time.strftime("%H:%M:%S", time.gmtime(time.time() - self.start))
        line = f"[{self.done:>3}/{self.budget}] {elapsed}  {best}  last: {result.get('strategy', '?')}" + (
            "" if result.get("valid") else " (invalid)")
        print(("\r" + line.ljust(100)) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)

    def breakdown(self, manager_stats: dict[str, int]) -> str:
        """Where the tune's wall time went: the trials' phases, MLflow logging, the rest (Ray Tune,
        set-up, export), and how often executors were started."""
        wall = time.time() - self.start
        parts = [f"{name.removesuffix('_s')} {secs:.0f} s" for name, secs in self.seconds.items() if name != "trial_s"]
        rest = wall - self.seconds.get("trial_s", 0.0) - self.seconds.get("mlflow_log_s", 0.0)
        return (f"autohet: {self.done} trials in {wall:.0f} s: " + ", ".join(parts) + f", other {rest:.0f} s; "
                f"{manager_stats.get('topologies_started', 0)} executor topologies started "
                f"({manager_stats.get('actors_adopted', 0)} actors reused from earlier ones, "
                f"{manager_stats.get('actors_replaced', 0)} replaced after cuts), "
                f"{manager_stats.get('standalone_measured', 0)} standalone measurements, {self.cut} trials cut")


def _callbacks(logger: Any, progress: _Progress, logged: set[str]):
    from ray.tune import Callback

    class TrialLogging(Callback):
        """Logs each finished trial to MLflow at once, so a killed tune loses no finished trial.

        A trial that Tune re-runs after a resume (it finished, but the kill came before Tune
        saved that) is logged once: the first measurement stays.
        """

        def _log(self, trial: Any, result: dict) -> None:
            if trial.trial_id in logged:
                return
            logged.add(trial.trial_id)
            t0 = time.perf_counter()
            logger.log(progress.done + 1, trial.config, result, trial.trial_id)
            progress.update(result, time.perf_counter() - t0)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self._log(trial, result)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._log(trial, {"strategy": trial.config.get("strategy"), "valid": 0, "objective_value": 0.0,
                              "error": f"trial crashed: {trial.error_file or 'see Ray logs'}"})

    return [TrialLogging()]


def _calibrate_images(manager: Any, settings: TuneSettings) -> tuple[int, float]:
    """Images per trial (sized to target_trial_seconds) and the base pool's summed throughput."""
    import ray

    limit = ray.get(manager.calibrate.remote(settings.standalone_seconds))
    images = int(limit * settings.target_trial_seconds)
    return max(settings.min_images, min(settings.max_images, images)), float(limit)


def tune_model(model: ModelSpec, settings: TuneSettings, address: str | None = None, resume: bool = False,
               data_seed: int = 0, npy: str | None = None) -> TuneOutcome:
    """Runs (or resumes) a tune and exports the best valid trial to runs/<experiment>/best.yaml."""
    import ray
    from ray import tune

    started = time.time()
    from autohet.commands._common import make_workload, resolve_pool
    from autohet.models import input_shape
    from autohet.platform_info import fingerprint
    from autohet.ray_runtime import init_ray
    from autohet.run import RunContext
    from autohet.tuning.manager import PoolManager
    from autohet.tuning.tracking import TrialLogger, ensure_experiment, mlflow_client, trial_runs
    from autohet.tuning.trainable import TrialSetup, tune_entry
    from autohet.workload import Workload, WorkloadSpec

    experiment = settings.experiment or model.name.replace(":", "_").replace("/", "_")
    exp_dir = (Path("runs") / experiment).resolve()
    state_file = exp_dir / "tune_state.json"
    tune_dir = exp_dir / "tune"
    state: dict[str, Any] = {}
    if resume:
        if not state_file.is_file() or not (tune_dir / "trials").exists() and not tune_dir.exists():
            raise UserError(f"nothing to resume for experiment {experiment!r} (no {state_file}); "
                            "run `autohet tune` without --resume")
        state = json.loads(state_file.read_text())
        if state["model"] != model.to_dict():
            raise UserError(f"experiment {experiment!r} tuned model {state['model']['name']}; resume it with "
                            f"--model {state['model']['name']} or pick another --experiment")
    elif state_file.is_file():
        raise UserError(f"experiment {experiment!r} already has a tune in {exp_dir}; add --resume to continue "
                        "it or pass --experiment NEW_NAME")
    space = load_search_space(settings.search_spaces).restrict(settings.strategy_list, settings.objective)
    if settings.objective == "latency" and list(space.strategies) == ["single"]:
        print("autohet: note: only `single` serves --objective latency with these search spaces", file=sys.stderr)
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    # one logical CPU more than the machine has: the trial process (it only waits on executors)
    init_ray(address, num_cpus=None if address else (os.cpu_count() or 1) + 1)
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    logging.getLogger("ray.train").setLevel(logging.ERROR)
    pool_spec = resolve_pool(settings.pool, address)
    bank_images = settings.max_images if settings.images == "auto" else int(settings.images)
    bank = make_workload(model, bank_images, data_seed, npy)
    bank_spec = WorkloadSpec(bank_images, input_shape(model.name), data_seed, npy)
    manager_name = f"autohet-manager-{experiment}-{os.getpid()}"
    # restartable: if its worker crashes, Ray rebuilds it and the next trial re-creates the executors
    manager = ray.remote(PoolManager).options(name=manager_name, namespace="autohet", num_cpus=0, max_restarts=3)
    manager = manager.remote(pool_spec, model, bank_spec, f"autohet-{experiment}")
    try:
        limit: float | None = None
        if resume:
            images = int(state["images"])
        elif settings.images == "auto":
            images, limit = _calibrate_images(manager, settings)
        else:
            images = int(settings.images)
        if limit is None and settings.trial_timeout_s == "auto":
            limit = float(ray.get(manager.calibrate.remote(settings.standalone_seconds)))
        deadline_s = settings.trial_timeout(images, limit or 0.0)
        workload = Workload(bank.bank, images)
        ctx = RunContext(model, workload, settings.check_images)
        sample = workload.indices_sample(settings.check_images)
        ctx.reference(sample, pool_spec.simulated)
        if settings.objective == "latency":
            lat = ctx.with_images(settings.latency_runs)
            lat.reference(lat.workload.indices_sample(settings.check_images), pool_spec.simulated)
        setup = TrialSetup(model, workload, settings.objective, manager_name, settings.check_images,
                           settings.standalone_seconds, settings.latency_runs, deadline_s=deadline_s,
                           cut_factor=float(settings.cut_factor),
                           workload_seed=data_seed, npy=npy, reference=dict(ctx._reference))

        uri = settings.tracking_uri
        client = mlflow_client(uri)
        experiment_id = ensure_experiment(client, experiment, uri)
        platform = fingerprint()
        if resume:
            parent_id = state["parent_run_id"]
            client.update_run(parent_id, status="RUNNING")
        else:
            parent = client.create_run(experiment_id, run_name=f"tune-{model.name}-{settings.objective}",
                                       tags={"autohet_kind": "tune", "model": model.name})
            parent_id = parent.info.run_id
            params = {"model": model.name, "weights_seed": model.seed, "objective": settings.objective,
                      "pool": pool_spec.source, "trials": settings.trials, "time_budget_s": settings.time_budget_s,
                      "images": images, "seed": settings.seed, "strategies": ",".join(space.strategies),
                      "simulated": pool_spec.simulated}
            params.update({f"platform.{k}": v for k, v in platform.items()})
            for key, value in params.items():
                client.log_param(parent_id, key, str(value)[:6000])
            client.log_text(parent_id, yaml.safe_dump(pool_spec.to_dict(), sort_keys=False), "pool.yaml")
            exp_dir.mkdir(parents=True, exist_ok=True)
            state = {"model": model.to_dict(), "parent_run_id": parent_id, "images": images,
                     "experiment_id": experiment_id, "settings": settings.to_dict(), "tracking_uri": uri,
                     "data_seed": data_seed, "npy": npy}
            state_file.write_text(json.dumps(state, indent=1))
        earlier = trial_runs(client, experiment_id, parent_id)
        done_before = len(earlier)
        logged = {r.data.tags.get("tune_trial_id") for r in earlier}
        logger = TrialLogger(uri, experiment_id, parent_id, platform)
        progress = _Progress(settings.trials, settings.objective, done_before)
        trainable = tune.with_resources(tune.with_parameters(tune_entry, setup=setup), {"cpu": 0.01})
        mode = "max" if settings.objective == "throughput" else "min"
        # the budget covers the whole command: set-up so far, and about 15 s to export at the end
        budget = max(10.0, settings.time_budget_s - (time.time() - started) - 15.0)
        callbacks = _callbacks(logger, progress, logged)
        if resume and tune.Tuner.can_restore(str(tune_dir)):
            tuner = tune.Tuner.restore(str(tune_dir), trainable, resume_unfinished=True, resume_errored=True)
            tuner._local_tuner._run_config.callbacks = callbacks  # fresh loggers for this process
            tuner._local_tuner._tune_config.time_budget_s = budget
        else:
            import optuna
            from ray.tune.search.optuna import OptunaSearch

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            pool_dims = bool(pool_spec.auto) and bool(space.pool)
            storage = optuna.storages.RDBStorage(f"sqlite:///{exp_dir / 'optuna.db'}")
            searcher = OptunaSearch(
                DefineByRun(space, space_context(space, pool_spec, model, pool_dims)),
                metric="objective_value", mode=mode, points_to_evaluate=initial_points(space, pool_spec),
                sampler=optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=5),
                study_name=experiment, storage=storage, seed=settings.seed)
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(search_alg=searcher, num_samples=settings.trials,
                                            time_budget_s=budget, max_concurrent_trials=1,
                                            reuse_actors=True),  # one trial process for all: no import per trial
                run_config=tune.RunConfig(name="tune", storage_path=str(exp_dir), callbacks=callbacks,
                                          verbose=0, log_to_file=True),
            )
        tuner.fit()
        if sys.stderr.isatty():
            print(file=sys.stderr)
        print(progress.breakdown(ray.get(manager.stats.remote())), file=sys.stderr, flush=True)
        outcome = finish_tune(client, experiment, experiment_id, parent_id, settings.objective, exp_dir, platform)
        client.set_terminated(parent_id, "FINISHED")
        return outcome
    finally:
        try:
            ray.get(manager.shutdown.remote())
            ray.kill(manager)
        except Exception:  # the manager is already gone when Ray is shutting down
            logging.getLogger(__name__).debug("manager already stopped")


def _max_pool_size(pool: PoolSpec, space: SearchSpace, pool_dims: bool) -> int:
    """Executors in the largest topology the space can ask for (sizes pool_index and weights)."""
    if not pool_dims or not set(space.pool) & {"cpu_group_size", "max_cpu_groups"}:
        return len(pool.executors)
    import itertools

    from autohet.tuning.manager import regroup

    def values(name: str) -> list[Any]:
        dim = space.pool.get(name)
        if dim is None:
            return [None]
        return list(dim.choices) if dim.type == "categorical" else list(range(int(dim.low), int(dim.high) + 1))

    choices = {name: values(name) for name in ("cpu_group_size", "max_cpu_groups")}
    return max(len(regroup(pool, dict(zip(choices, combo, strict=True))).executors)
               for combo in itertools.product(*choices.values()))


def summarize(runs: list[Any], objective: str) -> list[dict[str, Any]]:
    """Best valid trial per strategy (and counts), best strategy first."""
    by_strategy: dict[str, dict[str, Any]] = {}
    for run in runs:
        strategy = run.data.tags.get("strategy", "?")
        row = by_strategy.setdefault(strategy, {"strategy": strategy, "trials": 0, "invalid": 0, "best": None,
                                                "run_id": None, "efficiency": None})
        row["trials"] += 1
        if run.data.tags.get("valid") != "true":
            row["invalid"] += 1
            continue
        value = run.data.metrics.get("objective_value")
        if value is None:
            continue
        better = row["best"] is None or (value > row["best"] if objective == "throughput" else value < row["best"])
        if better:
            row.update(best=value, run_id=run.info.run_id, efficiency=run.data.metrics.get("efficiency"),
                       params={k: v for k, v in run.data.params.items() if k.startswith(strategy + ".")})
    rows = list(by_strategy.values())
    sign = -1 if objective == "throughput" else 1
    rows.sort(key=lambda r: (r["best"] is None, sign * (r["best"] or 0)))
    return rows


def export_run(client: Any, run_id: str, out: Path, platform: dict[str, Any] | None, experiment: str) -> dict:
    """Writes the trial's config (schema-versioned YAML) with its MLflow run id and platform."""
    from mlflow.artifacts import download_artifacts

    from autohet.config import load_config, write_config

    run = client.get_run(run_id)
    if run.data.tags.get("autohet_kind") != "trial":
        raise UserError(f"run {run_id} is not an autohet trial; pick a trial run id from `autohet compare`")
    try:
        local = download_artifacts(run_id=run_id, artifact_path="config.yaml",
                                   tracking_uri=client.tracking_uri)
    except Exception as exc:
        raise UserError(f"trial {run_id} has no config.yaml (it failed before running: "
                        f"{run.data.tags.get('error', 'no measurement')[:200]})") from exc
    config = load_config(local)
    config.mlflow = {"experiment": experiment, "run_id": run_id}
    if platform is not None:
        config.platform = platform
    elif "platform.cpu_model" in client.get_run(run.data.tags["mlflow.parentRunId"]).data.params:
        parent = client.get_run(run.data.tags["mlflow.parentRunId"]).data.params
        config.platform = {k.split(".", 1)[1]: _param_value(v) for k, v in parent.items() if k.startswith("platform.")}
    write_config(config, out)
    return config.to_dict()


def _param_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def finish_tune(client: Any, experiment: str, experiment_id: str, parent_id: str, objective: str, exp_dir: Path,
                platform: dict[str, Any]) -> TuneOutcome:
    from autohet.tuning.plots import comparison_figure
    from autohet.tuning.tracking import trial_runs

    runs = trial_runs(client, experiment_id, parent_id)
    rows = summarize(runs, objective)
    valid = [r for r in rows if r["best"] is not None]
    best_path = None
    best = None
    if valid:
        best_row = valid[0]
        best_path = exp_dir / "best.yaml"
        best = export_run(client, best_row["run_id"], best_path, platform, experiment)
        client.log_artifact(parent_id, str(best_path))
        metric = "throughput_ips" if objective == "throughput" else "latency_p50_ms"
        fig = comparison_figure({r["strategy"]: r["best"] for r in valid}, metric,
                                f"{experiment}: best valid trial per strategy")
        client.log_figure(parent_id, fig, "comparison.png")
        client.log_metric(parent_id, "best_objective_value", float(best_row["best"]))
        client.set_tag(parent_id, "best_run_id", best_row["run_id"])
        client.set_tag(parent_id, "best_strategy", best_row["strategy"])
    return TuneOutcome(experiment, parent_id, best_path, best, rows, len(runs))
