"""A replica's requests as one stream through its runner (``runner.map``), answered one by one.

Why: a call (``runner(images)``) stages its images, runs them and waits for the outputs before
the next call starts; the stream stages the next window while the devices run this one (a GPU's
pinned buffers filled straight from the requests' arrays), as ``autohet.load``'s offline stream does.
Requests queued while a window runs go into the next window together.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["RequestStream"]

_CLOSE = object()


class RequestStream:
    """``await stream(images)`` -> that request's outputs. One thread runs ``runner.map`` over the
    requests in arrival order; an error ends the stream's current run (every request taken into it
    gets the error) and the next request starts a new one. ``close`` ends the thread."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="autohet-request-stream", daemon=True)
        self.thread.start()

    async def __call__(self, images: np.ndarray) -> tuple[np.ndarray, float, float]:
        """(outputs, when the request went into the stream, when its outputs were ready on the stream's
        thread), times by ``time.perf_counter``: the second minus the first is the stream's share of
        its time, the rest is the event loop's."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        put = time.perf_counter()
        self.inbox.put((images, loop, future))
        outputs, ready = await future
        return outputs, put, ready

    def close(self, timeout_s: float = 10.0) -> None:
        self.inbox.put(_CLOSE)
        self.thread.join(timeout_s)

    def _serve(self) -> None:
        """Runs of the stream, a new one after each failed run, until the stream is closed."""
        failed = True
        while failed:
            failed = self._run()

    def _run(self) -> bool:
        """One ``runner.map`` over the requests until the stream closes (False) or fails (True: the
        requests taken into it get the error, the next ones go into a new run). A failed run's reader
        may still be waiting on the inbox (the runner reads ahead on a thread of its own): what it gets
        then is put back for the next run, not lost with the failed one."""
        taken: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()
        state = {"closed": False, "over": False}
        lock = threading.Lock()

        def requests() -> Iterator[np.ndarray]:
            while True:
                item = self.inbox.get()
                with lock:
                    if state["over"]:  # the next run's
                        self.inbox.put(item)
                        return
                    if item is _CLOSE:
                        state["closed"] = True
                        return
                    images, loop, future = item
                    taken.append((loop, future))
                yield images

        try:
            for out in self.runner.map(requests()):
                with lock:
                    entry = taken.popleft()
                _answer(*entry, out, None)
        except Exception as exc:
            with lock:
                state["over"] = True
                failed = list(taken)
                taken.clear()
            for entry in failed:
                _answer(*entry, None, exc)
            return not state["closed"]
        return False


def _answer(loop: asyncio.AbstractEventLoop, future: asyncio.Future, out: np.ndarray | None,
            error: BaseException | None) -> None:
    ready = time.perf_counter()

    def settle() -> None:
        if future.done():  # the caller went away (cancelled)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result((out, ready))

    with contextlib.suppress(RuntimeError):  # the loop closed: the replica is shutting down
        loop.call_soon_threadsafe(settle)
