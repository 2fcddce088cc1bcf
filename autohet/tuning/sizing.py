"""How big a tune's pieces are: its space's vectors (the pool's largest topology, each strategy's declared
sizes) and its trials (images from the pool's measured speed, the output classes, the reference outputs
the trials compare with, computed once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autohet.core.models import ModelSpec
from autohet.core.settings import MAX_OUTPUT_BYTES
from autohet.core.workload import Workload
from autohet.platform.ray_cluster import get_interruptibly
from autohet.pool import PoolSpec
from autohet.pool.spec import POOL_DIMS
from autohet.tuning.dims import SpaceContext
from autohet.tuning.experiment import TunePool
from autohet.tuning.settings import TuneSettings
from autohet.tuning.space import SearchSpace
from autohet.tuning.trial_setup import TrialSetup, TrialSizing

__all__ = ["SIZED_BANK", "TrialPlan", "max_pool_size", "output_classes", "reference_outputs", "size_trials", "sizing",
           "space_context", "strategy_sizes", "trial_setup"]


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
    sizes = {"executors": max_pool_size(pool, space, pool_dims), "devices": len(default_devices(pool))}
    needed = space.vector_sizes() - set(sizes)
    if needed:
        for name in space.strategies:
            sizes.update((k, v) for k, v in strategy_sizes(name, model, pool).items() if k in needed)
    return SpaceContext(sizes, kinds, pool_dims)


def max_pool_size(pool: PoolSpec, space: SearchSpace, pool_dims: bool) -> int:
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
SIZED_BANK = 1 << 30


def sizing(manager: Any, settings: TuneSettings, classes: int) -> TrialSizing:
    """How throughput trials are sized: from the base pool's summed standalone throughput, measured now."""
    limit = float(get_interruptibly(manager.calibrate.remote(settings.standalone_seconds)))
    cap = int(settings.max_images) if settings.max_images != "auto" else MAX_OUTPUT_BYTES // (4 * max(1, classes))
    timeout = None if settings.trial_timeout_s == "auto" else float(settings.trial_timeout_s)
    return TrialSizing(float(settings.target_trial_seconds), int(settings.min_images), max(cap, 1), limit, timeout)


@dataclass
class TrialPlan:
    """How many images a trial runs, how throughput trials are sized by speed (None: all run
    ``images``) and the trial timeout."""

    images: int
    sizing: TrialSizing | None
    deadline_s: float


def size_trials(model: ModelSpec, settings: TuneSettings, pool: TunePool, state: dict[str, Any] | None) -> TrialPlan:
    """The trials' images and timeout: latency trials run ``latency_runs`` requests, throughput trials
    are sized from the pool's measured speed (``images: auto``) or run the given count; a resume
    (``state``) keeps the images of the first run."""
    per_request = settings.objectives.mode.per_request
    limit: float | None = None
    by_speed: TrialSizing | None = None
    classes = output_classes(model, pool)
    if per_request and settings.images == "auto":
        # trials time latency_runs batch-1 requests on the engine: no image count to size, and no
        # pool-wide standalone pass (a large share of a short latency tune: docs/why.md, tuning/sizing.py)
        images = max(settings.min_images, settings.latency_runs)
    elif settings.images == "auto":
        by_speed = sizing(pool.manager, settings, classes)
        images, limit = by_speed.images(None), by_speed.base_ips
    else:
        images = int(settings.images)
    if state is not None:
        images = int(state["images"])
    if limit is None and settings.trial_timeout_s == "auto" and not per_request:
        limit = float(get_interruptibly(pool.manager.calibrate.remote(settings.standalone_seconds)))
    return TrialPlan(images, by_speed, settings.trial_timeout(images, limit or 0.0))


def output_classes(model: ModelSpec, pool: TunePool) -> int:
    """The model's output width (classes), from the reference output of one image."""
    from autohet.context import RunContext
    from autohet.core.workload import Workload

    ctx = RunContext(model, Workload(pool.bank.bank, 1), 1)
    return int(ctx.reference(np.zeros(1, dtype=np.int64), pool.spec.simulated).shape[1])


def reference_outputs(model: ModelSpec, settings: TuneSettings, pool_spec: PoolSpec,
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


def trial_setup(model: ModelSpec, settings: TuneSettings, pool: TunePool, plan: TrialPlan, workload: Workload,
                 references: dict[str, np.ndarray], data_seed: int, npy: str | None) -> TrialSetup:
    """What every trial shares (``TrialSetup``), handed to Ray Tune once."""
    from autohet.tuning.trial_setup import TrialSetup

    return TrialSetup(model, workload, settings.objectives.name, pool.manager_name, settings.check_images,
                      settings.standalone_seconds, settings.latency_runs, deadline_s=plan.deadline_s,
                      cut_factor=float(settings.cut_factor), workload_seed=data_seed, npy=npy,
                      reference=references, max_temp=settings.max_temp,
                      cool_margin_c=settings.cool_margin_c, cool_max_s=settings.cool_max_s,
                      pool_spec=pool.spec, sizing=plan.sizing)
