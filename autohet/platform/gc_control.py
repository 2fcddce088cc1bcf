"""Python's cyclic garbage collector, kept out of timed work.

A full (generation 2) collection walks every object the collector tracks (about 300k once torch, a
model and this package are imported) with the GIL held, a large share of a short run
(docs/why.md, platform/gc_control.py). Inside a run that pause stops every Python thread of the
process (the thread that feeds a GPU, the engine's device workers, the driver), so one pause in a
short run decides its figure, and whether it meets one depends on when the collector happens to
run. ``settle()`` collects once, outside the timed work, then freezes what survives
(``gc.freeze``): later collections walk only objects made since, well under a millisecond. Every
timed window (a run, a stream of frames, a set of requests, a stage's bound) settles first, so
both sides of a comparison run under the same collector.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

__all__ = ["Collections", "settle"]

_LOCK = threading.Lock()
_SETTLING = threading.Event()  # a settle's own collection is not one of the run's


def settle() -> None:
    """Unfreezes, collects everything, freezes the survivors. Unfreezing first means garbage that
    was frozen by an earlier call (an engine closed since, a dropped model) is collected now: frozen
    objects are never collected, so freezing without it would keep them for the process's life."""
    with _LOCK:
        _SETTLING.set()
        try:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        finally:
            _SETTLING.clear()


class Collections:
    """Collections that ran while the block ran, per generation, and the milliseconds they took
    (``gc.callbacks``; any thread's collection counts: they all hold the GIL). A ``settle()`` in the
    block, before its timed part, is not counted."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self._started: float | None = None

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if _SETTLING.is_set():
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = info["generation"]
            self.count[generation] += 1
            self.ms[generation] += (time.perf_counter() - self._started) * 1e3
            self._started = None

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._on)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on)

    def to_dict(self) -> dict[str, Any]:
        return {"collections": list(self.count), "collection_ms": [round(v, 3) for v in self.ms],
                "total_ms": round(sum(self.ms), 3)}
