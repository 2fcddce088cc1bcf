"""GPU partitions: disjoint sets of a GPU's SMs as CUDA green contexts, each with its own stream.

``torch.cuda.green_contexts.GreenContext.create(n)`` always takes the first ``n`` SMs of the GPU,
so two of them overlap. Two partitions that compute side by side need one split of the device's
SM resource into disjoint groups, which this module does through the CUDA driver API (ctypes on
libcuda, CUDA 12.4+: cuDevSmResourceSplitByCount, cuGreenCtxCreate, cuGreenCtxStreamCreate).
Work queued on a partition's stream runs on that partition's SMs only. Partitions of one GPU
must live in one process: kernels of different processes time-slice a GPU instead of sharing it.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from autohet.core.errors import UserError

__all__ = ["Partition", "equal_share", "sm_partitions"]

_SM = 1  # CU_DEV_RESOURCE_TYPE_SM
_GREEN_CTX_DEFAULT_STREAM = 1
_STREAM_NON_BLOCKING = 1
_FIX = "drop sms: from the pool (whole GPUs need no green contexts)"


class _Resource(ctypes.Structure):
    """CUdevResource (cuda.h, RESOURCE_ABI_VERSION 1: 144 bytes, the SM fields at offset 96)."""

    _fields_ = [("type", ctypes.c_int), ("_internal", ctypes.c_ubyte * 92), ("sm_count", ctypes.c_uint),
                ("min_partition", ctypes.c_uint), ("coscheduled_alignment", ctypes.c_uint),
                ("_oversize", ctypes.c_ubyte * 36)]


assert ctypes.sizeof(_Resource) == 144


@dataclass
class Partition:
    """One green context: its actual SM count (rounded up by the driver), its stream."""

    device: int
    sms: int
    stream: Any
    context: ctypes.c_void_p


_CACHE: dict[tuple[int, tuple[int, ...]], list[Partition]] = {}
_LOCK = threading.Lock()


def _driver() -> Any:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise UserError(f"GPU partitions need the CUDA driver (libcuda.so.1 not found); {_FIX}") from None


def _call(lib: Any, name: str, *args: Any) -> None:
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise UserError(f"this CUDA driver has no {name} (green contexts need CUDA 12.4+); {_FIX}") from None
    code = fn(*args)
    if code != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(code, ctypes.byref(text))
        message = text.value.decode() if text.value else f"error {code}"
        raise UserError(f"{name} failed: {message}; {_FIX} or choose another SM count")


def sm_partitions(device: int, counts: tuple[int, ...] | list[int]) -> list[Partition]:
    """Disjoint partitions of GPU ``device`` with at least ``counts[k]`` SMs each (one split of
    the device, cached per (device, counts): asking again gives the same partitions)."""
    import torch

    counts = tuple(int(c) for c in counts)
    if not counts or min(counts) < 1:
        raise UserError(f"SM counts must be positive, got {list(counts)}")
    key = (device, counts)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        lib, dev, full = _device_sms(device)
        if sum(counts) > full.sm_count:
            raise UserError(f"GPU {device} has {full.sm_count} SMs; partitions of {list(counts)} SMs do not fit "
                            "(their sum must not exceed it)")
        groups = _split(lib, full, counts, device)
        out = []
        for group in groups:
            desc, ctx, stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
            _call(lib, "cuDevResourceGenerateDesc", ctypes.byref(desc), ctypes.byref(group), 1)
            _call(lib, "cuGreenCtxCreate", ctypes.byref(ctx), desc, dev, _GREEN_CTX_DEFAULT_STREAM)
            _call(lib, "cuGreenCtxStreamCreate", ctypes.byref(stream), ctx, _STREAM_NON_BLOCKING, 0)
            torch_stream = torch.cuda.ExternalStream(stream.value, device=torch.device("cuda", device))
            out.append(Partition(device, int(group.sm_count), torch_stream, ctx))
        _CACHE[key] = out
        return out


def _device_sms(device: int) -> tuple[Any, ctypes.c_int, _Resource]:
    """(libcuda, the device handle, its whole SM resource)."""
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"sms: needs a CUDA GPU and torch sees none; {_FIX}")
    torch.cuda.init()
    torch.empty(1, device=torch.device("cuda", device))  # the primary context the partitions derive from
    lib = _driver()
    dev = ctypes.c_int()
    _call(lib, "cuDeviceGet", ctypes.byref(dev), device)
    full = _Resource()
    _call(lib, "cuDeviceGetDevResource", dev, ctypes.byref(full), _SM)
    return lib, dev, full


def _groups_of(lib: Any, full: _Resource, parts: int, n: int) -> int:
    """How many groups of ``n`` SMs one split of ``full`` makes, at most ``parts`` (a dry run)."""
    made = ctypes.c_uint(parts)
    _call(lib, "cuDevSmResourceSplitByCount", None, ctypes.byref(made), ctypes.byref(full), None, 0, n)
    return made.value


def _largest(lib: Any, full: _Resource, parts: int) -> int:
    return next((n for n in range(full.sm_count // parts, 0, -1) if _groups_of(lib, full, parts, n) >= parts), 0)


def equal_share(device: int, parts: int) -> int:
    """The most SMs each of ``parts`` equal, disjoint partitions of GPU ``device`` can have. The
    driver rounds a count up to its alignment, so an even share may not fit: an H100's 132 SMs
    give two partitions of 64, not 66."""
    with _LOCK:
        lib, _, full = _device_sms(device)
        share = _largest(lib, full, parts)
    if share < 1:
        raise UserError(f"GPU {device} ({full.sm_count} SMs) cannot be split into {parts} partitions; "
                        "ask for fewer gpu_partitions")
    return share


def _split(lib: Any, full: _Resource, counts: tuple[int, ...], device: int) -> list[_Resource]:
    """Equal counts: one split into len(counts) groups; else one group at a time from what is left."""
    if len(set(counts)) == 1:
        groups = (_Resource * len(counts))()
        made = ctypes.c_uint(len(counts))
        _call(lib, "cuDevSmResourceSplitByCount", groups, ctypes.byref(made), ctypes.byref(full), None, 0, counts[0])
        if made.value < len(counts):
            fits = _largest(lib, full, len(counts))
            raise UserError(f"GPU {device} ({full.sm_count} SMs) gives only {made.value} partitions of >= "
                            f"{counts[0]} SMs (the driver rounds counts up to its alignment); ask for sms: {fits} "
                            f"each, the largest equal share of {len(counts)} here")
        return list(groups)
    out, source = [], full
    for n in counts:
        group, rest, made = _Resource(), _Resource(), ctypes.c_uint(1)
        _call(lib, "cuDevSmResourceSplitByCount", ctypes.byref(group), ctypes.byref(made), ctypes.byref(source),
              ctypes.byref(rest), 0, n)
        if made.value < 1:
            raise UserError(f"GPU {device}: no partition of {n} SMs is left after {out and [g.sm_count for g in out]}")
        out.append(group)
        source = rest
    return out
