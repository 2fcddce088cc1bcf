"""Dispatchers hand work units to executors and report completions, in submit/wait-any form.

The schedulers are written against this small interface, so the same scheduler code runs on
Ray actors, on in-process executor threads, or on a virtual clock (deterministic tests).
"""

from __future__ import annotations

import heapq
import queue
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autohet.executors.base import Executor

__all__ = ["Completion", "Dispatcher", "LocalDispatcher", "Ready", "VirtualClockDispatcher"]


@dataclass
class Completion:
    """A finished (or failed) work unit; times are the dispatcher's clock in seconds."""

    executor: int
    start: int
    size: int
    submitted_s: float
    done_s: float
    compute_s: float
    outputs: np.ndarray | None = None
    error: str | None = None
    delivered: bool = False  # outputs already handed to the dispatcher's sink, part by part

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class _Part:
    """A part of an in-process asynchronous executor's unit, collected; ``done``: the unit, after its last."""

    start: int
    outputs: np.ndarray
    done: Completion | None = None


@dataclass
class Ready:
    """An executor's only unit is about to drain: the driver may queue its next unit now."""

    executor: int


@dataclass
class _Queued:
    """A unit the dispatcher holds for an executor; ``started`` moves to the end of the unit ahead."""

    start: int
    size: int
    started: float


class Dispatcher(ABC):
    """Submit a unit to an executor that can take one; wait for the next event; read the clock.

    Lookahead: an executor marked in ``lookahead`` (an asynchronous one, a GPU) may be given its
    next unit while its current one drains, once the driver turns ``lookahead_on`` (strategies
    without a barrier). The queued unit's start is then the end of the one before it, so the
    timeline never overlaps and the executor's device does not wait for the driver between units.
    """

    def __init__(self, names: list[str], lookahead: list[bool] | None = None) -> None:
        self.names = list(names)
        self.queued: dict[int, list[_Queued]] = {}  # per executor, in the order its units run
        self.lookahead = list(lookahead or [False] * len(names))
        self.lookahead_on = False
        # where outputs go as soon as a piece arrives (set by the driver); dispatchers that split
        # units use it so a unit's outputs are placed while the executor still runs its later parts
        self.sink: Callable[[int, np.ndarray], None] | None = None

    @property
    def busy(self) -> dict[int, tuple[int, int, float]]:
        """Executors with a unit in flight -> (start, size, started) of their current unit."""
        return {i: (q[0].start, q[0].size, q[0].started) for i, q in self.queued.items() if q}

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def _submit(self, executor: int, start: int, size: int) -> None: ...

    @abstractmethod
    def _wait_any(self, timeout: float | None = None) -> Completion | Ready | None:
        """The next completion (or a lookahead executor's Ready), or None when ``timeout`` passes."""

    def _draining(self, executor: int) -> bool:
        """Whether the executor's only unit has been sent in full (a subclass that sends units
        in parts says when the last part is next)."""
        return True

    def _flush(self) -> None:  # noqa: B027
        """Optional hook: send what was held back for a decision the driver has now made."""

    def can_take(self, executor: int) -> bool:
        """Idle, or (lookahead) holding one unit that is about to drain."""
        units = self.queued.get(executor)
        if not units:
            return True
        return (self.lookahead_on and self.lookahead[executor] and len(units) == 1
                and self._draining(executor))

    def submit(self, executor: int, start: int, size: int) -> None:
        if not self.can_take(executor):
            raise RuntimeError(f"executor {self.names[executor]} is busy")
        self.queued.setdefault(executor, []).append(_Queued(start, size, self.now()))
        self._submit(executor, start, size)

    def wait_any(self, timeout: float | None = None) -> Completion | Ready | None:
        if not self.busy:
            raise RuntimeError("wait_any with nothing in flight")
        self._flush()
        done = self._wait_any(timeout)
        if isinstance(done, Completion):
            units = self.queued.get(done.executor, [])
            match = next((u for u in units if (u.start, u.size) == (done.start, done.size)), None)
            if match is not None:
                units.remove(match)
                done.submitted_s = max(done.submitted_s, match.started)
            if units and done.ok:  # the queued unit starts when this one ends, not when it was queued
                units[0].started = max(units[0].started, done.done_s)
            if not units:
                self.queued.pop(done.executor, None)
        return done

    def settle(self, seconds: float) -> list[int]:
        """The executors still working on work already sent, after waiting up to ``seconds`` for it
        (a cut run's); a dispatcher that cannot wait for it names every busy one."""
        return sorted(self.busy)

    def close(self) -> None:  # noqa: B027
        """Optional hook: release threads or handles."""


class VirtualClockDispatcher(Dispatcher):
    """Simulated executors on a virtual clock: deterministic, instant, for tests and planning.

    A unit of ``size`` images on executor i takes ``overhead_i + size / speed_i`` virtual seconds;
    the overhead is the round trip before a unit starts, so a unit queued behind another
    (lookahead) starts when that one ends and pays none.
    """

    def __init__(self, names: list[str], speeds: list[float], overheads: list[float] | None = None,
                 die_at: dict[int, float] | None = None, lookahead: list[bool] | None = None) -> None:
        super().__init__(names, lookahead)
        self.speeds = speeds
        self.overheads = overheads or [0.0] * len(names)
        self.die_at = die_at or {}  # executor -> virtual time of death
        self.clock = 0.0
        self.free_at = [0.0] * len(names)  # when each executor's last queued unit ends
        self.events: list[tuple[float, int, int, int, int, float]] = []
        self._seq = 0

    def now(self) -> float:
        return self.clock

    def _submit(self, executor: int, start: int, size: int) -> None:
        queued_behind = len(self.queued[executor]) > 1
        begin = max(self.clock, self.free_at[executor]) if queued_behind else self.clock
        finish = begin + (0.0 if queued_behind else self.overheads[executor]) + size / self.speeds[executor]
        self.free_at[executor] = finish
        death = self.die_at.get(executor)
        if death is not None and death < finish:
            finish = max(death, self.clock)
        self._seq += 1
        heapq.heappush(self.events, (finish, self._seq, executor, start, size, begin))

    def _wait_any(self, timeout: float | None = None) -> Completion | None:
        if timeout is not None and self.events and self.events[0][0] - self.clock > timeout:
            self.clock += timeout
            return None
        finish, _, executor, start, size, begin = heapq.heappop(self.events)
        self.clock = finish
        death = self.die_at.get(executor)
        if death is not None and death <= finish:
            return Completion(executor, start, size, begin, finish, 0.0, error="executor died (simulated)")
        outputs = np.arange(start, start + size, dtype=np.float32).reshape(size, 1)
        return Completion(executor, start, size, begin, finish, finish - begin, outputs)


class LocalDispatcher(Dispatcher):
    """Executors in this process, each run on its own worker thread (torch releases the GIL inside
    its kernels).

    An asynchronous executor (``launches_async``: a GPU) takes its next unit while the current one
    runs (lookahead): its worker thread only queues units (``launch``), and a collector thread of its
    own waits for each in turn (``collect``) and reports it, so the device runs the next unit's work
    queued behind the current one's instead of idling while this thread decides. Two GPUs of one process
    then each keep a unit in flight, their host work (a few launches a batch) on their own threads."""

    def __init__(self, executors: list[Executor], workers: list[Any]) -> None:
        super().__init__([e.spec.name for e in executors], [e.launches_async for e in executors])
        self.executors = executors
        self.workers = workers
        self.results: queue.Queue[Completion] = queue.Queue()
        self.t0 = time.perf_counter()
        self._collectors: dict[int, Any] = {}

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _failed(self, executor: int, start: int, size: int, submitted: float, exc: Exception) -> None:
        """A unit reported as failed, re-dispatched by the driver."""
        self.results.put(Completion(executor, start, size, submitted, self.now(), 0.0,
                                    error=f"{type(exc).__name__}: {exc}"))

    def _submit(self, executor: int, start: int, size: int) -> None:
        submitted = self.now()
        ex = self.executors[executor]
        if ex.launches_async:
            self.workers[executor].submit(lambda: self._launch(executor, start, size, submitted))
            return

        def work() -> None:
            try:
                result = ex.run(start, size)
                self.results.put(Completion(executor, start, size, submitted, self.now(), result.compute_s,
                                            result.outputs))
            except Exception as exc:  # reported as a failed unit, re-dispatched by the driver
                self._failed(executor, start, size, submitted, exc)

        self.workers[executor].submit(work)

    def _launch(self, executor: int, start: int, size: int, submitted: float) -> None:
        """On the executor's worker: the unit queued on the device in parts of at most ``max_unit_images``
        (as a Ray actor gets it), their collection handed to the collector, each part's outputs placed by
        the driver as it arrives: a GPU's whole-run unit (``single``) placed its 200000 outputs only after
        its last batch, and allocated their pinned buffer before its first, well below its standalone
        speed (docs/why.md, pool/dispatch.py)."""
        ex = self.executors[executor]
        most = ex.spec.max_unit_images
        parts = [(s, min(most, start + size - s)) for s in range(start, start + size, most)]
        try:
            handles = [(s, ex.launch(s, n)) for s, n in parts]
        except Exception as exc:
            self._failed(executor, start, size, submitted, exc)
            return

        def collect() -> None:
            compute_s = 0.0
            try:
                for k, (s, handle) in enumerate(handles):
                    result = ex.collect(handle)
                    compute_s += result.compute_s
                    if k + 1 < len(handles):
                        self.results.put(_Part(s, result.outputs))
                    else:
                        self.results.put(_Part(s, result.outputs, Completion(
                            executor, start, size, submitted, self.now(), compute_s, delivered=True)))
            except Exception as exc:
                self._failed(executor, start, size, submitted, exc)

        self._collector(executor).submit(collect)

    def _collector(self, executor: int) -> Any:
        if executor not in self._collectors:
            from autohet.pool.worker import Worker

            self._collectors[executor] = Worker(f"{self.names[executor]}-collect")
        return self._collectors[executor]

    def _wait_any(self, timeout: float | None = None) -> Completion | None:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            try:
                left = None if deadline is None else max(0.0, deadline - time.perf_counter())
                item = self.results.get(timeout=left)
            except queue.Empty:  # the unit's thread keeps running: in-process work cannot be cancelled
                return None
            if not isinstance(item, _Part):
                return item
            assert self.sink is not None, "an asynchronous executor's parts are placed by the driver's sink"
            self.sink(item.start, item.outputs)  # on the driver's thread, as its other outputs are
            if item.done is not None:
                return item.done

    def close(self) -> None:
        for worker in self._collectors.values():
            worker.close(wait_s=2.0)
        self._collectors = {}
