"""How many images each executor takes: pure arithmetic over measured speeds (no torch, no clock).

``split_by_weights`` shares a count in proportion to weights (the schedulers' rule); ``even_finish_shares``
shares it so that every executor, given its speed and the work it has queued, ends at the same time (the
driver's cap on units, and a stream's split over its lanes: ``autohet.pool.lanes``); ``whole_batch_shares``
rounds such shares to whole batches without making anyone finish later than it must;
``batch_outlasts_window`` names the executors too slow to take any.
"""

from __future__ import annotations

import math

__all__ = ["batch_outlasts_window", "even_finish_shares", "split_by_weights", "whole_batch_shares"]


def split_by_weights(total: int, weights: list[float]) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder, sums exactly)."""
    if total <= 0 or not weights:
        return [0] * len(weights)
    clean = [w if (w is not None and w > 0 and math.isfinite(w)) else 0.0 for w in weights]
    if sum(clean) <= 0:
        clean = [1.0] * len(weights)
    scale = total / sum(clean)
    raw = [w * scale for w in clean]
    shares = [int(math.floor(x)) for x in raw]
    left = total - sum(shares)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - shares[i]), i))
    for i in order[:left]:
        shares[i] += 1
    return shares


def even_finish_shares(remaining: int, speeds: list[float | None], backlog_s: list[float],
                       alive: list[bool]) -> list[float] | None:
    """Each executor's images of ``remaining`` such that all finish together (water filling: an
    executor busy for ``backlog_s`` more seconds joins later); None while a live speed is unknown."""
    live = [i for i, a in enumerate(alive) if a]
    if not live or any(not speeds[i] or speeds[i] <= 0 for i in live):  # type: ignore[operator]
        return None
    order = sorted(live, key=lambda i: backlog_s[i])
    rate = 0.0   # images/s of the executors already working at the candidate finish time
    work = 0.0   # images those executors would do between their backlog's end and the candidate time
    finish = backlog_s[order[0]]
    for k, i in enumerate(order):
        rate += speeds[i]  # type: ignore[operator]
        work -= speeds[i] * backlog_s[i]  # type: ignore[operator]
        finish = (remaining - work) / rate
        if k + 1 == len(order) or finish <= backlog_s[order[k + 1]]:
            break
    return [speeds[i] * max(0.0, finish - backlog_s[i]) if alive[i] else 0.0  # type: ignore[operator]
            for i in range(len(alive))]


def whole_batch_shares(shares: list[float], batches: list[int], total: int, speeds: list[float | None],
                       backlog_s: list[float]) -> list[int]:
    """``shares`` (images each, summing to ``total``) rounded to whole batches of each executor: each
    gets its share's whole batches, then the images left go a batch at a time to whoever would finish
    its queue earliest with it (its backlog, then its images at its speed); only the last of them may be
    a partial batch. Given by deficit instead, a slow executor's one batch outlasted a fast one's whole
    window: a 15-core CPU group's 16 images took 0.1 s beside a GPU's 0.04 s window (docs/why.md,
    pool/lanes.py)."""
    out = [int(math.floor(s / b)) * b if s > 0 else 0 for s, b in zip(shares, batches, strict=True)]
    left = total - sum(out)
    while left > 0:
        takes = [min(b, left) for b in batches]
        finish = [backlog_s[k] + (out[k] + takes[k]) / speed if speed and speed > 0 else math.inf
                  for k, speed in enumerate(speeds)]
        i = min(range(len(out)), key=lambda k: (finish[k], k))
        out[i] += takes[i]
        left -= takes[i]
    return out


def batch_outlasts_window(images: int, speeds: list[float | None], batches: list[int]) -> list[bool]:
    """For each executor (None: dead), whether one batch of it lasts longer than the others' run of all
    ``images`` together; never the fastest. Such a batch holds its window open while the others run
    ahead, and gains less than the stalls it costs: a 15-core CPU group's 16 images took 0.1-0.2 s beside
    a GPU's 0.04 s windows, and streams where it took a batch ran at 0.71-0.80 of the GPU's run, 0.94 where
    it took none (BENCHMARKS.md 37)."""
    live = [v for v in speeds if v]
    fastest = max(live, default=0.0)
    out = []
    for speed, batch in zip(speeds, batches, strict=True):
        others = sum(live) - (speed or 0.0)
        out.append(bool(speed) and speed < fastest and others > 0 and batch / speed > images / others)
    return out
