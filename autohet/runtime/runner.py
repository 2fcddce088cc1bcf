"""A loaded config's runner (``autohet.load``): an exported config held ready for production inference.

``load`` (``runtime.loader``) starts the config's pool once (executors with their backends and compiled artefacts, GPU
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
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.config import RunConfig
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, input_shape
from autohet.core.objectives import RunMode
from autohet.core.settings import WINDOW_BYTES
from autohet.core.workload import PixelScale
from autohet.runtime._inputs import Batch, ReadAhead, as_batch, join

if TYPE_CHECKING:
    from autohet.pool import Pool
    from autohet.strategies.served import Served

__all__ = ["Runner"]

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


