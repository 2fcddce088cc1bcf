"""Large host-memory copies on several threads.

A stream's window is a gigabyte of images: copied into the runner's buffer and staged into a GPU's
pinned buffer in its precision once per call. On one thread those copies take several times the GPU's
run of the window (docs/why.md, platform/host_copy.py), and a thread's torch copies run on one thread
once an executor has set torch's thread count to its cores. Row chunks on a pool of plain threads,
each copying its chunk on a team of one (torch releases the interpreter lock while it copies), use the
cores of this process instead, less those its GPU executors feed their GPUs from
(``platform.cores.copy_cores``). A copy thread's team is its own: made by torch at its first copy, it
took the process-wide count of whichever executor had set one last, so a CPU group of eight cores
that loaded after the GPUs left sixteen copy threads of eight each on 30 cores (BENCHMARKS.md 49).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from autohet.core.settings import CHUNK_BYTES
from autohet.platform.cores import copy_cores, own_threads

__all__ = ["copy_parts", "copy_rows", "copy_threads"]

_POOL: ThreadPoolExecutor | None = None
_POOL_KEY: tuple[int, frozenset[int]] | None = None
_LOCK = threading.Lock()
MAX_THREADS = 16  # the default's cap: more staged faster alone but slowed two GPUs' stream (BENCHMARKS.md 34)


def _cores() -> frozenset[int]:
    """The process's cores less its GPU feeders' (``copy_cores``: executors pin their own threads, in a
    Ray actor its main thread among them)."""
    return copy_cores()


def _start_copy_thread(cores: frozenset[int]) -> None:
    """A pool thread on the copy cores (it inherits its creator's pinning: undone) with a team of one."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(threading.get_native_id(), cores)
    own_threads(1)


def copy_threads() -> int:
    """How many threads copy: ``AUTOHET_COPY_THREADS`` where set, else the process's cores up to
    ``MAX_THREADS``."""
    from autohet.core.settings import env

    wanted = env("AUTOHET_COPY_THREADS")
    if not wanted:
        return min(MAX_THREADS, len(_cores()))
    if not wanted.isdigit() or int(wanted) < 1:
        from autohet.core.errors import UserError

        raise UserError(f"AUTOHET_COPY_THREADS={wanted!r}: set a whole number of threads, 1 or more, or unset it")
    return int(wanted)


def _pool(threads: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_KEY
    key = (threads, _cores())
    with _LOCK:
        # a changed setting (a bench's A/B) or a GPU executor pinned since (its core left) gets a fresh pool
        if _POOL is None or key != _POOL_KEY:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL, _POOL_KEY = ThreadPoolExecutor(threads, thread_name_prefix="autohet-copy",
                                                  initializer=_start_copy_thread, initargs=(key[1],)), key
        return _POOL


def copy_rows(dst: Any, src: Any) -> None:
    """``dst.copy_(src)`` for torch tensors of the same first dimension (a dtype conversion included),
    split by rows over the copy threads when it is large."""
    copy_parts(dst, [src])


def copy_parts(dst: Any, parts: list[Any]) -> None:
    """The torch tensors ``parts`` one after another into ``dst`` (as many rows as they hold together,
    a dtype conversion included), every part's row chunks on the copy threads at once. A stream's
    window is a few batches of 150 MB each; copied part after part, each part got only the 4-5 threads
    its size gives; all at once, they use every copy thread (docs/why.md, platform/host_copy.py)."""
    if not parts:
        return
    row_bytes = max(1, (dst[:1].numel() * dst.element_size()))
    threads = copy_threads()
    chunks: list[tuple[int, int, Any, int, int]] = []  # dst rows [a, b) <- part rows [c, d)
    start = 0
    for part in parts:
        rows = int(part.shape[0])
        pieces = max(1, min(rows, threads, (rows * row_bytes) // CHUNK_BYTES)) if threads > 1 else 1
        for k in range(pieces):
            lo, hi = k * rows // pieces, (k + 1) * rows // pieces
            chunks.append((start + lo, start + hi, part, lo, hi))
        start += rows
    if len(chunks) == 1:
        a, b, part, c, d = chunks[0]
        dst[a:b].copy_(part[c:d])
        return
    pool = _pool(threads)
    futures = [pool.submit(lambda a=a, b=b, p=p, c=c, d=d: dst[a:b].copy_(p[c:d])) for a, b, p, c, d in chunks]
    for future in futures:
        future.result()
