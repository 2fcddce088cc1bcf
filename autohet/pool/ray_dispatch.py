"""``RayDispatcher`` runs work units as actor calls: a large unit in parts kept in flight, an executor that
uses a GPU queueing its next unit ahead."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from autohet.pool.dispatch import Completion, Dispatcher, Ready

__all__ = ["RayDispatcher"]


@dataclass
class _Unit:
    """A scheduler's work unit on one executor, run as executor-sized parts kept in flight."""

    executor: int
    start: int
    size: int
    submitted: float
    parts: list[tuple[int, int]]
    launched: int = 0
    done: int = 0
    compute_s: float = 0.0
    outputs: dict[int, Any] = field(default_factory=dict)


class RayDispatcher(Dispatcher):
    """Work units as actor calls; an actor that dies turns its units into failed Completions.

    A unit larger than its executor's ``max_unit_images`` is split into parts and up to ``depth``
    parts stay queued on the actor, and each call names the part after it, so a GPU queues that
    part before returning this one's outputs (no idle device between parts, no driver round trip)
    and no single call moves a huge output array.

    Across units (lookahead executors, once the driver allows it): the last part of an executor's
    last unit is held back while the driver may still queue a next unit, so that the call can name
    the next unit's first part; it is sent when the driver has decided (``_flush``) or when the
    next unit arrives. The device then runs from one unit into the next without waiting.
    """

    def __init__(self, names: list[str], actors: list[Any], max_unit: list[int] | None = None,
                 depth: int = 2, lookahead: list[bool] | None = None) -> None:
        super().__init__(names, lookahead)
        self.actors = actors
        self.max_unit = max_unit or [1 << 30] * len(actors)
        self.depth = depth
        self.refs: dict[Any, tuple[_Unit, int]] = {}
        self.units: dict[int, list[_Unit]] = {}  # per executor, in the order they run
        self.stale: dict[Any, int] = {}  # parts of failed units still in flight -> their executor: ignored
        self.failed: list[Completion] = []  # units queued behind a failed one, reported one by one
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _holding(self, executor: int) -> bool:
        return self.lookahead_on and self.lookahead[executor]

    def _launch(self, executor: int, release: bool = False) -> bool:
        """Sends the executor's next parts while fewer than ``depth`` are in flight; returns True
        when the last part of its last unit is held back for a next unit not yet decided."""
        units = self.units.get(executor, [])
        for k, unit in enumerate(units):
            while unit.launched < len(unit.parts):
                if sum(u.launched - u.done for u in units) >= self.depth:
                    return False
                last = unit.launched + 1 == len(unit.parts)
                if last and k + 1 == len(units) and self._holding(executor) and not release:
                    return True
                if not last:
                    following = unit.parts[unit.launched + 1]
                else:
                    following = units[k + 1].parts[0] if k + 1 < len(units) else None
                start, size = unit.parts[unit.launched]
                self.refs[self.actors[executor].run.remote(start, size, following)] = (unit, unit.launched)
                unit.launched += 1
        return False

    def _draining(self, executor: int) -> bool:
        units = self.units.get(executor, [])
        return len(units) == 1 and units[0].launched + 1 >= len(units[0].parts)

    def _flush(self) -> None:
        """The driver has had its chance to queue a next unit: an executor's held last part goes
        now, unless a unit ahead of it still runs (its completion gives the driver another chance)."""
        for executor, units in self.units.items():
            if len(units) == 1:
                self._launch(executor, release=True)

    def _submit(self, executor: int, start: int, size: int) -> None:
        step = max(1, self.max_unit[executor])
        parts = [(s, min(step, start + size - s)) for s in range(start, start + size, step)]
        self.units.setdefault(executor, []).append(_Unit(executor, start, size, self.now(), parts))
        self._launch(executor)

    def _fail(self, unit: _Unit, exc: Exception) -> Completion:
        """Drops every unit queued on the failed unit's executor: the first is returned, the rest
        are reported by the next waits, so each is re-dispatched."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        error = f"{type(exc).__name__}: {text[:200]}"
        units = self.units.pop(unit.executor, [unit])
        for r in [r for r, (u, _) in self.refs.items() if u.executor == unit.executor]:
            del self.refs[r]
            self.stale[r] = unit.executor
        self.failed += [Completion(u.executor, u.start, u.size, u.submitted, self.now(), 0.0, error=error)
                        for u in units if u is not unit]
        return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(), 0.0, error=error)

    def settle(self, seconds: float) -> list[int]:
        """Waits up to ``seconds`` for the parts already on the actors (at most ``depth`` each: the rest
        of a unit is never sent) and for each such actor to finish what it queued ahead (``drain``: a
        GPU's announced part, OpenVINO's started pieces). Names the executors not done by then, and
        those whose parts failed (a dead actor): they are to be replaced.

        One deadline for all, and each actor's drain is sent as soon as its own parts are back (a
        partition group's threaded actor may run a drain before a part sent earlier). Waiting for every
        actor's parts first left the drains no time where one executor's parts outlived the wait: a GPU
        done in milliseconds was replaced beside a busy CPU group (docs/why.md, pool/ray_dispatch.py)."""
        import ray

        deadline = time.perf_counter() + max(0.0, seconds)
        owner = {**{r: u.executor for r, (u, _) in self.refs.items()}, **self.stale}
        parts: dict[int, int] = {}
        for i in owner.values():
            parts[i] = parts.get(i, 0) + 1
        pending = dict(owner)
        drains: set[Any] = set()
        busy: set[int] = set()

        def drain(i: int) -> None:
            ref = self.actors[i].drain.remote()
            drains.add(ref)
            pending[ref] = i

        for i in sorted((set(owner.values()) | set(self.busy)) - set(parts)):
            drain(i)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.perf_counter()))
            if not ready:
                break
            ref = ready[0]
            i = pending.pop(ref)
            try:
                ray.get(ref)
            except Exception:  # failed, or its actor died: replaced
                busy.add(i)
            if ref not in drains:
                parts[i] -= 1
                if parts[i] == 0 and i not in busy:
                    drain(i)
        return sorted(busy | set(pending.values()))

    def _wait_any(self, timeout: float | None = None) -> Completion | Ready | None:
        import numpy as np
        import ray

        if self.failed:
            return self.failed.pop(0)
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            ready, _ = ray.wait(list(self.refs) + list(self.stale), num_returns=1, timeout=left)
            if not ready:
                return None
            ref = ready[0]
            if ref in self.stale:
                self.stale.pop(ref)
                continue
            unit, index = self.refs.pop(ref)
            try:
                outputs, compute_s = ray.get(ref)
            except Exception as exc:  # RayActorError when killed; any executor error fails the unit
                return self._fail(unit, exc)
            unit.done += 1
            unit.compute_s += compute_s
            if self.sink is not None:  # placed now, while the actor runs the unit's next parts
                self.sink(unit.parts[index][0], outputs)
            else:
                unit.outputs[index] = outputs
            if unit.done == len(unit.parts):
                units = self.units.get(unit.executor, [])
                if unit in units:
                    units.remove(unit)
                if not units:
                    self.units.pop(unit.executor, None)
                self._launch(unit.executor)
                if self.sink is not None:
                    return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(),
                                      unit.compute_s, delivered=True)
                parts = [unit.outputs[i] for i in range(len(unit.parts))]
                joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
                return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(), unit.compute_s,
                                  joined)
            if self._launch(unit.executor) and self._draining(unit.executor):
                return Ready(unit.executor)
