"""The function Ray Tune runs for each trial: one real strategy run on the manager's executors.

A trial ends with one status (``autohet.tracking.STATUSES``): ``ok``, ``invalid`` (outputs failed
the check), ``cut`` (slower than the deadline or than cut_factor x the fastest run), ``refused``
(it cannot finish in time, or its parameters do not fit the pool), ``violation`` (it ran, but past a
bound: its measured max temperature above ``max_temp``, or a bound the strategy itself reports in
``m.extra["violation"]``). Only ``ok`` trials carry their objective values; the others report each
objective's worst value, so the searcher never prefers them. With ``max_temp`` set, each trial first
waits (capped) for the devices to cool a margin below it, so one hot trial does not fail the next.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from autohet.config import RunConfig
from autohet.context import RunContext
from autohet.errors import RunTimeout, UserError
from autohet.measurement import Measurement
from autohet.models import ModelSpec
from autohet.objectives import ObjectiveSet
from autohet.pool import PoolSpec
from autohet.running import energy_sources, run_strategy
from autohet.strategies import get_strategy
from autohet.telemetry import wait_cool
from autohet.tuning.space import SearchSpace
from autohet.workload import Workload

__all__ = ["CUT_FLOOR_S", "TrialSetup", "objective_metrics", "run_trial", "trial_metrics", "trial_status",
           "tune_entry"]

# The cut never comes before this many seconds: a run's fixed costs are not worth a cut.
CUT_FLOOR_S = 5.0


@dataclass
class TrialSetup:
    """What every trial shares; passed once through the object store (tune.with_parameters)."""

    model: ModelSpec
    workload: Workload
    objective: str
    manager_name: str
    check_images: int
    standalone_seconds: float
    latency_runs: int
    deadline_s: float | None = None
    cut_factor: float = 0.0
    workload_seed: int = 0
    npy: str | None = None
    reference: dict[str, np.ndarray] = field(default_factory=dict)
    max_temp: float | None = None  # a trial hotter than this (max over the sensors, C) is a violation
    cool_margin_c: float = 5.0  # before each trial: wait until max_temp - this ...
    cool_max_s: float = 120.0  # ... for at most this long
    pool_spec: PoolSpec | None = None  # the base pool: whose temperatures the cooling wait reads

    @property
    def objectives(self) -> ObjectiveSet:
        return ObjectiveSet.parse(self.objective)


def trial_metrics(m: Measurement) -> dict[str, Any]:
    """The flat numbers reported to Tune (and logged to MLflow) for a measured trial: only figures
    that were measured (a latency run has no limit and no efficiency)."""
    out: dict[str, Any] = {"throughput_ips": m.throughput_ips, "max_abs_diff": m.max_abs_diff, "wall_s": m.wall_s,
                           "images": m.images, "simulated": int(m.simulated)}
    if m.limit_ips is not None:
        out.update(limit_ips=m.limit_ips, efficiency=m.efficiency)
    for key in ("p50", "p95"):
        if key in m.latency_ms:
            out[f"latency_{key}_ms"] = m.latency_ms[key]
    out.update({k: v for k, v in (m.extra.get("energy") or {}).items() if isinstance(v, int | float)})
    total = sum(e.images for e in m.executors) or 1
    for e in m.executors:
        out[f"share.{e.name}"] = e.images / total
        out[f"busy.{e.name}"] = e.busy_s / m.wall_s if m.wall_s > 0 else 0.0
    return out


def objective_metrics(result: dict[str, Any], objectives: ObjectiveSet) -> dict[str, float]:
    """``objective_value`` (the first objective) and ``objective.<name>`` for each: the figures the
    searcher reads; the worst value wherever the trial is not ok or did not measure the figure."""
    ok = result.get("status") == "ok"
    values = objectives.values(result) if ok else [o.worst for o in objectives.objectives]
    out = {f"objective.{o.name}": float(v) for o, v in zip(objectives.objectives, values, strict=True)}
    out["objective_value"] = float(values[0])
    return out


def trial_status(m: Measurement, max_temp: float | None) -> tuple[str, str | None]:
    """(status, why) of a measured run: invalid outputs first, then a violated bound, else ok."""
    if not m.output_ok:
        return "invalid", "; ".join(m.failures)[:500]
    if m.extra.get("violation"):
        return "violation", str(m.extra["violation"])[:500]
    hottest = (m.extra.get("energy") or {}).get("temp_max_c")
    if max_temp is not None and hottest is not None and hottest > max_temp:
        return "violation", f"max temperature {hottest:.1f} C during the run is above --max-temp {max_temp:g} C"
    return "ok", None


def _cool(setup: TrialSetup, phases: dict[str, float], notes: dict[str, str]) -> None:
    """Waits for the devices to cool ``cool_margin_c`` below ``max_temp`` (see module doc)."""
    if setup.max_temp is None or setup.pool_spec is None:
        return
    cooled = wait_cool(energy_sources(setup.pool_spec), setup.max_temp - setup.cool_margin_c, setup.cool_max_s)
    phases["time.cool_s"] = cooled.waited_s
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
    phases = {"time.acquire_s": 0.0, "time.standalone_s": 0.0}  # where a trial's seconds go
    started = time.perf_counter()
    objectives = setup.objectives
    notes: dict[str, str] = {}  # figure -> why it was not read (MLflow tags unavailable.<figure>)
    _cool(setup, phases, notes)

    def standalone(pool: Any, share: int) -> list[float]:
        t0 = time.perf_counter()
        try:
            return ray.get(manager.standalone.remote(setup.standalone_seconds, share))
        finally:
            phases["time.standalone_s"] += time.perf_counter() - t0

    def finish(result: dict[str, Any]) -> dict[str, Any]:
        phases["time.trial_s"] = time.perf_counter() - started
        phases["time.run_s"] = (phases["time.trial_s"] - phases["time.acquire_s"] - phases["time.standalone_s"]
                                - phases.get("time.cool_s", 0.0))
        result.update(phases)
        if notes or result.get("unavailable"):
            result["unavailable"] = {**notes, **(result.get("unavailable") or {})}
        result.update(objective_metrics(result, objectives))
        return result

    ctx = RunContext(setup.model, setup.workload, setup.check_images, setup.standalone_seconds,
                     mode=objectives.mode, latency_runs=setup.latency_runs, standalone_provider=standalone,
                     deadline_s=setup.deadline_s, _reference=dict(setup.reference))
    # cut_factor compares run walls; an engine job's wall also holds its own measuring (each device
    # alone, the planner's costs), so it is bounded by the trial timeout alone
    cut = None if get_strategy(strategy).on_engine else _cut_deadline(manager, setup)
    if cut is not None and (ctx.deadline_s is None or cut < ctx.deadline_s):
        ctx.deadline_s = cut
    else:
        cut = None
    try:
        spec, actors, compile_s = ray.get(manager.acquire.remote(pool_params, exec_params))
        phases["time.acquire_s"] = time.perf_counter() - started - phases.get("time.cool_s", 0.0)
        phases["time.compile_s"] = compile_s
        if isinstance(params.get("ratios"), list):  # weights are drawn for the largest topology
            params["ratios"] = params["ratios"][: len(spec.executors)]
        _refuse_hopeless_single(strategy, params, manager, setup)
        pool = RayPool.attached(spec, actors, (setup.model, setup.workload.images))
        m = run_strategy(strategy, params, pool, ctx)
    except RunTimeout as exc:  # cut: replace the executors still busy with the abandoned work
        ray.get(manager.replace.remote(exc.busy))
        message = str(exc) if cut is None else (
            f"cut at {cut:.1f} s: slower than 1/{setup.cut_factor:g} of the fastest valid trial so far "
            f"(cut_factor {setup.cut_factor:g})")
        return finish(_ended("cut", strategy, params, message))
    except UserError as exc:
        return finish(_ended("refused", strategy, params, str(exc)))
    m.extra["standalone"] = "one measurement per executor class and configuration, cached for the tune"
    status, why = trial_status(m, setup.max_temp)
    if status == "ok" and objectives.mode == "throughput":
        ray.get(manager.record_wall.remote(m.wall_s))
    config_out = RunConfig(model=setup.model, pool=spec, strategy=strategy, params=m.params,
                           plan=get_strategy(strategy).plan_params(m.params, m.extra),
                           images=setup.workload.images, workload_seed=setup.workload_seed, npy=setup.npy,
                           executor_params=exec_params, objective=objectives.name,
                           measured={"throughput_ips": m.throughput_ips, "limit_ips": m.limit_ips,
                                     "efficiency": m.efficiency, "latency_ms": m.latency_ms,
                                     "output_ok": m.output_ok, "max_abs_diff": m.max_abs_diff,
                                     "simulated": m.simulated, **(m.extra.get("energy") or {})})
    result = trial_metrics(m)
    result.update(status=status, strategy=strategy, params_json=json.dumps(m.params),
                  measurement=m.to_json(timeline=True),
                  config_yaml=yaml.safe_dump(config_out.to_dict(), sort_keys=False))
    if m.extra.get("unavailable"):
        result["unavailable"] = m.extra["unavailable"]
    if why:
        result["error"] = why
    return finish(result)


def _cut_deadline(manager: Any, setup: TrialSetup) -> float | None:
    """Throughput trials all run the same images, so a run ``cut_factor`` times longer than the
    fastest valid run so far is that much slower: it is cut there instead of run to the end."""
    import ray

    if setup.objectives.mode != "throughput" or not setup.cut_factor:
        return None
    fastest = ray.get(manager.fastest_wall.remote())
    return None if fastest is None else max(CUT_FLOOR_S, setup.cut_factor * fastest)


def _refuse_hopeless_single(strategy: str, params: dict[str, Any], manager: Any, setup: TrialSetup) -> None:
    """A `single` trial on an executor already measured too slow to finish before the trial
    deadline is refused at once (e.g. 20000 images on one CPU core of a GPU machine), instead
    of running until it is cut and its actor replaced."""
    import ray

    if strategy != "single" or setup.deadline_s is None or setup.objectives.mode != "throughput":
        return
    index = params.get("executor")
    if not isinstance(index, int):
        return
    speed = ray.get(manager.known_standalone.remote(index))
    if speed and setup.workload.images / speed > setup.deadline_s:
        raise UserError(f"single on executor {index} would take ~{setup.workload.images / speed:.0f} s at its "
                        f"measured {speed:.4g} img/s, more than the trial deadline of {setup.deadline_s:.0f} s")


def tune_entry(config: dict[str, Any], setup: TrialSetup) -> None:
    """The function trainable: one report per trial."""
    from ray import tune

    tune.report(run_trial(config, setup))
