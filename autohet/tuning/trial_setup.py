"""What every trial gets (``TrialSetup``, sized by ``TrialSizing``) and the rules applied before a trial runs:
its images, its cut deadline, and the refusals of trials that cannot finish in time or cannot reach the best
trial. Pure where they can be; the manager is asked through Ray for the figures it holds."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.objectives import ObjectiveSet, TrialKey
from autohet.core.settings import (
    CPU_ENGINE_HEADROOM,
    CUT_FLOOR_S,
    ENGINE_HEADROOM,
    NEGLIGIBLE_SHARE,
    SATURATED_GAIN,
)
from autohet.core.workload import Workload
from autohet.pool import PoolSpec
from autohet.strategies import default_devices, get_strategy, is_baseline

__all__ = ["TrialSetup", "TrialSizing", "cut_deadline", "engine_devices", "engine_shortfall",
           "partition_shortfall", "refuse_hopeless_engine", "refuse_hopeless_single", "refuse_negligible_regroup",
           "refuse_saturated_partitions", "regroup_shortfall",
           "single_speed", "trial_images"]


@dataclass(frozen=True)
class TrialSizing:
    """Images per throughput trial: about ``target_s`` of work at the best speed known so far (the
    pool at its own settings, measured first, or the fastest valid trial since), rounded to a power of
    sqrt(2) so that few distinct sizes occur (each needs its own reference outputs). ``max_images``
    must leave a fast model's trials long enough to reach its speed (docs/why.md, tuning/trial_setup.py)."""

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


def trial_images(sizing: TrialSizing, best_ips: float | None, spec: PoolSpec, own_ips: float | None = None,
                 single: int | None = None) -> int:
    """A throughput trial's images: ``sizing``'s (at ``own_ips``, a single's own speed, where given),
    and at least two batches of each executor (of executor ``single`` alone, for such a single): a slow
    model's trials of one batch per executor gave figures too noisy to rank configurations by
    (docs/why.md, tuning/trial_setup.py)."""
    images = sizing.images_at(own_ips) if own_ips else sizing.images(best_ips)
    executors = spec.executors[single:single + 1] if single is not None else spec.executors
    return max(images, 2 * sum(e.batch for e in executors))


def single_speed(strategy: str, params: dict[str, Any], manager: Any, setup: TrialSetup,
                  phases: dict[str, float]) -> float | None:
    """A ``single`` trial's executor speed (its standalone figure, measured once per configuration);
    None for other strategies or where it cannot be measured.

    Such a trial is sized to its own speed and cut only against it, slower or faster than the speed
    the trials are sized by: the first points run ``single`` on the CPU group at each backend and
    precision to find its best settings before any strategy splits the work. Sized and cut by the GPU
    beside it, such singles were all cut; sized at a CPU-only pool's own eager speed, a fast CPU
    setting ran too short a trial and lost to a slower one (docs/why.md, tuning/trial_setup.py)."""
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


def cut_deadline(manager: Any, setup: TrialSetup, images: int, own_ips: float | None = None) -> float | None:
    """A throughput run taking ``cut_factor`` times longer than the fastest valid speed so far needs
    for its images is that much slower: it is cut there instead of run to the end. A single sized to its
    own speed (``own_ips``) is cut against that speed instead."""
    import ray

    if setup.objectives.mode.per_request or not setup.cut_factor:
        return None
    fastest = own_ips or ray.get(manager.best_speed.remote())
    return None if not fastest else max(CUT_FLOOR_S, setup.cut_factor * images / fastest)


def refuse_hopeless_single(strategy: str, params: dict[str, Any], manager: Any, setup: TrialSetup,
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


def refuse_negligible_regroup(strategy: str, pool_params: dict[str, Any], manager: Any, setup: TrialSetup) -> None:
    """A throughput trial that spreads work over a topology whose new executors are CPU groups alone is refused
    before they start where neither side can move the best trial by ``NEGLIGIBLE_SHARE``: all its CPU cores, at
    the best figure a core reached so far, would run under that share of the best, and its GPUs' best figures
    together come within it (the best already holds the GPUs). Starting fifteen 2-core groups cost one two-GPU
    resnet18 tune 32 s of acquiring, for a CPU whose 30 cores ran 378 img/s beside a best of 157392
    (BENCHMARKS.md 45). A ``single`` is left to run: the tune's CPU singles find the groups' figures."""
    import ray

    if is_baseline(strategy) or setup.objectives.mode.per_request:
        return
    regrouped = ray.get(manager.cpu_regroup.remote(pool_params))
    if regrouped is None:
        return
    why = regroup_shortfall(ray.get(manager.best_speed.remote()), *regrouped, pool_params,
                            cpu_gain=ray.get(manager.cpu_gain.remote()))
    if why:
        raise UserError(why)


def regroup_shortfall(best: float | None, new_groups: int, cpu_bound: float, gpus: float,
                      pool_params: dict[str, Any], share: float = NEGLIGIBLE_SHARE,
                      cpu_gain: tuple[str, float] | None = None) -> str | None:
    """Why a trial's new CPU groups cannot matter (``refuse_negligible_regroup``), or None where they might:
    ``cpu_bound`` the topology's CPU cores at the best per-core figure, ``gpus`` its GPUs' figures together;
    ``cpu_gain`` what CPU groups working beside the GPUs added to a data-parallel strategy so far
    (``PoolManager.cpu_gain``): under ``share``, other groups of the same cores are refused too. The per-core
    bound is each group's standalone figure; beside two H200s the groups took work from the GPUs' host side:
    resnet18's and vgg16's fifo ran 11% and 17% slower with 4-core groups than without, and a later regroup into
    2-core groups then cost resnet18's tune 25 s of acquiring for a trial that was cut (BENCHMARKS.md 47)."""
    dims = ", ".join(f"{k}={v}" for k, v in sorted(pool_params.items()) if v is not None)
    if cpu_gain is not None and cpu_gain[1] < share:
        return (f"the topology {dims} starts {new_groups} CPU group(s), where CPU groups working beside the GPUs "
                f"changed {cpu_gain[0]}'s best by {cpu_gain[1]:+.1%} against the GPUs alone (under {share:.0%}): "
                "refused before they start")
    if not best or cpu_bound >= share * best or gpus > (1 + share) * best:
        return None
    return (f"the topology {dims} starts {new_groups} CPU group(s) whose cores together could add at most "
            f"~{cpu_bound:.4g} img/s (the best figure a core reached, times the cores), under {share:.0%} of the best "
            f"trial's {best:.4g} img/s, which its GPUs ({gpus:.4g} img/s together) already reach: refused before "
            "they start")


def refuse_saturated_partitions(pool_params: dict[str, Any], manager: Any, setup: TrialSetup) -> None:
    """A throughput trial whose topology would start GPU partitions is refused before they start where a whole
    GPU was already full at the batches measured: its figure rose under ``SATURATED_GAIN`` from a batch to twice
    it. Partitions share a GPU's SMs among executors; they can add only where one executor leaves SMs idle, which
    a larger batch would have filled. Starting them also ends the whole GPUs' actors (a GPU's actor and its
    partitions' cannot both live), which the next trial starts again: 57 s of acquiring in one two-GPU vgg16
    tune (BENCHMARKS.md 46)."""
    import ray

    if setup.objectives.mode.per_request:
        return
    why = partition_shortfall(ray.get(manager.partition_gain.remote(pool_params)), pool_params)
    if why:
        raise UserError(why)


def partition_shortfall(gain: float | None, pool_params: dict[str, Any], least: float = SATURATED_GAIN) -> str | None:
    """Why a trial's GPU partitions cannot add (``refuse_saturated_partitions``), or None where they might:
    ``gain`` the most a whole GPU rose from doubling its batch (None: not measured)."""
    if gain is None or gain >= least:
        return None
    dims = ", ".join(f"{k}={v}" for k, v in sorted(pool_params.items()) if v is not None)
    return (f"the topology {dims} starts GPU partitions, but a whole GPU rose at most {gain:+.1%} from doubling its "
            f"batch (under {least:.0%}): full already, its SMs shared among partitions cannot run more; refused "
            "before they start")


def engine_devices(params: dict[str, Any], spec: PoolSpec) -> list[int]:
    """The executors an engine family's trial runs on: its ``devices``, else the family's default ones."""
    return [i for i in (params.get("devices") or default_devices(spec)) if 0 <= i < len(spec.executors)]


def refuse_hopeless_engine(strategy: str, params: dict[str, Any], spec: PoolSpec, manager: Any,
                            setup: TrialSetup) -> None:
    """A throughput trial of an engine family is refused before it runs when its devices, each at the
    best figure measured for it as an engine runs it (``PoolManager.device_figures``), together fall short
    of the best valid trial by more than ``ENGINE_HEADROOM``, and no engine trial on them reached near it
    either: such trials otherwise run until they are cut, spending much of a tune's budget (docs/why.md,
    tuning/trial_setup.py)."""
    import ray

    if not get_strategy(strategy).on_engine or setup.objectives.mode.per_request:
        return
    indices = engine_devices(params, spec)
    chosen = [spec.executors[i] for i in indices]
    headroom = ENGINE_HEADROOM if any(e.uses_gpu for e in chosen) else CPU_ENGINE_HEADROOM
    why = engine_shortfall(strategy, ray.get(manager.best_speed.remote()),
                           ray.get(manager.device_figures.remote(indices)), [e.name for e in chosen], headroom,
                           ray.get(manager.engine_reached.remote(indices)))
    if why:
        raise UserError(why)


def engine_shortfall(strategy: str, best: float | None, figures: list[float | None], names: list[str],
                     headroom: float = ENGINE_HEADROOM, reached: float | None = None) -> str | None:
    """Why an engine family's devices cannot reach ``best`` (see ``refuse_hopeless_engine``), or None
    where they might, where a device has no measured figure yet, or where an engine trial on them (or on
    some of them) already ran within the headroom of it (``reached``): on the 2-core box a lenet pipeline
    over two 1-core groups ran 8539 img/s, 1.19x their standalone figures' sum, and the next pipeline
    over them was refused against it (docs/why.md, tuning/trial_setup.py)."""
    if not best or not figures or any(f is None for f in figures):
        return None
    total = float(sum(f for f in figures if f is not None))
    if headroom * max(total, reached or 0.0) >= best:
        return None
    return (f"{strategy} cannot beat the best trial's {best:.4g} img/s: its devices ({', '.join(names)}) run the "
            f"whole model at {total:.4g} img/s together, each at its best figure as an engine runs it (eager "
            f"PyTorch on a CPU, a CUDA graph on a GPU; at any backend where none is known), under 1/{headroom:g} of "
            "it")
