"""The cores this process was given, whatever the calling thread is pinned to now.

Executors pin their own threads to their cores (a GPU's to its one feeding core). Work that should use
the whole process (a compile's workers, the host copy threads) asks for the cores noted before the
first pinning instead of the calling thread's affinity.
"""

from __future__ import annotations

import os

__all__ = ["note_process_cores", "process_cores"]

_PROCESS_CORES: frozenset[int] | None = None  # the cores of the first thread an executor pinned, before it did


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
