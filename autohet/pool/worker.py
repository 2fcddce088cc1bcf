"""One long-lived thread per in-process executor: everything the executor does runs on it.

An executor pins the thread that runs it (its cores, its own intra-op threads), so an in-process
pool keeps each executor on its own cores and nothing leaks into the caller's thread; a thread per
executor, not per unit, keeps its OpenMP team alive between units.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["Worker"]


class Worker:
    """Runs submitted callables in order on its own daemon thread; ``setup`` runs first on it (its
    error is raised by the constructor)."""

    def __init__(self, name: str, setup: Callable[[], Any] | None = None) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"autohet-{name}")
        self._thread.start()
        if setup is not None:
            self.call(setup)

    def _loop(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            fn, future = item
            try:
                future.set_result(fn())
            except BaseException as exc:  # the caller gets the error
                future.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self._tasks.put((fn, future))
        return future

    def call(self, fn: Callable[[], Any]) -> Any:
        return self.submit(fn).result()

    def close(self, wait_s: float = 10.0) -> None:
        """Ends the thread once its queue is done, waiting up to ``wait_s`` for it (a thread left
        inside a torch kernel at interpreter exit aborts the process; a unit abandoned by a timed-out
        run may still be running, and in-process work cannot be cancelled, hence the cap)."""
        self._tasks.put(None)
        self._thread.join(timeout=wait_s)
