"""Dispatchers hand work units to executors and report completions, in submit/wait-any form.

The schedulers are written against this small interface, so the same scheduler code runs on
Ray actors, on in-process executor threads, or on a virtual clock (deterministic tests).
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autohet.executors.base import Executor

__all__ = ["Completion", "Dispatcher", "LocalDispatcher", "VirtualClockDispatcher"]


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


class Dispatcher(ABC):
    """Submit a unit to an idle executor; wait for the next completion; read the clock."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self.busy: dict[int, tuple[int, int, float]] = {}  # executor -> (start, size, submitted)
        # where outputs go as soon as a piece arrives (set by the driver); dispatchers that split
        # units use it so a unit's outputs are placed while the executor still runs its later parts
        self.sink: Callable[[int, np.ndarray], None] | None = None

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def _submit(self, executor: int, start: int, size: int) -> None: ...

    @abstractmethod
    def _wait_any(self, timeout: float | None = None) -> Completion | None:
        """The next completion, or None when ``timeout`` seconds pass first."""

    def submit(self, executor: int, start: int, size: int) -> None:
        if executor in self.busy:
            raise RuntimeError(f"executor {self.names[executor]} is busy")
        self.busy[executor] = (start, size, self.now())
        self._submit(executor, start, size)

    def wait_any(self, timeout: float | None = None) -> Completion | None:
        if not self.busy:
            raise RuntimeError("wait_any with nothing in flight")
        done = self._wait_any(timeout)
        if done is not None:
            self.busy.pop(done.executor, None)
        return done

    def close(self) -> None:  # noqa: B027
        """Optional hook: release threads or handles."""


class VirtualClockDispatcher(Dispatcher):
    """Simulated executors on a virtual clock: deterministic, instant, for tests and planning.

    A unit of ``size`` images on executor i takes ``overhead_i + size / speed_i`` virtual seconds.
    """

    def __init__(self, names: list[str], speeds: list[float], overheads: list[float] | None = None,
                 die_at: dict[int, float] | None = None) -> None:
        super().__init__(names)
        self.speeds = speeds
        self.overheads = overheads or [0.0] * len(names)
        self.die_at = die_at or {}  # executor -> virtual time of death
        self.clock = 0.0
        self.events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0

    def now(self) -> float:
        return self.clock

    def _submit(self, executor: int, start: int, size: int) -> None:
        finish = self.clock + self.overheads[executor] + size / self.speeds[executor]
        death = self.die_at.get(executor)
        if death is not None and death < finish:
            finish = max(death, self.clock)
        self._seq += 1
        heapq.heappush(self.events, (finish, self._seq, executor, start, size))

    def _wait_any(self, timeout: float | None = None) -> Completion | None:
        if timeout is not None and self.events and self.events[0][0] - self.clock > timeout:
            self.clock += timeout
            return None
        finish, _, executor, start, size = heapq.heappop(self.events)
        submitted = self.busy[executor][2]
        self.clock = finish
        death = self.die_at.get(executor)
        if death is not None and death <= finish:
            return Completion(executor, start, size, submitted, finish, 0.0, error="executor died (simulated)")
        outputs = np.arange(start, start + size, dtype=np.float32).reshape(size, 1)
        return Completion(executor, start, size, submitted, finish, finish - submitted, outputs)


class LocalDispatcher(Dispatcher):
    """Executors in this process, one thread each (torch releases the GIL inside its kernels)."""

    def __init__(self, executors: list[Executor]) -> None:
        super().__init__([e.spec.name for e in executors])
        self.executors = executors
        self.results: queue.Queue[Completion] = queue.Queue()
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _submit(self, executor: int, start: int, size: int) -> None:
        submitted = self.now()

        def work() -> None:
            try:
                result = self.executors[executor].run(start, size)
                self.results.put(Completion(executor, start, size, submitted, self.now(), result.compute_s,
                                            result.outputs))
            except Exception as exc:  # reported as a failed unit, re-dispatched by the driver
                self.results.put(Completion(executor, start, size, submitted, self.now(), 0.0,
                                            error=f"{type(exc).__name__}: {exc}"))

        threading.Thread(target=work, daemon=True, name=f"autohet-{self.names[executor]}").start()

    def _wait_any(self, timeout: float | None = None) -> Completion | None:
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:  # the unit's thread keeps running: in-process work cannot be cancelled
            return None
