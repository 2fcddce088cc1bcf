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

A settle walks the frozen objects again (to free cyclic garbage among them) only where something
may have been let go since: a caller said so (``let_go``: an executor released, an engine or a
runner closed), or the frozen heap grew by a quarter since the last such walk (the rule CPython's
own collector uses for its oldest generation). Otherwise it walks only what was made since the
last settle: a process holding a million objects (the test suite's) spent a second a settle, many
settles a test, walking the same survivors again (docs/why.md).
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

__all__ = ["Collections", "let_go", "settle"]

_LOCK = threading.Lock()
_SETTLING = threading.Event()  # a settle's own collection is not one of the run's
_GROWTH = 0.25  # the frozen heap's growth, since the last whole walk, that makes the next settle whole


class _Walks:
    """When the last whole walk was and whether anything was let go since."""

    let_go = True  # nothing walked yet
    frozen_after = 0  # objects frozen right after the last whole walk


def let_go() -> None:
    """Says objects this process held may be garbage now (a model, an engine, a compiled program let
    go): the next ``settle`` unfreezes and walks everything, so cyclic garbage that an earlier settle
    froze (and a frozen object is never collected) goes, with the device memory it holds."""
    _Walks.let_go = True


def settle() -> None:
    """Collects, then freezes the survivors. Whole (unfreezing first, so garbage frozen by an earlier
    settle is collected too) after a ``let_go`` or once the frozen heap grew by ``_GROWTH``; else
    only the objects made since the last settle are walked."""
    with _LOCK:
        _SETTLING.set()
        try:
            whole = _Walks.let_go or gc.get_freeze_count() > (1 + _GROWTH) * _Walks.frozen_after
            if whole:
                gc.unfreeze()
            gc.collect()
            gc.freeze()
            if whole:
                _Walks.let_go, _Walks.frozen_after = False, gc.get_freeze_count()
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
