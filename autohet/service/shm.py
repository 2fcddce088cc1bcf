"""Request bodies handed from an ingress process to the replicas of its node through shared memory.

Why: on the H100 box the service carried 3.0-3.3 GB/s of 9.6 MB bodies while the ingress's HTTP server
alone carried 11.6 GB/s; each body was then put into Ray's object store on the ingress's event loop
and fetched by the replica (BENCHMARKS.md §21). Here the ingress's HTTP server reads an ``.npy`` body
straight into a file of its own under ``/dev/shm``; a replica on the same node is sent only where
the images lie in it (``ShmImages``: the file, offset, shape and dtype) and maps it; a replica on
another node is sent the array as before. The ingress removes the file once the request is
answered (a replica's mapping stays valid until it lets go of the images).

A body goes this way only where ``/dev/shm`` has room for it beside ``SHM_RESERVE`` (a container's
default ``/dev/shm`` is 64 MB: writing past it would kill the process with SIGBUS); otherwise it is
read into the ingress's own memory, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ShmBody", "ShmImages", "remove_stale", "shm_body"]

SHM_DIR = Path("/dev/shm")
SHM_RESERVE = 256 << 20  # bytes left free in /dev/shm for Ray's object store and others
PREFIX = "autohet-body-"
_serial = itertools.count()


@dataclass(frozen=True)
class ShmImages:
    """Where a chunk of a request's images lies: ``path`` (a file under /dev/shm), the byte ``offset`` of
    its first image, its ``shape`` and ``dtype``."""

    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    def open(self) -> np.ndarray:
        """The images, mapped (copy on write: the file is never changed; nothing is copied unless written)."""
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        count = int(np.prod(self.shape))
        return np.frombuffer(mapped, dtype=np.dtype(self.dtype), count=count, offset=self.offset).reshape(self.shape)


class ShmBody:
    """One request's body in a file under /dev/shm: ``view`` is where the HTTP server reads it into."""

    def __init__(self, size: int) -> None:
        self.path = str(SHM_DIR / f"{PREFIX}{os.getpid()}-{next(_serial)}")
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            self.mapped = mmap.mmap(fd, max(size, 1))
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        os.close(fd)
        self.view = memoryview(self.mapped)[:size]
        self.base = np.frombuffer(self.mapped, dtype=np.uint8).ctypes.data

    def locate(self, images: np.ndarray) -> ShmImages:
        """``images`` (a view of this body) as a reference a replica of this node opens."""
        offset = images.ctypes.data - self.base
        if not images.flags.c_contiguous or offset < 0 or offset + images.nbytes > len(self.view):
            raise ValueError("the images are not a contiguous view of this body")
        return ShmImages(self.path, offset, tuple(images.shape), images.dtype.str)

    def remove(self) -> None:
        """The file goes (mappings of it stay valid until their images are dropped); idempotent."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def shm_body(size: int) -> ShmBody | None:
    """A shared-memory body of ``size`` bytes, or None where /dev/shm lacks room (or is missing)."""
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < size + SHM_RESERVE:
        return None
    try:
        return ShmBody(size)
    except OSError:
        return None


def remove_stale() -> int:
    """Removes bodies left by ingress processes that died (their pid gone); how many."""
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
