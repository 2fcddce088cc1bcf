"""The event loop shared by every data-parallel scheduler, and its fault handling.

A scheduler only decides sizes: ``assign(state, idle)`` returns (executor, images) pairs. The
driver hands out contiguous index ranges from a cursor, collects outputs in order, re-dispatches
the unit of an executor that died to the next idle live executor, and verifies exactly-once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from autohet.context import precision_of
from autohet.core.errors import RunTimeout, UserError
from autohet.core.measurement import ExecutorReport, Measurement, WorkUnit
from autohet.core.settings import RAISE_MARGIN
from autohet.planners.shares import even_finish_shares, split_by_weights
from autohet.pool.dispatch import Completion, Dispatcher, Ready

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.pool import Pool

__all__ = ["DriveResult", "SchedState", "Scheduler", "drive", "drive_measurement", "even_finish_shares",
           "limit_figures", "split_by_weights"]



class Scheduler(Protocol):
    """What the driver needs of a data-parallel strategy: its rule for sizing units."""

    name: str
    barrier: bool

    def begin(self, state: SchedState, params: dict[str, Any]) -> None: ...

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> list[tuple[int, int]]: ...


@dataclass
class SchedState:
    """What a scheduler may look at when it decides: counts, speeds, the last round's finish times."""

    total: int
    n: int
    remaining: int
    alive: list[bool]
    speeds: list[float | None]
    completed_units: list[int]
    batches: list[int] = field(default_factory=list)  # each executor's batch size
    now: float = 0.0
    round_index: int = 0
    round_start: float = 0.0
    round_finish: dict[int, float] = field(default_factory=dict)
    last_round_finish: dict[int, float] = field(default_factory=dict)
    memo: dict[str, Any] = field(default_factory=dict)

    def speed_weights(self, executors: list[int]) -> list[float]:
        """Measured speeds of ``executors``; the mean of known speeds stands in for unknown ones."""
        known = [s for s in self.speeds if s]
        fallback = sum(known) / len(known) if known else 1.0
        return [self.speeds[i] or fallback for i in executors]

    def fixed_size(self, executor: int, size: int, unit: str) -> int:
        """A scheduler's fixed size (a probe, a chunk) for one executor: ``size`` images (the seed's
        rule) or, with ``unit`` batches, ``size`` of that executor's batches, so devices hundreds of
        times apart in speed each get work of a similar duration."""
        if unit == "batches":
            return size * (self.batches[executor] if executor < len(self.batches) else 1)
        return size


@dataclass
class DriveResult:
    outputs: np.ndarray | None
    coverage: np.ndarray
    timeline: list[WorkUnit]
    wall_s: float
    images_by_executor: list[int]
    busy_by_executor: list[float]
    failures: list[str]
    died: list[bool]


def drive(strategy: Scheduler, params: dict[str, Any], dispatcher: Dispatcher, total: int,
          on_event: Callable[[Completion], None] | None = None, batches: list[int] | None = None,
          deadline_s: float | None = None, lookahead: bool = True,
          progress: Callable[[int, int], None] | None = None, hint: Callable[[], str] | None = None,
          alive: list[bool] | None = None) -> DriveResult:
    """Runs ``total`` images through the dispatcher under the strategy's rule; raises RunTimeout
    when ``deadline_s`` passes first (the busy executors are named so their actors can be replaced).
    ``alive``: executors known dead before the run (a served runner's earlier calls) get no work.

    With ``lookahead`` (strategies without a barrier), an executor the dispatcher lets queue a
    second unit is offered to the strategy again while its current unit drains, so its next unit
    is decided before the device runs dry.

    A unit of a strategy without a barrier is capped at its executor's share of an even finish
    (``even_finish_shares`` over the measured speeds and the work each has queued): fast_split's
    ``remaining * r * v_i / max(v)`` with r near 1 gave one of two equal CPU cores 70 of the last 71
    vgg16 images while the other idled (0.746 of the limit over 103 images; 0.938 with the cap).
    """
    run = _Drive(strategy, params, dispatcher, total, batches, alive)
    dispatcher.lookahead_on = lookahead and not strategy.barrier
    strategy.begin(run.st, params)
    dispatcher.sink = run.place
    t0 = dispatcher.now()
    while True:
        run.st.now = dispatcher.now() - t0
        run.requeue_failed()
        run.hand_out()
        if not dispatcher.busy:
            if run.st.remaining == 0 and not run.requeue:
                break
            run.stalled()
        left = None if deadline_s is None else deadline_s - (dispatcher.now() - t0)
        done = dispatcher.wait_any(max(0.0, left)) if left is not None else dispatcher.wait_any()
        if isinstance(done, Ready):
            continue
        if done is None:
            run.timed_out(deadline_s, hint)
        run.record(done, t0)
        if progress is not None and done.ok:
            progress(int(sum(run.images)), total)
        if on_event is not None:
            on_event(done)
    dispatcher.close()
    return DriveResult(run.outputs, run.coverage, run.timeline, dispatcher.now() - t0, run.images, run.busy,
                       run.failures, [not a for a in run.st.alive])


class _Drive:
    """One ``drive``'s state and its steps: failed units handed out again, new units sized by the
    strategy and capped for an even finish, completions recorded (outputs placed, speeds updated)."""

    def __init__(self, strategy: Scheduler, params: dict[str, Any], dispatcher: Dispatcher, total: int,
                 batches: list[int] | None, alive: list[bool] | None) -> None:
        n = len(dispatcher.names)
        self.strategy, self.params, self.dispatcher, self.total, self.n = strategy, params, dispatcher, total, n
        self.st = SchedState(total, n, total, list(alive or [True] * n), [None] * n, [0] * n, list(batches or [1] * n))
        if not any(self.st.alive):
            raise UserError("every executor of the pool has died; start the pool again")
        self.cursor = 0
        self.requeue: deque[tuple[int, int]] = deque()
        self.outputs: np.ndarray | None = None
        self.coverage = np.zeros(total, dtype=np.int32)
        self.timeline: list[WorkUnit] = []
        self.failures: list[str] = []
        self.images = [0] * n
        self.busy = [0.0] * n
        self.queued = [0] * n  # images submitted to each executor and not yet returned
        self.head_start = [0.0] * n  # when each executor's current unit began (it runs its queue in order)

    def submit(self, executor: int, start: int, size: int) -> None:
        if not self.queued[executor]:
            self.head_start[executor] = self.st.now
        self.queued[executor] += size
        self.dispatcher.submit(executor, start, size)

    def even_cap(self, executor: int) -> int | None:
        """The most images ``executor`` may take so that no executor finishes after the others (0:
        none now, a busy executor takes the rest later); None before any executor reported a speed."""
        st = self.st
        if self.strategy.barrier or not any(st.speeds):
            return None
        speeds = st.speed_weights(list(range(self.n)))  # an executor yet to report: the others' mean
        backlog = [max(0.0, self.queued[i] / s - (st.now - self.head_start[i])) if self.queued[i] else 0.0
                   for i, s in enumerate(speeds)]
        shares = even_finish_shares(st.remaining, list(speeds), backlog, st.alive)
        if shares is None:
            return None
        share = shares[executor]
        return math.ceil(share) if share >= 1 else (0 if any(self.queued) else 1)

    def place(self, start: int, rows: np.ndarray) -> None:
        if self.outputs is None:
            self.outputs = np.zeros((self.total, *rows.shape[1:]), dtype=np.float32)
        self.outputs[start : start + len(rows)] = rows

    def requeue_failed(self) -> None:
        """Failed units first, to any idle live executor."""
        for i in range(self.n):
            if self.requeue and self.st.alive[i] and i not in self.dispatcher.busy:
                start, size = self.requeue.popleft()
                self.submit(i, start, size)

    def hand_out(self) -> None:
        """New units while images remain and executors can take one (a barrier strategy: a round at a time)."""
        st, dispatcher, strategy = self.st, self.dispatcher, self.strategy
        offer = [i for i in range(self.n) if st.alive[i] and dispatcher.can_take(i)]
        while st.remaining > 0 and offer and not (strategy.barrier and dispatcher.busy):
            if strategy.barrier:
                st.round_index += 1
                st.last_round_finish = st.round_finish
                st.round_finish = {}
                st.round_start = st.now
            taken: list[int] = []
            for executor, size in strategy.assign(st, offer, self.params):
                size = min(int(size), st.remaining)
                if size <= 0:
                    continue
                if executor not in offer or executor in taken:
                    raise RuntimeError(f"{strategy.name} assigned to executor {executor}, which is not idle")
                cap = self.even_cap(executor)
                size = size if cap is None else min(size, cap)
                if size <= 0:
                    continue
                taken.append(executor)
                self.submit(executor, self.cursor, size)
                self.cursor += size
                st.remaining -= size
            # lookahead: an executor whose new unit is already draining is offered its next one
            offer = [i for i in taken if dispatcher.can_take(i)]

    def stalled(self) -> None:
        """Nothing in flight and work left: every executor dead, or a strategy that assigned nothing."""
        if not any(self.st.alive):
            raise UserError("every executor died before the work was done: " + "; ".join(self.failures))
        raise RuntimeError(f"{self.strategy.name} assigned no work with {self.st.remaining} images left")

    def timed_out(self, deadline_s: float | None, hint: Callable[[], str] | None) -> None:
        dispatcher = self.dispatcher
        busy = sorted(dispatcher.busy)
        dispatcher.close()
        advice = hint() if hint is not None else "narrow the search space"
        raise RunTimeout(f"{self.strategy.name} did not finish within {deadline_s:.0f} s ({int(self.coverage.sum())} "
                         f"of {self.total} images done; still busy: {', '.join(dispatcher.names[b] for b in busy)}); "
                         f"{advice}", busy, dispatcher.settle)

    def record(self, done: Completion, t0: float) -> None:
        """A completion: its outputs placed and counted, its executor's speed updated, or (a failure) its
        unit queued again and its executor marked dead."""
        st, i = self.st, done.executor
        st.now = done.done_s - t0
        self.queued[i] = max(0, self.queued[i] - done.size)
        self.head_start[i] = st.now
        self.timeline.append(WorkUnit(self.dispatcher.names[i], done.start, done.size, done.submitted_s - t0,
                                      done.done_s - t0, done.compute_s, done.ok))
        if not done.ok:
            st.alive[i] = False
            self.requeue.append((done.start, done.size))
            self.failures.append(f"executor {self.dispatcher.names[i]} died running images "
                                 f"{done.start}..{done.start + done.size - 1} ({done.error}); re-dispatched")
            return
        if not done.delivered:
            assert done.outputs is not None
            self.place(done.start, done.outputs)
        self.coverage[done.start : done.start + done.size] += 1
        self.images[i] += done.size
        self.busy[i] += done.compute_s
        if done.compute_s > 0:
            st.speeds[i] = done.size / done.compute_s
        st.completed_units[i] += 1
        if self.strategy.barrier:
            st.round_finish[i] = st.now - st.round_start


def limit_figures(standalone: list[float], result: DriveResult,
                  wall_timed: list[bool] | None = None) -> tuple[list[float], dict[int, tuple[float, float]]]:
    """Each executor's figure for the limit: its standalone throughput, or the speed it showed during
    this run (images / its busy seconds) where that is higher: an executor cannot beat its own
    standalone speed, so a lower standalone figure was measured wrong (a short measurement on a busy
    host). Only for executors whose busy seconds are wall time (``wall_timed``: CPU groups, simulated
    ones): a GPU's busy seconds are its kernels' time, which leaves out the host's share of a unit.
    Returns the figures and the raised ones as {executor: (standalone, run speed)}."""
    figures, raised = [], {}
    for i, v in enumerate(standalone):
        busy, images = result.busy_by_executor[i], result.images_by_executor[i]
        speed = images / busy if busy > 0 and images > 0 else 0.0
        if (wall_timed is None or wall_timed[i]) and speed > v * RAISE_MARGIN:
            raised[i] = (v, speed)
            v = speed
        figures.append(v)
    return figures, raised


def drive_measurement(ctx: RunContext, pool: Pool, strategy: str, params: dict[str, Any], result: DriveResult,
                      standalone: list[float]) -> Measurement:
    """A data-parallel run's Measurement: throughput against the limit (the summed standalone
    figures, see ``limit_figures``), per-executor figures, the output check."""
    ok, diff, tol, problems = ctx.check(result.outputs, result.coverage, precision_of(pool), pool.simulated)
    throughput = ctx.workload.images / result.wall_s if result.wall_s > 0 else 0.0
    figures, raised = limit_figures(standalone, result, [e.is_cpu or e.simulated for e in pool.spec.executors])
    limit = float(sum(figures))
    executors = [
        ExecutorReport(spec.name, spec.device, result.images_by_executor[i], result.busy_by_executor[i],
                       figures[i], spec.simulated, result.died[i])
        for i, spec in enumerate(pool.spec.executors)
    ]
    extra: dict[str, Any] = {"pool": pool.spec.to_dict()}
    if raised:
        extra["limit_raised"] = {pool.names[i]: {"standalone_ips": a, "run_ips": b} for i, (a, b) in raised.items()}
    return Measurement(
        model=ctx.model.name, strategy=strategy, params=params, images=ctx.workload.images,
        wall_s=result.wall_s, throughput_ips=throughput, limit_ips=limit,
        efficiency=throughput / limit if limit > 0 else 0.0, output_ok=ok, max_abs_diff=diff,
        tolerance=tol, executors=executors, timeline=result.timeline,
        failures=result.failures + problems, simulated=pool.simulated, extra=extra,
    )
