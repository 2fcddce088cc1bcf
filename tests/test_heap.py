"""The collector kept out of timed work (autohet.platform.gc_control): settled objects are skipped by later
collections, and nothing settled is kept once it becomes garbage: at the settle after a ``let_go``, or once the
frozen heap grew by a quarter."""

from __future__ import annotations

import gc
import time
import weakref

from autohet.platform import gc_control
from autohet.platform.gc_control import Collections, let_go, settle


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> tuple[_Node, weakref.ref]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a, weakref.ref(b)


def test_settle_collects_garbage_and_freezes_the_survivors():
    dead = _cycle()[1]  # garbage: a cycle nothing refers to
    alive, kept = _cycle()
    settle()
    try:
        assert dead() is None
        assert kept() is not None
        assert gc.get_freeze_count() > 0
        with Collections() as seen:
            found = gc.collect()  # walks only what was made since: the frozen cycle is not garbage yet
        assert seen.count == [0, 0, 1] and seen.ms[2] >= 0
        assert found == 0
    finally:
        gc.unfreeze()
    del alive


def test_settled_objects_let_go_are_freed_at_the_next_settle():
    alive, kept = _cycle()
    settle()
    try:
        del alive
        gc.collect()
        assert kept() is not None  # frozen: a collection skips it
        let_go()
        settle()
        assert kept() is None
    finally:
        gc.unfreeze()


def test_a_settle_with_nothing_let_go_walks_only_what_was_made_since():
    let_go()
    settle()  # whole: the frozen heap's size is noted
    alive, kept = _cycle()
    settle()  # the new cycle is frozen
    try:
        del alive
        fresh = _cycle()[1]  # garbage made since
        settle()
        assert fresh() is None  # walked
        assert kept() is not None  # frozen and nothing let go: not walked again
        grown = [[] for _ in range(int(0.3 * gc.get_freeze_count()) + 1)]  # the frozen heap grows by a quarter
        settle()  # frozen now, counted at the next
        settle()
        assert kept() is None
        assert not gc_control._Walks.let_go
        del grown
    finally:
        gc.unfreeze()


def test_collections_reports_counts_and_milliseconds_but_not_a_settle():
    began = time.perf_counter()
    with Collections() as seen:
        settle()  # before a run's clock: not the run's
        gc.collect(0)
        gc.collect(2)
    wall_ms = (time.perf_counter() - began) * 1e3
    gc.unfreeze()
    out = seen.to_dict()
    assert out["collections"] == [1, 0, 1]
    assert 0 < out["total_ms"] <= wall_ms  # a full collection takes time, and no more than the block's
    assert seen._on not in gc.callbacks
