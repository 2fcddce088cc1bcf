"""The cores this process was given, whatever the calling thread is pinned to now.

Executors pin their own threads to their cores (a GPU's to its one feeding core). Work that should use
the whole process (a compile's workers, the host copy threads) asks for the cores noted before the
first pinning instead of the calling thread's affinity.
"""

from __future__ import annotations

import os

__all__ = ["copy_cores", "note_feeder_cores", "note_process_cores", "process_cores"]

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
