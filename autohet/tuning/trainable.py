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
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import yaml

from autohet.config import RunConfig
from autohet.context import RunContext
from autohet.core.errors import RunTimeout, UserError
from autohet.core.measurement import Measurement
from autohet.core.models import ModelSpec
from autohet.core.objectives import PRIMARY_METRIC, ObjectiveSet, TrialKey
from autohet.core.settings import CPU_ENGINE_HEADROOM, CUT_DRAIN_S, CUT_FLOOR_S, ENGINE_HEADROOM, MAX_OUTPUT_BYTES
from autohet.core.workload import Workload
from autohet.platform.thermal import too_hot, wait_cool
from autohet.pool import PoolSpec
from autohet.strategies import get_strategy, is_baseline
from autohet.strategy_run import energy_sources, run_strategy
from autohet.tuning.space import SearchSpace

__all__ = ["CPU_ENGINE_HEADROOM", "CUT_DRAIN_S", "CUT_FLOOR_S", "ENGINE_HEADROOM", "MAX_OUTPUT_BYTES", "TrialSetup",
           "TrialSizing", "engine_shortfall", "objective_metrics", "run_trial", "trial_images", "trial_metrics",
           "trial_status", "tune_entry"]



@dataclass(frozen=True)
class TrialSizing:
    """Images per throughput trial: about ``target_s`` of work at the best speed known so far (the
    pool at its own settings, measured first, or the fastest valid trial since), rounded to a power of
    sqrt(2) so that few distinct sizes occur (each needs its own reference outputs). On the H100 box
    a model running 160k img/s ran 0.6 s trials under the old cap of 100000 images, and its best
    single reached 0.84 of its own standalone speed (issue 26)."""

    target_s: float
    min_images: int
    max_images: int
    base_ips: float
    timeout_s: float | None = None  # fixed trial timeout; None: max(20 s, 10x the expected run)

    def images(self, best_ips: float | None) -> int:
        return self.images_at(max(self.base_ips, best_ips or 0.0))

    def images_at(self, ips: float) -> int:
        """About ``target_s`` of work at ``ips``, rounded and capped as every trial's."""
        wanted = ips * self.target_s
        if wanted > 1:
            wanted = 2 ** (round(2 * math.log2(wanted)) / 2)
        return int(max(self.min_images, min(self.max_images, round(wanted))))

    def deadline(self, images: int, ips: float | None = None) -> float:
        """The trial timeout for ``images`` at ``ips`` (default: the pool's own speed)."""
        if self.timeout_s is not None:
            return self.timeout_s
        speed = ips or self.base_ips
        return max(20.0, 10.0 * images / speed) if speed > 0 else 60.0


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
    sizing: TrialSizing | None = None  # throughput trials sized by speed (None: every trial runs ``workload``)

    @property
    def objectives(self) -> ObjectiveSet:
        return ObjectiveSet.parse(self.objective)

    def longer(self, factor: float) -> TrialSetup:
        """This setup with throughput runs ``factor`` times as long (the finals' runs); unchanged where
        trials are not sized by speed."""
        if self.sizing is None or factor <= 1:
            return self
        return replace(self, sizing=replace(self.sizing, target_s=self.sizing.target_s * factor))


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

    def standalone(pool: Any, share: int) -> list[float]:
        t0 = time.perf_counter()
        try:
            return ray.get(manager.standalone.remote(setup.standalone_seconds, share))
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
        spec, actors, compile_s = ray.get(manager.acquire.remote(pool_params, exec_params))
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


def _measured(m: Measurement, ctx: RunContext, strategy: str, spec: PoolSpec, exec_params: dict[str, Any],
              manager: Any, setup: TrialSetup) -> dict[str, Any]:
    """A measured trial's result: its status, figures and the config it would export (its speed recorded
    with the manager where it is a valid throughput trial)."""
    import ray

    m.extra["standalone"] = "one measurement per executor class and configuration, cached for the tune"
    status, why = trial_status(m, setup.max_temp)
    if status == "ok" and not setup.objectives.mode.per_request:
        ray.get(manager.record_speed.remote(m.throughput_ips))
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


def trial_images(sizing: TrialSizing, best_ips: float | None, spec: PoolSpec, own_ips: float | None = None,
                 single: int | None = None) -> int:
    """A throughput trial's images: ``sizing``'s (at ``own_ips``, a single's own speed, where given),
    and at least two batches of each executor (of executor ``single`` alone, for such a single): a slow
    model (vgg16 at 4-5 img/s on the 2-core box) ran 32-image trials, one batch per executor, whose
    figures moved by 20% from run to run and picked configurations that ran slower when rerun."""
    images = sizing.images_at(own_ips) if own_ips else sizing.images(best_ips)
    executors = spec.executors[single:single + 1] if single is not None else spec.executors
    return max(images, 2 * sum(e.batch for e in executors))


def _single_speed(strategy: str, params: dict[str, Any], manager: Any, setup: TrialSetup,
                  phases: dict[str, float]) -> float | None:
    """A ``single`` trial's executor speed (its standalone figure, measured once per configuration);
    None for other strategies or where it cannot be measured.

    Such a trial is sized to its own speed and cut only against it, slower or faster than the speed
    the trials are sized by: the first points run ``single`` on the CPU group at each backend and
    precision to find its best settings before any strategy splits the work. Sized for the GPU beside
    it and cut at 1/cut_factor of the GPU's speed, all eight of them were cut in a default resnet18
    tune on the H100 box (~12 s each, their actors replaced), and the strategies after them ran their
    CPU groups at the pool's eager fp32 (BENCHMARKS 23). Sized at a CPU-only pool's own eager speed,
    the first point (OpenVINO bf16, 15 streams, 1041 img/s alone) ran 362 images in 0.4 s, measured
    904 img/s, and lost to a 3-stream setting its 3 s trials measured at 1035 (BENCHMARKS 24)."""
    import ray

    index = params.get("executor")
    if not is_baseline(strategy) or not isinstance(index, int):
        return None
    t0 = time.perf_counter()
    try:  # the figure known for its configuration, else measured now
        known = ray.get(manager.standalone_of.remote(index, setup.standalone_seconds))
    except Exception:  # e.g. its actor died: sized as any trial, whose run meets (and reports) that
        known = None
    phases[TrialKey.STANDALONE] += time.perf_counter() - t0
    return known or None


_REFERENCES: dict[str, np.ndarray] = {}  # this trial process's reference outputs, kept across trials


def _references(setup: TrialSetup) -> dict[str, np.ndarray]:
    """The reference outputs the tune computed, shared by this process's trials: a trial of another
    size computes its own sample's once (``RunContext.reference`` adds it here)."""
    for key, value in setup.reference.items():
        _REFERENCES.setdefault(key, value)
    return _REFERENCES


def _cut_deadline(manager: Any, setup: TrialSetup, images: int, own_ips: float | None = None) -> float | None:
    """A throughput run taking ``cut_factor`` times longer than the fastest valid speed so far needs
    for its images is that much slower: it is cut there instead of run to the end. A single sized to its
    own speed (``own_ips``) is cut against that speed instead."""
    import ray

    if setup.objectives.mode.per_request or not setup.cut_factor:
        return None
    fastest = own_ips or ray.get(manager.best_speed.remote())
    return None if not fastest else max(CUT_FLOOR_S, setup.cut_factor * images / fastest)


def _refuse_hopeless_single(strategy: str, params: dict[str, Any], manager: Any, setup: TrialSetup,
                            images: int, deadline_s: float | None) -> None:
    """A `single` trial on an executor already measured too slow to finish before the trial
    deadline is refused at once (e.g. 20000 images on one CPU core of a GPU machine), instead
    of running until it is cut and its actor replaced."""
    import ray

    if not is_baseline(strategy) or deadline_s is None or setup.objectives.mode.per_request:
        return
    index = params.get("executor")
    if not isinstance(index, int):
        return
    speed = ray.get(manager.known_standalone.remote(index))
    if speed and images / speed > deadline_s:
        raise UserError(f"single on executor {index} would take ~{images / speed:.0f} s at its "
                        f"measured {speed:.4g} img/s, more than the trial deadline of {deadline_s:.0f} s")




def _refuse_hopeless_engine(strategy: str, params: dict[str, Any], spec: PoolSpec, manager: Any,
                            setup: TrialSetup) -> None:
    """A throughput trial of an engine family is refused before it runs when its devices, each at the
    best figure measured for it at any setting, together fall short of the best valid trial by more
    than ``ENGINE_HEADROOM``: on the 2-core box four such trials were each cut after ~70 s, 46% of the
    README main job's budget, next to an OpenVINO single twice as fast as their torch devices."""
    import ray

    if not get_strategy(strategy).on_engine or setup.objectives.mode.per_request:
        return
    from autohet.strategies import default_devices

    indices = [i for i in (params.get("devices") or default_devices(spec)) if 0 <= i < len(spec.executors)]
    chosen = [spec.executors[i] for i in indices]
    headroom = ENGINE_HEADROOM if any(e.uses_gpu for e in chosen) else CPU_ENGINE_HEADROOM
    why = engine_shortfall(strategy, ray.get(manager.best_speed.remote()),
                           ray.get(manager.device_figures.remote(indices)), [e.name for e in chosen], headroom)
    if why:
        raise UserError(why)


def engine_shortfall(strategy: str, best: float | None, figures: list[float | None], names: list[str],
                     headroom: float = ENGINE_HEADROOM) -> str | None:
    """Why an engine family's devices cannot reach ``best`` (see ``_refuse_hopeless_engine``), or None
    where they might, or where a device has no measured figure yet."""
    if not best or not figures or any(f is None for f in figures):
        return None
    total = float(sum(f for f in figures if f is not None))
    if headroom * total >= best:
        return None
    return (f"{strategy} cannot beat the best trial's {best:.4g} img/s: its devices ({', '.join(names)}) run the "
            f"whole model at {total:.4g} img/s together, each at its best measured PyTorch setting (under "
            f"1/{headroom:g} of it)")


def tune_entry(config: dict[str, Any], setup: TrialSetup) -> None:
    """The function trainable: one report per trial."""
    from ray import tune

    tune.report(run_trial(config, setup))
