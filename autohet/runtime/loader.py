"""``autohet.load``: an exported config made ready, once: its model, its pool (or one executor of it),
its strategy's served form built and warmed on a sample, the first call's check armed (``Runner``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.config import RunConfig, load_config
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, input_shape
from autohet.core.objectives import RunMode
from autohet.runtime.runner import Runner

if TYPE_CHECKING:
    from autohet.pool import Pool, PoolSpec
    from autohet.strategies import Strategy

__all__ = ["load"]

log = logging.getLogger("autohet.runtime")


def load(config: str | Path | RunConfig, *, model: str | None = None, checkpoint: str | None = None,
         pool: str | Path | PoolSpec | None = None, executor: int | None = None, check: bool = True,
         ray: bool = False, address: str | None = None, window: int | None = None, check_images: int = 16) -> Runner:
    """A runner for an exported config (``runs/<experiment>/best.yaml``).

    ``model``/``checkpoint``: another model name or trained weights instead of the config's;
    ``pool``: another pool file (the config's executor params applied to it); ``executor``: only this
    executor of a data-parallel config, every call on it (one service replica per executor);
    ``check``: compare the first call with the single-device fp32 reference (on ``check_images`` of
    its images); ``ray`` or ``address``: the executors as Ray actors (local, or on that cluster)
    instead of threads of this process, so an executor that dies loses nothing; ``window``: the most
    images one call of a stream joins (default: the tuned run's images, at most 1 GiB of them)."""
    source = str(config) if not isinstance(config, RunConfig) else "the config"
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    if cfg.platform:
        from autohet.platform.fingerprint import fingerprint, fingerprint_differences

        for line in fingerprint_differences(cfg.platform, fingerprint()):
            log.warning("autohet: warning: platform differs from the tuned one (%s); its speeds may not hold", line)
    spec = _model(cfg, model, checkpoint)
    mode, strategy, pool_spec, params = _plan(cfg, source, _pool_spec(cfg, pool), executor)
    executors, owns_ray = _executors(pool_spec, ray, address)
    try:
        strategy.check_pool(executors, params)
        from autohet.core.workload import workload_for

        sample = workload_for(spec.name, max(8, 2 * max(e.batch for e in pool_spec.executors)), cfg.workload_seed)
        served = strategy.serve(executors, spec, params, mode, sample)
        try:
            warm = served(np.ascontiguousarray(sample.rows(0, 1)))  # first-call costs paid here, not by a request
        except BaseException:
            served.close()
            raise
    except BaseException:
        executors.shutdown()
        if owns_ray:
            import ray as ray_module

            ray_module.shutdown()
        raise
    runner = Runner(cfg, source, spec, mode, params, served, executors, window, check, check_images, owns_ray)
    runner.classes = int(warm.shape[1])
    return runner


def _plan(cfg: RunConfig, source: str, pool_spec: PoolSpec, executor: int | None
          ) -> tuple[RunMode, Strategy, PoolSpec, dict[str, Any]]:
    """The config's run mode, strategy, pool (one executor of it, where asked or where the strategy runs on
    one) and validated params."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.strategies import get_strategy

    mode = ObjectiveSet.parse(cfg.objective).mode
    strategy = get_strategy(cfg.strategy)
    if mode not in strategy.modes:
        raise UserError(f"{source}: strategy {cfg.strategy} does not serve {mode} configs; re-export the config")
    given = {**cfg.params, **cfg.plan}
    if executor is None and strategy.one_executor:  # its other executors would only hold memory and
        executor = int(given.get("executor", 0))  # cores (docs/why.md, runtime/loader.py)
    if executor is not None:
        pool_spec, strategy, given = _one_executor(pool_spec, strategy, executor, source)
    return mode, strategy, pool_spec, strategy.validate(strategy.defaults_for(pool_spec, given))


def _executors(pool_spec: PoolSpec, ray: bool, address: str | None) -> tuple[Pool, bool]:
    """The pool as Ray actors (local, or on the cluster at ``address``) or as threads of this process;
    whether this call started Ray (the runner then shuts it down)."""
    if ray or address:
        import ray as ray_module

        from autohet.platform.ray_cluster import init_ray
        from autohet.pool import RayPool

        owns_ray = not ray_module.is_initialized()
        init_ray(address)
        return RayPool(pool_spec), owns_ray
    from autohet.pool import LocalPool, check_local_devices

    check_local_devices(pool_spec)
    return LocalPool(pool_spec), False


def _one_executor(spec: PoolSpec, strategy: Strategy, index: int, source: str
                  ) -> tuple[PoolSpec, Strategy, dict[str, Any]]:
    """A data-parallel config's executor ``index`` alone: ``single`` on a pool of it."""
    from autohet.pool import PoolSpec
    from autohet.strategies import BASELINE, get_strategy

    if strategy.family != "data_parallel":
        raise UserError(f"{source}: executor= serves one executor of a data-parallel config; {strategy.name} "
                        "splits each input over its devices: load the whole config")
    if not 0 <= index < len(spec.executors):
        raise UserError(f"{source}: executor {index} is out of range; the pool has {len(spec.executors)} "
                        f"({', '.join(e.name for e in spec.executors)})")
    return PoolSpec(spec.name, [spec.executors[index]], spec.source), get_strategy(BASELINE), {"executor": 0}


def _model(cfg: RunConfig, name: str | None, checkpoint: str | None) -> ModelSpec:
    spec = ModelSpec(name or cfg.model.name, cfg.model.seed, checkpoint or cfg.model.checkpoint)
    input_shape(spec.name)  # an unknown name fails here, in one line
    if spec.checkpoint:
        from autohet.core.models import check_checkpoint

        check_checkpoint(spec)
    return spec


def _pool_spec(cfg: RunConfig, pool: str | Path | PoolSpec | None) -> PoolSpec:
    """The config's pool, or another pool file with the config's executor params applied."""
    if pool is None:
        return cfg.pool
    from autohet.pool import PoolSpec, load_pool

    spec = pool if isinstance(pool, PoolSpec) else load_pool(str(pool))
    return spec.with_executor_params(cfg.executor_params) if cfg.executor_params else spec
