"""A stream over several in-process executors: each executor runs its own continuous lane (issue 49).

Run window by window through the tuned scheduler, a stream of a GPU beside a CPU group ran far below its
tuned run (docs/why.md, pool/lanes.py): each window started the scheduler (its probes) again and ended on a
barrier where the GPU waited for the CPU group's last unit. Here a window's images are split once, in whole
batches, so that every executor ends its queue at the same time (``even_finish_shares`` over each lane's
speed, measured on its pieces so far, and the work it has queued; a lane whose one batch outlasts the
others' run of the window takes none of it), in pieces of at most a unit each (a stream's first pieces
from one batch up), and each executor runs its pieces back to back: its own feeder thread stages the next
piece while the current one runs, an asynchronous executor (a GPU) queues it before the current one is
collected. No executor waits for another at a window's end, and the speeds carry from window to window (a
stream's first piece on a lane is no sample; a lane priced out of ``STALE_WINDOWS`` windows and
``PROBE_GAP_BATCHES`` of its batches' seconds is given one batch, its speed measured again, ever more
seldom). A lane that runs dry takes the last waiting piece of a lane that would finish it later. A
window's outputs come back, in order, once every lane has run its pieces of it. A piece whose executor
fails is staged again on the fastest live lane.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autohet.core.errors import UserError
from autohet.core.settings import PIECES_AHEAD, PROBE_GAP_BATCHES, SPEED_PIECES, STALE_WINDOWS, WINDOWS_AHEAD, env
from autohet.planners.shares import batch_outlasts_window, even_finish_shares, whole_batch_shares

__all__ = ["LaneStats", "Lanes", "probe_due", "slice_parts"]

# A lane's collector polls a launched piece at this interval and collects it once it is done. Waited for
# in ``collect``, a GPU's event wait spins a core for the whole piece (CUDA spins while a process has
# fewer contexts than cores), a core the host's staging of the next pieces needs (docs/why.md,
# pool/lanes.py); ``stream_windows`` polls too.
READY_POLL_S = 0.0002


def slice_parts(parts: list[np.ndarray], start: int, count: int) -> list[np.ndarray]:
    """Rows [start, start + count) of the parts taken one after another, as views."""
    out, offset = [], 0
    for part in parts:
        lo, hi = max(start, offset), min(start + count, offset + len(part))
        if lo < hi:
            out.append(part[lo - offset : hi - offset])
        offset += len(part)
    return out


def probe_due(left_out: int, retries: int, idle_s: float, batch_s: float) -> bool:
    """Whether a lane left out of ``left_out`` windows in a row, for ``idle_s`` seconds, is given a batch to
    measure its speed again (its ``retries``-th): after ``STALE_WINDOWS`` windows and ``PROBE_GAP_BATCHES``
    of its batches (``batch_s`` seconds each at its best speed known), both doubled with each retry."""
    return left_out >= STALE_WINDOWS << retries and idle_s >= PROBE_GAP_BATCHES * batch_s * (1 << retries)


def _piece_size(left: int, most: int, batch: int) -> int:
    """The next piece of a lane's ``left`` images: all of them within ``most``, else whole batches, as
    many as the pieces ``left`` needs share evenly. Cut a unit at a time, a window's last piece was often
    a batch, and the unit after it waited for that batch's staging slot (docs/why.md, pool/lanes.py)."""
    if left <= most:
        return left
    pieces, batches = math.ceil(left / most), math.ceil(left / batch)
    return min(left, math.ceil(batches / pieces) * batch)


@dataclass
class LaneStats:
    """One lane's part of a stream, so a loss shows where it sits: its images; busy seconds (from a
    piece's start, or the end of the piece before it, to its collection); the seconds its feeder spent
    staging, its worker starting pieces, and the executor's own seconds on them (a GPU's events); when,
    in seconds from the stream's start, its first piece started and its last was collected (a late
    start, a tail). Counted afresh for each stream."""

    images: int = 0
    busy_s: float = 0.0
    pieces: int = 0
    stage_s: float = 0.0
    launch_s: float = 0.0
    device_s: float = 0.0
    first_start_s: float | None = None
    last_end_s: float | None = None


@dataclass
class _Window:
    parts: list[np.ndarray]
    images: int
    left: int
    stream: int  # the stream it belongs to (``Lanes.streams`` when it was read)
    outputs: np.ndarray | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _Lane:
    """One executor: its pieces staged in order by its feeder, started on its worker, collected in order
    on its collector."""

    def __init__(self, executor: Any, worker: Any, speed: float | None, alive: bool) -> None:
        from autohet.pool.worker import Worker

        self.executor, self.worker = executor, worker
        name = executor.spec.name
        self.feeder, self.collector = Worker(f"{name}-feed"), Worker(f"{name}-collect")
        # pieces it holds staged or running: an asynchronous executor queues the next before the current
        # one is collected; a synchronous one stages in no time, so one more held would only be a piece no
        # idle lane could take from it
        self.depth = PIECES_AHEAD if executor.launches_async else 1
        self.slots = threading.Semaphore(self.depth)
        self.queued = 0  # images assigned and not yet collected
        self.alive = alive
        self.free_at = 0.0  # when its last piece was collected
        self.started: deque[float] = deque()  # when each piece started and not yet collected was started
        self.waiting: deque[_Piece] = deque()  # pieces handed to its feeder whose staging has not begun
        # its next piece's most images: a batch at a stream's start, doubled each piece up to a unit, so
        # that the device starts after a batch's staging, not a unit's
        self.next_piece = executor.spec.max_unit_images
        self.recent: deque[tuple[int, float]] = deque(maxlen=SPEED_PIECES)
        self.prior = speed
        self.best = speed  # its fastest known: the call's figure or a piece's, for when to probe it
        self.given_at = time.perf_counter()  # when it was last given images
        self.stats = LaneStats()
        self.left_out = 0  # windows in a row it got no piece of, with nothing queued
        self.retries = 0  # the probes it was given (``STALE_WINDOWS``)

    @property
    def speed(self) -> float | None:
        images = sum(n for n, _ in self.recent)
        seconds = sum(s for _, s in self.recent)
        return images / seconds if seconds > 0 else self.prior

    def most(self, left: int) -> int:
        """Its next piece's most images, of ``left`` still to cut: ``next_piece``, and for a synchronous
        executor at most half of what is left (at least a batch), so that its last pieces are small
        enough for an idle lane to take (``Lanes._steal``); cut even, a 2-core box's CPU group ran a
        window's last pieces alone for 1.1 s while the other stood idle (docs/why.md, pool/lanes.py)."""
        if self.executor.launches_async:
            return self.next_piece
        batch = self.executor.spec.batch
        return min(self.next_piece, max(batch, math.ceil(left / 2 / batch) * batch))

    def backlog_s(self, speed: float | None, now: float) -> float:
        """Seconds of work it has queued, less what its running piece has done: counted whole, a piece
        near its end made a slow lane's next batch look as if it would end before this lane's queue."""
        if not speed:
            return 0.0
        running = now - max(self.started[0], self.free_at) if self.started else 0.0
        return max(0.0, self.queued / speed - running)

    def close(self) -> None:
        self.feeder.close(wait_s=2.0)
        self.collector.close(wait_s=2.0)


@dataclass(eq=False)  # a piece is itself: found by identity in a lane's waiting queue
class _Piece:
    """Images [start, start + count) of a window, for one lane."""

    window: _Window
    start: int
    count: int
    lane: _Lane
    probe: bool = False  # a batch given to measure a lane left out on its speed: its speed from now


class Lanes:
    """``run(windows)``: each window's outputs, in order (see the module doc). ``speeds``: each executor's
    images/s to start from (a call's); None where unknown (the others' mean)."""

    def __init__(self, executors: list[Any], workers: list[Any], speeds: list[float | None],
                 alive: list[bool] | None = None) -> None:
        self.lanes = [_Lane(ex, w, v, up) for ex, w, v, up in
                      zip(executors, workers, speeds, alive or [True] * len(executors), strict=True)]
        self.deaths: list[str] = []
        self._changed = threading.Condition()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._began = 0.0  # the current stream's start (perf_counter)
        self.streams = 0  # streams run so far: the current one's number
        self.stage_s = 0.0
        self.classes = 0  # the outputs' width, once a piece came back

    def stats(self) -> dict[str, LaneStats]:
        return {lane.executor.spec.name: lane.stats for lane in self.lanes}

    @property
    def alive(self) -> list[bool]:
        return [lane.alive for lane in self.lanes]

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()

    # --- the consumer's side --------------------------------------------------------------------------

    def run(self, windows: Iterable[list[np.ndarray]]) -> Iterator[np.ndarray]:
        order: deque[_Window] = deque()
        self.streams += 1  # first: a piece of the last stream staged late sees it ended
        self._stop.clear()
        self._error = None
        self._began = time.perf_counter()
        ramp = env("AUTOHET_PIECE_RAMP") != "0"
        for lane in self.lanes:  # each stream's own figures (the speeds carry over)
            lane.stats = LaneStats()
            spec = lane.executor.spec
            lane.next_piece = spec.batch if ramp else spec.max_unit_images
        splitter = threading.Thread(target=self._split_all, args=(iter(windows), order), daemon=True,
                                    name="autohet-stage-lanes")
        splitter.start()
        try:
            while True:
                with self._changed:
                    while self._error is None and not (order and order[0].done.is_set()) and (
                            splitter.is_alive() or order):
                        self._changed.wait(0.05)
                    if self._error is not None:
                        raise self._error
                    if not order:
                        return
                    window = order.popleft()
                    self._changed.notify_all()
                assert window.outputs is not None
                yield window.outputs
        finally:
            self._stop.set()
            splitter.join()
            self._settle()

    # --- the splitter, the feeders, the collectors ----------------------------------------------------

    def _split_all(self, source: Iterator[list[np.ndarray]], order: deque[_Window]) -> None:
        """Reads the windows, each split into pieces handed to the lanes' feeders, at most WINDOWS_AHEAD
        ahead of the consumer."""
        try:
            for parts in source:
                with self._changed:
                    while len(order) >= WINDOWS_AHEAD and not self._stop.is_set() and self._error is None:
                        self._changed.wait(0.05)
                if self._stop.is_set() or self._error is not None:
                    return
                images = sum(len(p) for p in parts)
                window = _Window(parts, images, images, self.streams)
                with self._changed:
                    order.append(window)
                if images == 0:
                    window.outputs = np.zeros((0, self.classes), dtype=np.float32)
                    self._finished(window)
                    continue
                for piece in self._split(window):
                    self._feed(piece)
        except BaseException as exc:  # the source's error (a bad batch) or every lane dead: to the consumer
            self._fail_stream(exc)

    def _split(self, window: _Window) -> list[_Piece]:
        """The window's pieces, sized for an even finish of every live lane over the work queued (a lane
        whose one batch outlasts the others' run of the window takes none: ``batch_outlasts_window``)."""
        with self._changed:
            live = [lane for lane in self.lanes if lane.alive]
            if not live:
                raise UserError("every executor died before the work was done: " + "; ".join(self.deaths))
            known = [lane.speed for lane in live if lane.speed]
            fallback = sum(known) / len(known) if known else 1.0
            speeds = [(lane.speed or fallback) if lane.alive else None for lane in self.lanes]
            batches = [lane.executor.spec.batch for lane in self.lanes]
            slow = batch_outlasts_window(window.images, speeds, batches)
            speeds = [None if too_slow else v for v, too_slow in zip(speeds, slow, strict=True)]
            now = time.perf_counter()
            backlog = [lane.backlog_s(s, now) for lane, s in zip(self.lanes, speeds, strict=True)]
            shares = even_finish_shares(window.images, speeds, backlog, [v is not None for v in speeds])
        assert shares is not None
        counts = whole_batch_shares(shares, batches, window.images, speeds, backlog)
        probes = set()
        with self._changed:
            for k, (lane, count) in enumerate(zip(self.lanes, counts, strict=True)):
                lane.left_out = lane.left_out + 1 if count == 0 and lane.queued == 0 else 0
                if count:
                    lane.given_at = now
                batch_s = batches[k] / (lane.best or lane.speed or fallback)
                if lane.alive and probe_due(lane.left_out, lane.retries, now - lane.given_at, batch_s):
                    # its speed may be a stall's
                    donor = max(range(len(counts)), key=counts.__getitem__)
                    moved = min(lane.executor.spec.batch, counts[donor])
                    counts[donor] -= moved
                    counts[k] += moved
                    probes.add(k)
                    lane.left_out, lane.retries, lane.given_at = 0, lane.retries + 1, now
        pieces, start = [], 0
        for k, (lane, count) in enumerate(zip(self.lanes, counts, strict=True)):
            taken = 0
            while taken < count:  # a unit a piece at most: a lane runs one while the next stages
                size = _piece_size(count - taken, lane.most(count - taken), lane.executor.spec.batch)
                pieces.append(_Piece(window, start + taken, size, lane, probe=k in probes))
                taken += size
                lane.next_piece = min(lane.executor.spec.max_unit_images, 2 * lane.next_piece)
            start += count
        return pieces

    def _feed(self, piece: _Piece) -> None:
        with self._changed:
            piece.lane.queued += piece.count
            piece.lane.waiting.append(piece)
        piece.lane.feeder.submit(lambda: self._stage(piece))

    def _claim(self, piece: _Piece) -> bool:
        """Takes the piece off its lane's waiting queue (under ``_changed``): False if another lane took it."""
        waiting = piece.lane.waiting
        for k, other in enumerate(waiting):
            if other is piece:
                del waiting[k]
                return True
        return False

    def _steal(self, thief: _Lane) -> None:
        """A lane with nothing queued takes the last waiting piece of another lane, where it would finish it
        before that lane would: the split's speeds are estimates, and a window's last pieces on a lane that
        ran slower than its estimate held the stream's end while the others stood idle."""
        with self._changed:
            if self._stop.is_set() or not thief.alive or thief.queued:
                return
            now, best, gain = time.perf_counter(), None, 0.0
            for victim in self.lanes:
                if victim is thief or not victim.waiting:
                    continue
                piece = victim.waiting[-1]
                if piece.count > thief.executor.spec.max_unit_images:
                    continue  # past its staging buffers' size
                mine = piece.count / (thief.speed or victim.speed or 1.0)
                theirs = victim.backlog_s(victim.speed or thief.speed or 1.0, now)
                if theirs - mine > gain:
                    best, gain = victim, theirs - mine
            if best is None:
                return
            piece = best.waiting.pop()
            best.queued -= piece.count
        self._feed(replace(piece, lane=thief, probe=False))

    def _stage(self, piece: _Piece) -> None:
        """On the lane's feeder: the piece staged once the lane has room, then started on its worker."""
        lane = piece.lane
        while not lane.slots.acquire(timeout=0.05):
            if self._stop.is_set():
                return self._unqueue(piece)
        with self._changed:
            if not self._claim(piece):  # another lane took it while it waited for a slot
                lane.slots.release()
                return None
        # a piece of a stream that ended (one taken from another lane as it closed) is dropped
        ended = self._stop.is_set() or piece.window.stream != self.streams
        if ended or not lane.alive:  # a dead lane's pieces run elsewhere
            lane.slots.release()
            return self._unqueue(piece, True) if ended else self._failed(lane, piece, None)
        t0 = time.perf_counter()
        try:
            staged = lane.executor.stage_piece(slice_parts(piece.window.parts, piece.start, piece.count))
        except Exception as exc:  # noqa: BLE001 - a failed staging is the lane's failure
            lane.slots.release()
            return self._failed(lane, piece, exc)
        staging = time.perf_counter() - t0
        with self._changed:
            self.stage_s += staging
            lane.stats.stage_s += staging
        lane.worker.submit(lambda: self._launch(piece, staged))
        return None

    def _launch(self, piece: _Piece, staged: Any) -> None:
        """On the lane's worker: the piece started (a synchronous executor runs it here), then collected
        on the lane's collector."""
        lane, started = piece.lane, time.perf_counter()
        with self._changed:
            lane.started.append(started)
        try:
            handle = lane.executor.launch_staged(staged, piece.start, piece.count)
        except Exception as exc:  # noqa: BLE001
            return self._done(piece, None, started, exc)
        launched = time.perf_counter() - started

        def collect() -> None:
            try:
                while not lane.executor.ready(handle):  # see READY_POLL_S
                    time.sleep(READY_POLL_S)
                result = lane.executor.collect(handle)
            except Exception as exc:  # noqa: BLE001
                return self._done(piece, None, started, exc)
            return self._done(piece, result.outputs, started, None, launched, result.compute_s)

        lane.collector.submit(collect)
        return None

    def _done(self, piece: _Piece, outputs: np.ndarray | None, started: float, error: Exception | None,
              launch_s: float = 0.0, device_s: float = 0.0) -> None:
        lane, now = piece.lane, time.perf_counter()
        lane.slots.release()
        with self._changed:
            lane.started.popleft()
        if error is not None or outputs is None:
            return self._failed(lane, piece, error)
        window = piece.window
        with self._changed:
            lane.queued -= piece.count
            busy = now - max(started, lane.free_at)
            lane.free_at = now
            if piece.probe:  # the lane's old speed left it out: this is its speed now
                lane.recent.clear()
                lane.recent.append((piece.count, busy))
            elif lane.stats.pieces:  # a stream's first piece pays what the stream meets once (buffers, warm-up)
                lane.recent.append((piece.count, busy))
            if busy > 0 and (piece.probe or lane.stats.pieces):
                lane.best = max(lane.best or 0.0, piece.count / busy)
            lane.stats.images += piece.count
            lane.stats.busy_s += busy
            lane.stats.pieces += 1
            lane.stats.launch_s += launch_s
            lane.stats.device_s += device_s
            if lane.stats.first_start_s is None:
                lane.stats.first_start_s = started - self._began
            lane.stats.last_end_s = now - self._began
            self.classes = int(outputs.shape[1]) if outputs.ndim > 1 else 0
            if window.outputs is None:
                window.outputs = np.empty((window.images, *outputs.shape[1:]), dtype=np.float32)
        window.outputs[piece.start : piece.start + piece.count] = outputs
        with self._changed:
            window.left -= piece.count
            if window.left == 0:
                self._finished(window)
        if not lane.queued:
            self._steal(lane)
        return None

    def _finished(self, window: _Window) -> None:
        with self._changed:
            window.done.set()
            window.parts = []
            self._changed.notify_all()

    def _unqueue(self, piece: _Piece, claimed: bool = False) -> None:
        with self._changed:
            if claimed or self._claim(piece):
                piece.lane.queued -= piece.count

    def _failed(self, lane: _Lane, piece: _Piece, error: BaseException | None) -> None:
        """The lane is dead (an error running or staging a piece): the piece goes to the fastest live lane."""
        with self._changed:
            lane.queued -= piece.count
            if lane.alive:
                lane.alive = False
                self.deaths.append(f"executor {lane.executor.spec.name} failed running a stream piece "
                                   f"({type(error).__name__}: {error}); its pieces re-run on the others")
            live = [other for other in self.lanes if other.alive]
        if self._stop.is_set():
            return
        if not live:
            self._fail_stream(UserError("every executor died before the work was done: " + "; ".join(self.deaths)))
            return
        self._feed(replace(piece, lane=max(live, key=lambda other: other.speed or 0.0)))

    def _fail_stream(self, exc: BaseException) -> None:
        with self._changed:
            self._error = self._error or exc
            self._changed.notify_all()

    def _settle(self) -> None:
        """Waits for every piece still staged or running (a stream closed early): their rows are read in
        place until then. A feeder's staging of a piece not yet started returns at once (``_stop``)."""
        for lane in self.lanes:
            lane.feeder.call(lambda: None)  # its queued pieces have seen the stop
            for _ in range(lane.depth):
                lane.slots.acquire(timeout=120)
            for _ in range(lane.depth):
                lane.slots.release()
