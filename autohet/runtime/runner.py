"""``autohet.load``: an exported config held ready for production inference.

``load`` starts the config's pool once (executors with their backends and compiled artefacts, GPU
partitions) or builds its engine program (placement, split, coedge, channels, pipeline), with the
plan the config names or, where it names none, the plan measured once now (``Strategy.serve``).
A call then only runs images: it never measures speeds and never plans. Calls from several threads
are safe and overlap: requests that arrive while a call runs are joined into the next call.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.config import RunConfig, load_config
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, input_shape
from autohet.core.objectives import RunMode
from autohet.core.settings import WINDOW_BYTES
from autohet.core.workload import PixelScale
from autohet.runtime._inputs import Batch, ReadAhead, as_batch, join

if TYPE_CHECKING:
    from autohet.pool import Pool, PoolSpec
    from autohet.strategies import Strategy
    from autohet.strategies.served import Served

__all__ = ["Runner", "load"]

log = logging.getLogger("autohet.runtime")



@dataclass
class _Request:
    """One caller's batches (a call's one, or a stream window's several) and, once run, their outputs."""

    parts: list[np.ndarray]
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None


class Runner:
    """``runner(batch)`` -> outputs in input order; ``runner.map(batches)`` for a stream; ``close``.

    ``deaths``: executors that died during calls (their units re-run on the others); ``checked``:
    the first call's outputs matched the single-device fp32 reference (``check_result``)."""

    def __init__(self, config: RunConfig, source: str, model: ModelSpec, mode: RunMode, params: dict[str, Any],
                 served: Served, pool: Pool, window: int | None, check: bool, check_images: int,
                 owns_ray: bool) -> None:
        self.config, self.source, self.model, self.mode, self.params = config, source, model, mode, params
        self.served, self.pool, self.owns_ray = served, pool, owns_ray
        self.input_shape = tuple(input_shape(model.name))
        self.checked = not check
        self.check_images = check_images
        self.check_result: dict[str, float] = {}
        per_image = int(np.prod(self.input_shape)) * 4
        # a stream's window: the tuned run's images, at most WINDOW_BYTES of them (uint8 pixels: four
        # times float32's images), unless ``window`` says how many; ``window`` reports float32's
        self.window = window or max(served.batch, min(config.images, WINDOW_BYTES // per_image))
        self._window_images = window or max(served.batch, config.images)
        self._window_bytes = None if window else max(WINDOW_BYTES, served.batch * per_image)
        self.classes: int | None = None
        self._pending: list[_Request] = []
        self._buffers: dict[np.dtype, np.ndarray] = {}
        self._scale: PixelScale | None = None
        self.device_pixels = False  # uint8 pixels go to the devices as they are (set by the first such call)
        self._pixels_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._run_lock = threading.RLock()  # re-entered where a call first meets pixels (the scale is set once)
        self._reported = 0
        # device calls and the images they ran (Triton's execution and inference counts): their ratio is
        # how full the calls are; a service's replica fills them only as far as its requests come
        self.executions = self.inferences = 0
        self._counts_lock = threading.Lock()
        self._closed = False
        self._stream_lock = threading.Lock()

    # --- calls ---------------------------------------------------------------------------------------

    def __call__(self, batch: Any) -> Any:
        """(N, C, H, W) float32 inputs or uint8 pixels, numpy array or torch tensor -> (N, classes),
        same order and type. Pixels are scaled by the config's preprocess mean and std: on the GPU where
        the config's devices take them (a quarter of float32's bytes copied), else here."""
        checked = as_batch(batch, self.input_shape, self.model.name)
        return checked.give_back(self._run([checked.images])[0])

    def map(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Outputs of each batch, in order. Batches are read ahead on a thread and those already there
        run as one call, up to ``window`` images, so the devices see calls as large as the tuned run's."""
        reader = ReadAhead(batches, self.input_shape, self.model.name,
                           2 * (self._window_bytes or self.window * int(np.prod(self.input_shape)) * 4))
        try:
            while True:
                if self.checked and self._stream_lock.acquire(blocking=False):
                    try:  # one staged stream at a time (a GPU stages by turns into its two buffers)
                        yield from self._staged(reader)
                    finally:
                        self._stream_lock.release()
                    return
                taken, error, ended = reader.take(self._window_images, self._window_bytes)
                if taken:  # the first window (checked on its own call), or a second stream's windows
                    for b, out in zip(taken, self._run([b.images for b in taken]), strict=True):
                        yield b.give_back(out)
                if error is not None:
                    raise error
                if ended:
                    return
        finally:
            reader.stop()

    def _staged(self, reader: ReadAhead) -> Iterator[Any]:
        """A stream through ``Served.stream``: each window made ready while the one before it runs (a
        GPU stages it into pinned memory straight from the batches, nothing joined), calls from other
        threads run between windows. Used once the first call has been checked."""
        windows: deque[list[Batch]] = deque()
        failed: list[BaseException] = []

        def source() -> Iterator[list[np.ndarray]]:
            while True:
                taken, error, ended = reader.take(self._window_images, self._window_bytes, self.served.batch)
                if taken:
                    windows.append(taken)
                    self._count(sum(len(b.images) for b in taken))
                    yield self._device_inputs([b.images for b in taken])
                if error is not None:
                    failed.append(error)
                if error is not None or ended:
                    return

        outputs = self.served.stream(source(), self._run_lock)
        try:
            for out in outputs:
                self._report_deaths()
                start = 0
                for b in windows.popleft():
                    yield b.give_back(out[start : start + len(b.images)])
                    start += len(b.images)
            if failed:
                raise failed[0]
        finally:
            reader.stop()  # first: a staging thread waiting for the next window returns
            outputs.close()

    def _run(self, parts: list[np.ndarray]) -> list[np.ndarray]:
        """Each part's outputs: the parts run as one call, with any requests that arrived while
        another call ran."""
        if self._closed:
            raise UserError("this runner is closed; load the config again")
        if not any(len(p) for p in parts):
            return [np.zeros((0, self.classes or 0), dtype=np.float32) for _ in parts]
        request = _Request(self._device_inputs(parts))
        with self._queue_lock:
            self._pending.append(request)
        with self._run_lock:
            if not request.done.is_set():
                with self._queue_lock:
                    joined, self._pending = self._pending, []
                self._execute(joined)
        if request.error is not None:
            raise request.error
        return request.outputs

    def _device_inputs(self, parts: list[np.ndarray]) -> list[np.ndarray]:
        """The parts as the devices take them: uint8 pixels kept where every part is pixels and the
        devices scale them (``Served.accept_pixels``), else scaled to float32 here."""
        if not any(p.dtype == np.uint8 for p in parts):
            return parts
        scale = self._pixel_scale()
        if self.device_pixels and all(p.dtype == np.uint8 for p in parts):
            return parts
        return [scale.apply(p) if p.dtype == np.uint8 else p for p in parts]

    def _pixel_scale(self) -> PixelScale:
        """The config's mean and std (``preprocess``, else the ImageNet weights'), once; the served
        devices are offered them then."""
        with self._pixels_lock:
            if self._scale is None:
                from autohet.runtime.images import preprocessing_for

                scale = preprocessing_for(self.input_shape, self.config.preprocess, self.source).scale
                with self._run_lock:  # between calls: executors read the scale in their units
                    self.device_pixels = self.served.accept_pixels(scale)
                self._scale = scale
            return self._scale

    def _execute(self, requests: list[_Request]) -> None:
        parts = [p for r in requests for p in r.parts]
        if len({p.dtype for p in parts}) > 1:  # pixels and inputs joined into one call: all as inputs
            parts = [self._pixel_scale().apply(p) if p.dtype == np.uint8 else p for p in parts]
        images = parts[0] if len(parts) == 1 else self._joined(parts)
        try:
            outputs = self.served(images)
            self._count(len(images))
            if not self.checked:
                self._check(images, outputs)
            self.classes = outputs.shape[1]
        except BaseException as exc:
            for r in requests:
                r.error = exc
                r.done.set()
            raise
        finally:
            self._report_deaths()
        start = 0
        for r in requests:
            for p in r.parts:
                r.outputs.append(outputs[start : start + len(p)])
                start += len(p)
            r.done.set()

    def _count(self, images: int) -> None:
        with self._counts_lock:
            self.executions += 1
            self.inferences += images

    def _joined(self, parts: list[np.ndarray]) -> np.ndarray:
        """The parts copied into the runner's window buffer, kept from call to call: a fresh gigabyte
        per window would cost more in page faults than the copy (only calls use it, one at a time)."""
        total = sum(len(p) for p in parts)
        buffer = self._buffers.get(parts[0].dtype)
        if buffer is None or len(buffer) < total:
            buffer = self._buffers[parts[0].dtype] = np.empty((total, *self.input_shape), dtype=parts[0].dtype)
        return join(parts, buffer[:total])

    def _check(self, images: np.ndarray, outputs: np.ndarray) -> None:
        """The first call's outputs against the single-device fp32 reference (RunContext's check)."""
        from autohet.context import RunContext
        from autohet.core.workload import Workload

        if images.dtype == np.uint8:
            images = self._pixel_scale().apply(images)
        ctx = RunContext(self.model, Workload(images, len(images)), check_images=self.check_images)
        ok, diff, tol, problems = ctx.check(outputs, np.ones(len(images), dtype=np.int32), self.served.precision,
                                            self.served.simulated)
        self.check_result = {"max_abs_diff": diff, "tolerance": tol, "images": min(len(images), self.check_images)}
        if not ok:
            raise UserError(f"{self.source} does not reproduce its outputs on this machine: {'; '.join(problems)} "
                            "(first call against the single-device fp32 reference); tune again here, or load with "
                            "check=False to serve it unchecked")
        self.checked = True

    def _report_deaths(self) -> None:
        for line in self.served.deaths[self._reported:]:
            log.warning("autohet: %s", line)
        self._reported = len(self.served.deaths)

    # --- state ---------------------------------------------------------------------------------------

    @property
    def deaths(self) -> list[str]:
        return list(self.served.deaths)

    @property
    def batch(self) -> int:
        """Images per call that give every device of the config work at once."""
        return self.served.batch

    @property
    def cores(self) -> frozenset[int]:
        """The CPU cores of this node the config's devices pin."""
        return self.served.cores

    def describe(self) -> dict[str, Any]:
        return {"config": self.source, "model": self.model.name, "strategy": self.config.strategy,
                "objective": self.mode, "params": self.params, "served": self.served.describe(),
                "window": self.window, "checked": self.checked, "check": self.check_result, "deaths": self.deaths,
                "executions": self.executions, "inferences": self.inferences,
                "stream": asdict(self.pool.stream_stats)}

    def close(self) -> None:
        """Stops the engine or the executors (and the Ray this runner started)."""
        if self._closed:
            return
        self._closed = True
        with self._run_lock:
            try:
                self.served.close()
            finally:
                self.pool.shutdown()
                if self.owns_ray:
                    import ray

                    ray.shutdown()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    pool_spec = _pool_spec(cfg, pool)
    from autohet.core.objectives import ObjectiveSet
    from autohet.strategies import get_strategy

    mode = ObjectiveSet.parse(cfg.objective).mode
    strategy = get_strategy(cfg.strategy)
    if mode not in strategy.modes:
        raise UserError(f"{source}: strategy {cfg.strategy} does not serve {mode} configs; re-export the config")
    given = {**cfg.params, **cfg.plan}
    if executor is None and strategy.one_executor:  # its other executors would only hold memory and
        executor = int(given.get("executor", 0))  # cores (the H100 box's auto pool: four idle CPU groups)
    if executor is not None:
        pool_spec, strategy, given = _one_executor(pool_spec, strategy, executor, source)
    params = strategy.validate(strategy.defaults_for(pool_spec, given))
    owns_ray = False
    if ray or address:
        import ray as ray_module

        from autohet.platform.ray_cluster import init_ray
        from autohet.pool import RayPool

        owns_ray = not ray_module.is_initialized()
        init_ray(address)
        executors: Pool = RayPool(pool_spec)
    else:
        from autohet.pool import LocalPool, check_local_devices

        check_local_devices(pool_spec)
        executors = LocalPool(pool_spec)
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
