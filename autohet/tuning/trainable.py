"""The function Ray Tune runs for each trial: one real strategy run on the manager's executors.

A trial ends with one status (``autohet.tracking.STATUSES``): ``ok``, ``invalid`` (outputs failed
the check), ``cut`` (slower than the deadline or than cut_factor x the fastest run; the tune logs a trial
the search's time budget stopped as cut too, ``study.stopped_trials``), ``refused``
(it cannot finish in time, or its parameters do not fit the pool), ``violation`` (it ran, but past a
bound: its measured max temperature above ``max_temp``, or a bound the strategy itself reports in
``m.extra["violation"]``). Only ``ok`` trials carry their objective values; the others report each
objective's worst value, so the searcher never prefers them. With ``max_temp`` set, each trial first
waits (capped) for the devices to cool a margin below it, so one hot trial does not fail the next.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import yaml

from autohet.config import RunConfig
from autohet.context import RunContext
from autohet.core.errors import RunTimeout, UserError
from autohet.core.measurement import Measurement
from autohet.core.objectives import PRIMARY_METRIC, ObjectiveSet, TrialKey
from autohet.core.settings import CPU_ENGINE_HEADROOM, CUT_DRAIN_S, CUT_FLOOR_S, ENGINE_HEADROOM, MAX_OUTPUT_BYTES
from autohet.core.workload import Workload
from autohet.platform.thermal import too_hot, wait_cool
from autohet.pool import PoolSpec
from autohet.strategies import get_strategy, is_baseline
from autohet.strategy_run import energy_sources, run_strategy
from autohet.tuning.space import SearchSpace
from autohet.tuning.trial_setup import TrialSetup, TrialSizing, engine_devices, engine_shortfall, trial_images
from autohet.tuning.trial_setup import cut_deadline as _cut_deadline
from autohet.tuning.trial_setup import refuse_hopeless_engine as _refuse_hopeless_engine
from autohet.tuning.trial_setup import refuse_hopeless_single as _refuse_hopeless_single
from autohet.tuning.trial_setup import refuse_negligible_regroup as _refuse_negligible_regroup
from autohet.tuning.trial_setup import refuse_saturated_partitions as _refuse_saturated_partitions
from autohet.tuning.trial_setup import single_speed as _single_speed

__all__ = ["CPU_ENGINE_HEADROOM", "CUT_DRAIN_S", "CUT_FLOOR_S", "ENGINE_HEADROOM", "MAX_OUTPUT_BYTES", "TrialSetup",
           "TrialSizing", "engine_shortfall", "objective_metrics", "run_trial", "trial_images", "trial_metrics",
           "trial_status", "tune_entry"]


def trial_metrics(m: Measurement) -> dict[str, Any]:
    """The flat numbers reported to Tune (and logged to MLflow) for a measured trial: only figures
    that were measured (a latency run has no limit and no efficiency)."""
    out: dict[str, Any] = {TrialKey.THROUGHPUT: m.throughput_ips, TrialKey.MAX_ABS_DIFF: m.max_abs_diff,
                           TrialKey.WALL: m.wall_s, TrialKey.IMAGES: m.images, TrialKey.SIMULATED: int(m.simulated)}
    if m.limit_ips is not None:
        out.update({TrialKey.LIMIT: m.limit_ips, TrialKey.EFFICIENCY: m.efficiency})
    for key in ("p50", "p95"):
        if key in m.latency_ms:
            out[TrialKey.latency(key)] = m.latency_ms[key]
    out.update({k: v for k, v in (m.extra.get("energy") or {}).items() if isinstance(v, int | float)})
    total = sum(e.images for e in m.executors) or 1
    for e in m.executors:
        out[TrialKey.share(e.name)] = e.images / total
        key = TrialKey.busy_estimated(e.name) if e.busy_estimated else TrialKey.busy(e.name)
        out[key] = e.busy_s / m.wall_s if m.wall_s > 0 else 0.0
    return out


def objective_metrics(result: dict[str, Any], objectives: ObjectiveSet) -> dict[str, float]:
    """``objective_value`` (the first objective) and ``objective.<name>`` for each: the figures the
    searcher reads; the worst value wherever the trial is not ok or did not measure the figure."""
    ok = result.get("status") == "ok"
    values = objectives.values(result) if ok else [o.worst for o in objectives.objectives]
    out = {o.key: float(v) for o, v in zip(objectives.objectives, values, strict=True)}
    out[PRIMARY_METRIC] = float(values[0])
    return out


def trial_status(m: Measurement, max_temp: float | None) -> tuple[str, str | None]:
    """(status, why) of a measured run: invalid outputs first, then a violated bound, else ok."""
    if not m.output_ok:
        return "invalid", "; ".join(m.failures)[:500]
    if m.extra.get("violation"):
        return "violation", str(m.extra["violation"])[:500]
    hot = too_hot((m.extra.get("energy") or {}).get(TrialKey.TEMP_MAX), max_temp)
    return ("violation", hot) if hot else ("ok", None)


def _cool(setup: TrialSetup, phases: dict[str, float], notes: dict[str, str]) -> None:
    """Waits for the devices to cool ``cool_margin_c`` below ``max_temp`` (see module doc)."""
    if setup.max_temp is None or setup.pool_spec is None:
        return
    cooled = wait_cool(energy_sources(setup.pool_spec), setup.max_temp - setup.cool_margin_c, setup.cool_max_s)
    phases[TrialKey.COOL] = cooled.waited_s
    if cooled.note:
        notes["cooling"] = cooled.note


def _ended(status: str, strategy: str, params: dict[str, Any], error: str, **extra: Any) -> dict[str, Any]:
    return {"status": status, "strategy": strategy, "params_json": json.dumps(params), "error": error[:500], **extra}


def run_trial(config: dict[str, Any], setup: TrialSetup) -> dict[str, Any]:
    """Decodes the trial's config, runs it on the manager's actors, returns the result dict."""
    import ray

    from autohet.pool import RayPool

    strategy, params, exec_params, pool_params = SearchSpace.decode(config)
    manager = ray.get_actor(setup.manager_name, namespace="autohet")
    phases = {TrialKey.ACQUIRE: 0.0, TrialKey.STANDALONE: 0.0}  # where a trial's seconds go
    started = time.perf_counter()
    objectives = setup.objectives
    notes: dict[str, str] = {}  # figure -> why it was not read (MLflow tags unavailable.<figure>)
    _cool(setup, phases, notes)

    def standalone(pool: Any, share: int, used: list[int] | None) -> list[float]:
        t0 = time.perf_counter()
        try:
            return ray.get(manager.standalone.remote(setup.standalone_seconds, share, used))
        finally:
            phases[TrialKey.STANDALONE] += time.perf_counter() - t0

    def finish(result: dict[str, Any]) -> dict[str, Any]:
        phases[TrialKey.TRIAL] = time.perf_counter() - started
        phases[TrialKey.RUN] = (phases[TrialKey.TRIAL] - phases[TrialKey.ACQUIRE] - phases[TrialKey.STANDALONE]
                                - phases.get(TrialKey.COOL, 0.0))
        result.update(phases)
        if notes or result.get("unavailable"):
            result["unavailable"] = {**notes, **(result.get("unavailable") or {})}
        result.update(objective_metrics(result, objectives))
        return result

    try:
        only = get_strategy(strategy).executors_used(params)  # a single's executor: set up alone
        _refuse_negligible_regroup(strategy, pool_params, manager, setup)
        _refuse_saturated_partitions(pool_params, manager, setup)
        spec, actors, compile_s = ray.get(manager.acquire.remote(pool_params, exec_params, only))
    except UserError as exc:
        return finish(_ended("refused", strategy, params, str(exc)))
    phases[TrialKey.ACQUIRE] = time.perf_counter() - started - phases.get(TrialKey.COOL, 0.0)
    phases[TrialKey.COMPILE] = compile_s
    ctx, cut = _trial_context(strategy, params, spec, manager, setup, phases, standalone)
    workload = ctx.workload
    try:
        if isinstance(params.get("ratios"), list):  # weights are drawn for the largest topology
            params["ratios"] = params["ratios"][: len(spec.executors)]
        _refuse_hopeless_single(strategy, params, manager, setup, workload.images, ctx.deadline_s)
        _refuse_hopeless_engine(strategy, params, spec, manager, setup)
        pool = RayPool.attached(spec, actors, (setup.model, setup.workload.images))
        m = run_strategy(strategy, params, pool, ctx)
    except RunTimeout as exc:  # cut: replace the executors still busy with the abandoned work
        busy = exc.busy if exc.settle is None else exc.settle(CUT_DRAIN_S)
        ray.get(manager.replace.remote(busy))
        message = str(exc) if cut is None else (
            f"cut at {cut:.1f} s: slower than 1/{setup.cut_factor:g} of the fastest valid trial so far "
            f"(cut_factor {setup.cut_factor:g})")
        return finish(_ended("cut", strategy, params, message))
    except UserError as exc:
        return finish(_ended("refused", strategy, params, str(exc)))
    phases[TrialKey.REFERENCE] = ctx.reference_stats["seconds"]  # a phase of the run: inside RUN
    return finish(_measured(m, ctx, strategy, spec, exec_params, manager, setup))


def _trial_context(strategy: str, params: dict[str, Any], spec: PoolSpec, manager: Any, setup: TrialSetup,
                   phases: dict[str, float], standalone: Any) -> tuple[RunContext, float | None]:
    """The trial's run context: its images sized to the best speed so far (a single to its own executor's),
    its deadline, and the cut (None where the trial timeout bounds the run instead)."""
    import ray

    workload, deadline_s = setup.workload, setup.deadline_s
    own = None  # a single's executor's own speed: its trial is sized and cut by it
    if setup.sizing is not None and not setup.objectives.mode.per_request:
        best = ray.get(manager.best_speed.remote())
        own = _single_speed(strategy, params, manager, setup, phases)
        images = trial_images(setup.sizing, best, spec, own, params.get("executor") if own else None)
        workload, deadline_s = Workload(setup.workload.bank, images), setup.sizing.deadline(images, own)
    ctx = RunContext(setup.model, workload, setup.check_images, setup.standalone_seconds,
                     mode=setup.objectives.mode, latency_runs=setup.latency_runs, standalone_provider=standalone,
                     deadline_s=deadline_s, _reference=_references(setup))
    # the cut compares a run's time with the fastest valid speed's for the same images; an engine job's
    # wall also holds its own measuring (each device alone, the planner's costs), so it is bounded by the
    # trial timeout alone
    cut = None if get_strategy(strategy).on_engine else _cut_deadline(manager, setup, workload.images, own)
    if cut is not None and (ctx.deadline_s is None or cut < ctx.deadline_s):
        ctx.deadline_s = cut
        return ctx, cut
    return ctx, None


def _beside_gpus(m: Measurement, strategy: str, spec: PoolSpec) -> tuple[str | None, bool | None]:
    """A data-parallel trial over GPUs: its strategy, and whether CPU groups took any of its images (what
    ``PoolManager.cpu_gain`` compares); (None, None) for a single, an engine family, or no GPU."""
    kinds = {e.name: e for e in spec.executors}
    if is_baseline(strategy) or get_strategy(strategy).on_engine or not any(e.uses_gpu for e in spec.executors):
        return None, None
    return strategy, any(r.images > 0 for r in m.executors if r.name in kinds and kinds[r.name].is_cpu)


def _measured(m: Measurement, ctx: RunContext, strategy: str, spec: PoolSpec, exec_params: dict[str, Any],
              manager: Any, setup: TrialSetup) -> dict[str, Any]:
    """A measured trial's result: its status, figures and the config it would export (its speed recorded
    with the manager where it is a valid throughput trial)."""
    import ray

    m.extra["standalone"] = "one measurement per executor class and configuration, cached for the tune"
    status, why = trial_status(m, setup.max_temp)
    if status == "ok" and not setup.objectives.mode.per_request:
        on = engine_devices(m.params, spec) if get_strategy(strategy).on_engine else None
        ray.get(manager.record_speed.remote(m.throughput_ips, on, *_beside_gpus(m, strategy, spec)))
    config_out = RunConfig(model=setup.model, pool=spec, strategy=strategy, params=m.params,
                           plan=get_strategy(strategy).plan_params(m.params, m.extra),
                           images=ctx.workload.images, workload_seed=setup.workload_seed, npy=setup.npy,
                           executor_params=exec_params, objective=setup.objectives.name,
                           measured={"throughput_ips": m.throughput_ips, "limit_ips": m.limit_ips,
                                     "efficiency": m.efficiency, "latency_ms": m.latency_ms,
                                     "output_ok": m.output_ok, "max_abs_diff": m.max_abs_diff,
                                     "simulated": m.simulated, **(m.extra.get("energy") or {}),
                                     # each executor alone: how `autohet serve` shares requests between replicas
                                     "executor_ips": {e.name: e.standalone_ips for e in m.executors
                                                      if e.standalone_ips > 0}})
    result = trial_metrics(m)
    result.update({TrialKey.REFERENCE_COMPUTED: int(ctx.reference_stats["computed"]),
                   TrialKey.REFERENCE_REUSED: int(ctx.reference_stats["reused"])})
    result.update(status=status, strategy=strategy, params_json=json.dumps(m.params),
                  measurement=m.to_json(timeline=True),
                  config_yaml=yaml.safe_dump(config_out.to_dict(), sort_keys=False))
    if m.extra.get("unavailable"):
        result["unavailable"] = m.extra["unavailable"]
    if why:
        result["error"] = why
    return result


_REFERENCES: dict[str, np.ndarray] = {}  # this trial process's reference outputs, kept across trials


def _references(setup: TrialSetup) -> dict[str, np.ndarray]:
    """The reference outputs the tune computed, shared by this process's trials: a trial of another
    size computes its own sample's once (``RunContext.reference`` adds it here)."""
    for key, value in setup.reference.items():
        _REFERENCES.setdefault(key, value)
    return _REFERENCES


def tune_entry(config: dict[str, Any], setup: TrialSetup) -> None:
    """The function trainable: one report per trial."""
    from ray import tune

    tune.report(run_trial(config, setup))
