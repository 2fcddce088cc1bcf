"""Large blocks kept in the process's heap once freed, so the next one of that size is not faulted in again.

glibc serves a block over its mmap threshold (128 KB at first, raised as such blocks are freed, to 32 MB at
most) with a fresh mapping and returns it to the kernel when it is freed; it also trims the heap's top
once more than its trim threshold is free. A process that receives one 10 MB message after another (a
gRPC ingress: grpcio hands each request over as a new ``bytes``) then pays a page fault for every 4 KB of
every message. Held in the heap, the blocks are reused: on the 2-core box a gRPC server's CPU per 9.6 MB
request fell from a median of 18.4 ms to 11.2 ms (``bench/grpc_ingress.py``, BENCHMARKS.md 35).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_large_blocks"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # what every glibc takes on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def keep_large_blocks(largest: int) -> bool:
    """Blocks up to ``largest`` bytes (at most 32 MB) come from the heap and stay there when freed, and
    the heap is trimmed only past 4x that; whether glibc took it (False elsewhere: another libc, another
    platform)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # musl has no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    threshold = max(128 << 10, min(int(largest), _MMAP_THRESHOLD_MAX))
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, 4 * threshold))
