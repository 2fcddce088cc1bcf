"""A data-parallel config held ready for production calls: each call's images run through the tuned
scheduler over the warm executors; a stream over several in-process executors runs a lane per executor
(``autohet.pool.lanes``), and one of a single asynchronous executor queues its windows back to back."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.context import precision_of
from autohet.core.errors import UserError
from autohet.core.workload import PixelScale, Workload
from autohet.strategies._driver import Scheduler, drive
from autohet.strategies.served import Served

if TYPE_CHECKING:
    from autohet.pool import Pool

__all__ = ["DataParallelServed"]


class DataParallelServed(Served):
    """Each call's images are the workload of one run of the scheduler over the warm executors
    (``drive``, as ``run`` does, without the measuring around it): units handed out by the tuned rule
    and parameters, outputs placed in order. A unit whose executor dies is re-run on the others
    (``deaths`` says which died); later calls give a dead executor no work."""

    def __init__(self, strategy: Scheduler, pool: Pool, params: dict[str, Any]) -> None:
        self.strategy, self.pool, self.params = strategy, pool, params
        self.precision, self.simulated = precision_of(pool), pool.simulated
        self.batches = [e.batch for e in pool.spec.executors]
        self.batch = sum(self.batches)
        self.cores = frozenset(c for e in pool.spec.executors if e.node is None for c in e.cores)  # this node's
        self.alive = [True] * len(pool)
        self.deaths: list[str] = []
        self.speeds: list[float | None] = [None] * len(pool)  # each executor's img/s in the calls so far
        self._lanes: Any = None

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return self._drive(self.pool.set_workload(Workload(images, len(images))), len(images))

    def _drive(self, refused: list[int], images: int) -> np.ndarray:
        """One run of the scheduler over the images the executors were just given (``refused``: those
        that could not take them)."""
        for i in refused:
            if self.alive[i]:
                self.alive[i] = False
                self.deaths.append(f"executor {self.pool.names[i]} died between calls")
        result = drive(self.strategy, self.params, self.pool.dispatcher(), images, batches=self.batches,
                       alive=self.alive)
        self.deaths += result.failures
        self.alive = [not died for died in result.died]
        for i, (n, busy) in enumerate(zip(result.images_by_executor, result.busy_by_executor, strict=True)):
            if n and busy > 0:
                self.speeds[i] = n / busy
        assert result.outputs is not None
        return result.outputs

    def stream(self, windows: Iterable[list[np.ndarray]], lock: Any = None) -> Iterator[np.ndarray]:
        """Each window staged (``Pool.stage``: a GPU copies it into its next pinned buffer) on a thread of
        its own while the window before it runs, so the devices do not wait for the host between calls:
        joining and staging a window can take longer than the GPU's work on it (docs/why.md,
        strategies/data_parallel_served.py)."""
        from concurrent.futures import ThreadPoolExecutor

        if self.pool.overlaps_windows() and all(self.alive):  # one GPU: windows queued back to back
            try:
                yield from self.pool.stream_windows(windows, lock or nullcontext())
            except (UserError, GeneratorExit):
                raise
            except Exception as exc:  # the only executor failed: as the driver reports it
                self.alive = [False]
                self.deaths.append(f"executor {self.pool.names[0]} failed: {type(exc).__name__}: {exc}")
                raise UserError(f"every executor died before the work was done: {self.deaths[-1]}") from exc
            return
        if self._lanes is None:
            self._lanes = self.pool.lanes(self.speeds, self.alive)
        if self._lanes is not None:  # several in-process executors: a lane each, the speeds kept
            yield from self._through_lanes(windows)
            return
        source = iter(windows)

        def next_staged() -> tuple[Any, int] | None:
            parts = next(source, None)
            return None if parts is None else (self.pool.stage(parts), sum(len(p) for p in parts))

        with ThreadPoolExecutor(1, thread_name_prefix="autohet-stage") as stager:
            ahead = stager.submit(next_staged)
            while (current := ahead.result()) is not None:
                ahead = stager.submit(next_staged)  # the next window, made ready while this one runs
                staged, images = current
                with lock or nullcontext():
                    outputs = self._drive(self.pool.use_staged(staged), images)
                yield outputs

    def _through_lanes(self, windows: Iterable[list[np.ndarray]]) -> Iterator[np.ndarray]:
        """The stream on the executors' lanes (``autohet.pool.lanes``); deaths and speeds carried back."""
        lanes, stats = self._lanes, self.pool.stream_stats
        seen = len(lanes.deaths)
        staged = lanes.stage_s
        try:
            for outputs in lanes.run(windows):
                stats.windows += 1
                stats.images += len(outputs)
                yield outputs
        finally:
            stats.stage_s += lanes.stage_s - staged
            stats.executors = {name: asdict(s) for name, s in lanes.stats().items()}
            self.deaths += lanes.deaths[seen:]
            self.alive = lanes.alive

    def accept_pixels(self, scale: PixelScale) -> bool:
        return self.pool.accept_pixels(scale)

    def describe(self) -> dict[str, Any]:
        return {"executors": [e.device for e in self.pool.spec.executors], "strategy": self.strategy.name,
                "params": self.params, "stream": "a lane per executor" if self._lanes is not None else "by window"}

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
