"""The cores this process was given, whatever the calling thread is pinned to now.

Executors pin their own threads to their cores (a GPU's to its one feeding core). Work that should use
the whole process (a compile's workers, the host copy threads) asks for the cores noted before the
first pinning instead of the calling thread's affinity.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["copy_cores", "descendants", "note_feeder_cores", "note_process_cores", "own_threads",
           "pin_descendants", "process_cores"]

_PROCESS_CORES: frozenset[int] | None = None  # the cores of the first thread an executor pinned, before it did
_FEEDER_CORES: set[int] = set()  # the cores GPU executors of this process pinned their launching threads to


def note_process_cores() -> None:
    """Keeps the calling thread's cores as the process's, once: called before an executor first pins a
    thread (``executors.cpu.pin_thread``), when no thread of the process is pinned yet."""
    global _PROCESS_CORES
    if _PROCESS_CORES is None and hasattr(os, "sched_getaffinity"):
        _PROCESS_CORES = frozenset(os.sched_getaffinity(0))


def process_cores() -> frozenset[int]:
    """The cores this process was started on (a taskset or a container's cpuset): those noted before the
    first pinning, else the calling thread's own (nothing is pinned yet); all of the machine's where the
    platform cannot say."""
    if _PROCESS_CORES is not None:
        return _PROCESS_CORES
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def note_feeder_cores(cores: tuple[int, ...]) -> None:
    """Keeps ``cores`` for a GPU executor's own threads (its launches, the CUDA calls that keep the GPU
    fed): the host copy threads leave them (``copy_cores``)."""
    _FEEDER_CORES.update(cores)


def copy_cores() -> frozenset[int]:
    """The cores the host copy threads run on: the process's less the GPU feeders' (``note_feeder_cores``),
    all of them where that leaves none or ``AUTOHET_COPY_ON_FEEDERS=1``. Sixteen copy threads staging a
    float32 stream on all sixteen cores of the H200 box shared the GPU's feeding core with its launching
    thread; taken by turns on a box whose host bound the stream, the stream ran faster with the copies off
    that core (docs/why.md, platform/host_copy.py)."""
    from autohet.core.settings import env

    cores = process_cores()
    if env("AUTOHET_COPY_ON_FEEDERS") == "1":
        return cores
    left = cores - _FEEDER_CORES
    return left or cores


def own_threads(n: int) -> None:
    """Gives the calling thread an intra-op team of ``n`` threads that no other thread can change.

    ``torch.set_num_threads`` also stores a process-wide count, and a thread's first parallel op
    resets its team to that count (torch's lazy per-thread init). A CPU group's thread that set its
    count and then saw a GPU executor's thread set 1 (its feeder core) before its first op ran on one
    thread (docs/why.md, executors/cpu.py); each host copy thread, made after a CPU group had set
    its count, ran its copies on a team that large (``platform.host_copy``). Asking first runs that
    init now, so the count set after it stays this thread's."""
    import torch

    torch.get_num_threads()
    torch.set_num_threads(max(1, n))


def descendants(pid: int | None = None) -> list[int]:
    """The processes this one (or ``pid``) started, and theirs (Linux ``/proc``; none where unreadable)."""
    out: list[int] = []
    todo = [pid or os.getpid()]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += children
            todo += children
    return out


def pin_descendants(cores: frozenset[int]) -> None:
    """Moves the processes this one started onto ``cores`` (those that ended meanwhile are skipped):
    inductor's compile workers keep the affinity they were started with, so compiles ahead on other cores
    (``executors.compiled.compiling_on``) would otherwise reuse workers started on every core."""
    if not hasattr(os, "sched_setaffinity"):
        return
    for child in descendants():
        try:
            os.sched_setaffinity(child, cores)
        except OSError:
            continue
