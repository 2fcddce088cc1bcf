"""How many images each executor takes: pure arithmetic over measured speeds (no torch, no clock).

``split_by_weights`` shares a count in proportion to weights (the schedulers' rule); ``even_finish_shares``
shares it so that every executor, given its speed and the work it has queued, ends at the same time (the
driver's cap on units, and a stream's split over its lanes: ``autohet.pool.lanes``).
"""

from __future__ import annotations

import math

__all__ = ["even_finish_shares", "split_by_weights"]


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
