"""Request bodies handed from an ingress process to the replicas of its node through shared memory.

Why: the service carried request bodies at a fraction of what the ingress's HTTP server alone
carried; each body was then put into Ray's object store on the ingress's event loop and fetched by
the replica (docs/why.md, service/shm.py). Here the ingress's HTTP server reads an ``.npy`` body
straight into a file of its own under ``/dev/shm``; a replica on the same node is sent only where
the images lie in it (``ShmImages``: the file, offset, shape and dtype) and maps it; a replica on
another node is sent the array as before. The ingress removes the file once the request is
answered, or keeps it for the next body once it was answered in full (``BodyPool``: a fresh file per
request paid a page fault and the zeroing of each 4 KiB page in the ingress's event loop); a body whose
request failed or timed out is removed, not kept, since a replica may still be reading it. A replica
keeps its mappings too (shared and writable, so that pinning one for a GPU's copy in place never makes
a private, stale copy of a page; nothing writes them). The driver removes its service's bodies when
it stops; a service killed outright leaves them under /dev/shm (``autohet-body-*``).

A body goes this way only where ``/dev/shm`` has room for it beside ``SHM_RESERVE`` and its pages can
be allocated up front (``posix_fallocate``: a container's default ``/dev/shm`` is 64 MB, and writing
past a full tmpfs would kill the process with SIGBUS); otherwise it is read into the ingress's own
memory, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["BodyPool", "ShmBody", "ShmImages", "pin_mappings", "remove_service", "shm_body"]

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
        """The images: a live view of the body's file (nothing copied; the replica does not write it).
        The mapping counts it (and every view of it) as in use until it is dropped."""
        entry = _mapped(self.path)
        count = int(np.prod(self.shape))
        root = np.frombuffer(entry.mapped, dtype=np.dtype(self.dtype), count=count, offset=self.offset)
        with _MAPS_LOCK:
            entry.images += 1
        weakref.finalize(root, _dropped, entry)  # the root of every view: gone when the last one is
        return root.reshape(self.shape)


class ShmBody:
    """One request's body in a file under /dev/shm: ``view`` is where the HTTP server reads it into."""

    def __init__(self, size: int, service: str = "") -> None:
        self.path = str(SHM_DIR / f"{PREFIX}{os.getpid()}-{service}-{next(_serial)}")
        self.capacity = max(size, 1)
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.capacity)  # ENOSPC here, not SIGBUS at a write
            self.mapped = mmap.mmap(fd, self.capacity)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        os.close(fd)
        self.base = np.frombuffer(self.mapped, dtype=np.uint8).ctypes.data
        self.use(size)

    def use(self, size: int) -> None:
        """The next body, of ``size`` bytes (at most ``capacity``), goes at the start of the file."""
        self.view = memoryview(self.mapped)[:size]

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


class BodyPool:
    """Bodies kept for the next requests (at most ``keep``): their pages stay allocated in /dev/shm."""

    def __init__(self, keep: int, service: str = "") -> None:
        self.keep, self.service = keep, service
        self.free: list[ShmBody] = []

    def take(self, size: int) -> ShmBody | None:
        """The smallest kept body that holds ``size`` bytes, else a new one (None: no room in /dev/shm)."""
        fits = [b for b in self.free if b.capacity >= size]
        if not fits:
            return shm_body(size, self.service)
        body = min(fits, key=lambda b: b.capacity)
        self.free.remove(body)
        if not os.path.exists(body.path):  # removed from outside: its mappings would not find it
            return self.take(size)
        body.use(size)
        return body

    def give_back(self, body: ShmBody) -> None:
        if len(self.free) < self.keep:
            self.free.append(body)
        else:
            body.remove()

    def close(self) -> None:
        while self.free:
            self.free.pop().remove()


@dataclass
class _Mapping:
    """A body file as a replica maps it: the file's identity (inode, size), the mapping, and its
    address where it is page-locked for a GPU (``pin_mappings``)."""

    inode: int
    size: int
    mapped: mmap.mmap
    pinned_at: int | None = None
    unpin: Callable[[int], None] | None = None
    images: int = 0  # arrays opened from it and not yet dropped (``ShmImages.open``)


class _Pinning(NamedTuple):
    register: Callable[[int, int], bool]  # (address, bytes) -> whether it is page-locked now
    unregister: Callable[[int], None]


_MAPS: OrderedDict[str, _Mapping] = OrderedDict()
_RETIRED: list[_Mapping] = []  # pinned mappings dropped while images of them may still be in use
_MAPS_LOCK = threading.RLock()  # re-entered where an image is dropped (a finalizer) under it
_PINNING: _Pinning | None = None
MAPS_KEPT = 128  # a replica's mappings of bodies, most recent first (7 ingresses keep 18 bodies each by default)


def pin_mappings(register: Callable[[int, int], bool] | None, unregister: Callable[[int], None] | None = None) -> None:
    """From now on this process's mappings of bodies are page-locked (``register(address, bytes)``), so
    that a GPU copies their images in place, with no staging copy; None: no more. A pinned mapping
    dropped (its file removed or replaced, or past ``MAPS_KEPT``) is unregistered once no image of it is
    left (a window may still be copying them), then unmapped."""
    global _PINNING
    with _MAPS_LOCK:
        _PINNING = None if register is None or unregister is None else _Pinning(register, unregister)


def _mapped(path: str) -> _Mapping:
    """``path`` mapped, the mapping kept while the file is the same (its inode and size). A replica
    opens bodies from Serve's event loop and from its channel's thread."""
    with _MAPS_LOCK, open(path, "r+b") as f:
        _release_retired()
        stat = os.fstat(f.fileno())
        kept = _MAPS.get(path)
        if kept is not None and (kept.inode, kept.size) == (stat.st_ino, stat.st_size):
            _MAPS.move_to_end(path)
            return kept
        entry = _Mapping(stat.st_ino, stat.st_size, mmap.mmap(f.fileno(), 0))  # shared: never copied aside
        if _PINNING is not None:
            view = np.frombuffer(entry.mapped, dtype=np.uint8)
            address = view.ctypes.data
            del view
            if _PINNING.register(address, len(entry.mapped)):
                entry.pinned_at, entry.unpin = address, _PINNING.unregister
        if kept is not None:
            _retire(kept)
        for gone in [p for p in _MAPS if not os.path.exists(p)]:  # removed bodies' memory is let go
            _retire(_MAPS.pop(gone))
        _MAPS[path] = entry
        if len(_MAPS) > MAPS_KEPT:
            _retire(_MAPS.popitem(last=False)[1])
        return entry


def _retire(entry: _Mapping) -> None:
    """A mapping no longer kept: unmapped once its images are dropped (pinned: unregistered first)."""
    if entry.pinned_at is not None:
        _RETIRED.append(entry)
        _release_retired()


def _release_retired() -> None:
    """Retired pinned mappings with no image left: unregistered, then unmapped."""
    for entry in list(_RETIRED):
        if entry.images:
            continue
        _RETIRED.remove(entry)
        if entry.unpin is not None and entry.pinned_at is not None:
            entry.unpin(entry.pinned_at)
        entry.pinned_at = entry.unpin = None
        with contextlib.suppress(BufferError):  # a view not opened here: unmapped once it is dropped
            entry.mapped.close()


def _dropped(entry: _Mapping) -> None:
    with _MAPS_LOCK:
        entry.images -= 1


def shm_body(size: int, service: str = "") -> ShmBody | None:
    """A shared-memory body of ``size`` bytes, or None where /dev/shm lacks room (or is missing)."""
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < size + SHM_RESERVE:
        return None
    try:
        return ShmBody(size, service)
    except OSError:
        return None


def remove_service(service: str) -> int:
    """Removes every body of the service ``service`` names (its driver's, once its ingresses are gone)."""
    removed = 0
    if service:
        for path in SHM_DIR.glob(f"{PREFIX}*-{service}-*"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed
