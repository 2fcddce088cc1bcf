"""How the service shares a request's images between its replicas, by their measured speeds.

Each replica runs what is queued on it in order, at its own img/s, so the images already sent to
it and not answered (``pending``) finish after ``pending / speed`` seconds. A request's images go,
one chunk of at most the replica's batch at a time, to the replica where the chunk would finish
first. Under load every replica's queue grows in proportion to its speed (a CPU group next to a
GPU gets its share, not an equal one); a lone request goes to the replica that answers it soonest.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["share"]


def share(images: int, pending: Sequence[float], speeds: Sequence[float], batches: Sequence[int],
          skip: Collection[int] = ()) -> list[tuple[int, int]]:
    """(replica, images) chunks of a request of ``images``, in order, none larger than its replica's
    batch. ``skip``: replicas not to use (one that just failed), unless no other is left."""
    if not speeds or len(speeds) != len(pending) or len(speeds) != len(batches):
        raise ValueError("share needs one speed, one pending count and one batch per replica")
    usable = [i for i in range(len(speeds)) if i not in skip] or list(range(len(speeds)))
    queued = [float(p) for p in pending]
    chunks: list[tuple[int, int]] = []
    left = images
    while left > 0:
        best, size, soonest = usable[0], 0, float("inf")
        for i in usable:  # in index order: a tie goes to the first
            chunk = min(left, max(1, batches[i]))
            finish = (queued[i] + chunk) / max(speeds[i], 1e-9)
            if finish < soonest:
                best, size, soonest = i, chunk, finish
        chunks.append((best, size))
        queued[best] += size
        left -= size
    return chunks
