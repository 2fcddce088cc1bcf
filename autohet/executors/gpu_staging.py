"""A GPU executor's host side: its images staged once in pinned memory in the compute dtype (the
workload's bank, a served call's images, a stream's next window by turns into two pinned buffers), or
left where they lie when they are already page-locked, in that dtype or as float32 inputs
(``_InPlaceParts``, ``read_in_place``), so its copy stream reads them straight to the GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from autohet.core.errors import UserError
from autohet.core.workload import Workload

__all__ = ["PinnedStaging", "read_in_place"]


class _InPlaceParts:
    """A stream's window left where its parts lie, each already page-locked (an ingress's shared-memory
    body that a GPU replica registered, ``shm.pin_mappings``): the GPU copies from them directly. A
    staging copy of a served window takes about as long as the GPU's work on it, and with the wait for
    requests it set the served rate (docs/why.md, executors/gpu_staging.py)."""

    def __init__(self, parts: list[torch.Tensor]) -> None:
        self.parts = parts
        self.starts = [0]
        for part in parts:
            self.starts.append(self.starts[-1] + int(part.shape[0]))
        self.shape = (self.starts[-1], *parts[0].shape[1:])
        self.dtype = parts[0].dtype

    def rows(self, start: int, count: int) -> list[torch.Tensor]:
        """Rows [start, start + count) as slices of the parts, in order."""
        out = []
        for part, begin, end in zip(self.parts, self.starts, self.starts[1:], strict=False):
            lo, hi = max(start, begin), min(start + count, end)
            if lo < hi:
                out.append(part[lo - begin : hi - begin])
        return out


def read_in_place(parts: list[torch.Tensor], staged: torch.dtype) -> bool:
    """Whether a GPU copies ``parts`` from where they lie: all contiguous and page-locked, in the dtype it
    stages (``staged``) or all float32, converted on the GPU. A page-locked float32 source (a DataLoader
    with ``pin_memory=True``) then costs the host nothing but the GPU's read of it, where staging it into
    fp16 rows reads it, writes half as much again and has that read by the GPU (BENCHMARKS.md 40)."""
    kind = parts[0].dtype
    return kind in (staged, torch.float32) and all(
        p.dtype == kind and p.is_contiguous() and p.is_pinned() for p in parts)


class PinnedStaging:
    """The staging half of ``GpuExecutor`` (its ``dtype``, ``workload``, ``pixel_scale`` and ``spec`` are the
    executor's)."""

    dtype: torch.dtype
    workload: Workload | None
    pixel_scale: Any
    spec: Any
    bank: Any
    _ahead: dict

    # a served call's images, staged: one pinned buffer in the compute dtype, reused by later calls
    _staging: torch.Tensor | None = None

    def set_workload(self, workload: Workload) -> None:
        """New images for the next units (a served call's), staged into a pinned buffer in the compute
        dtype that later calls reuse (grown when a call is larger), copied on several threads."""
        import warnings

        from autohet.platform.host_copy import copy_rows

        rows = np.asarray(workload.bank)
        dtype = self._staged_dtype(rows)
        staging = self._staging
        if staging is None or staging.dtype != dtype or staging.shape[1:] != rows.shape[1:] \
                or staging.shape[0] < rows.shape[0]:
            staging = self._staging = torch.empty(rows.shape, dtype=dtype, pin_memory=True)
        bank = staging[: rows.shape[0]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays (the object store, a memmap)
            copy_rows(bank, torch.from_numpy(rows))
        self.workload, self._bank_of, self._banks, self.bank = workload, workload.bank, {dtype: bank}, bank
        self._ahead = {}

    takes_pixels = True
    launches_async = True

    def _staged_dtype(self, rows: Any) -> torch.dtype:
        """uint8 pixels stay uint8 (scaled on the GPU, ``pixel_scale``); inputs go to the compute dtype."""
        if rows.dtype != np.uint8:
            return self.dtype
        if self.pixel_scale is None:
            raise UserError(f"executor {self.spec.name} got uint8 pixels without a pixel scale (mean, std); "
                            "pass float32 model inputs")
        return torch.uint8

    # a stream's calls, staged by turns into two pinned buffers per dtype: the next call's while the current
    # one runs. Sized once to the largest call seen or announced (``rows``) and kept: a fresh pinned buffer is
    # a cudaHostAlloc of hundreds of megabytes, which holds its CUDA context's lock while it pins the pages,
    # so every launch on that GPU waits (the four-GPU stream of docs/why.md, executors/gpu_staging.py)
    _turns: dict[torch.dtype, list[torch.Tensor | None]] | None = None
    _turn = 0
    device: Any = None

    def stage(self, parts: list[np.ndarray], rows: int = 0) -> torch.Tensor | _InPlaceParts:
        """The parts copied straight into the next of two pinned buffers in the compute dtype (no join,
        one host copy, on several threads); the other buffer may be in use by the current call's units.
        Parts already page-locked are left where they are (no copy; ``read_in_place``). ``rows``: the
        largest call the caller will stage, so the buffers are allocated once at that size."""
        import warnings

        from autohet.platform.host_copy import copy_parts

        self._own_device()
        total = sum(len(p) for p in parts)
        dtype = self._staged_dtype(parts[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays (the object store, a memmap)
            tensors = [torch.from_numpy(p) for p in parts]
        if read_in_place(tensors, dtype):
            return _InPlaceParts(tensors)
        if self._turns is None:
            self._turns = {}
        turns = self._turns.setdefault(dtype, [None, None])
        self._turn ^= 1
        buffer = turns[self._turn]
        if buffer is None or buffer.shape[1:] != parts[0].shape[1:] or buffer.shape[0] < total:
            # both turns at once, so that only a stream's first call pays the allocation; the old ones go
            # back to torch's pinned cache first. The other turn may still be read by a queued call: it
            # keeps its memory alive until its copies are done (torch's pinned cache records them)
            size = (max(total, rows), *parts[0].shape[1:])
            turns[:] = [None, None]
            turns[:] = [torch.empty(size, dtype=dtype, pin_memory=True) for _ in range(2)]
            buffer = turns[self._turn]
        copy_parts(buffer[:total], tensors)
        return buffer[:total]

    def stage_piece(self, parts: list[np.ndarray]) -> torch.Tensor | _InPlaceParts:
        """A stream lane's piece: staged as ``stage`` does, its buffers sized to the largest piece (a unit)."""
        return self.stage(parts, self.spec.max_unit_images)

    def _own_device(self) -> None:
        """Makes this executor's GPU the calling thread's current device (a lane's feeder starts on GPU 0):
        torch allocates pinned memory and asks whether memory is pinned through the current device's
        context, so every lane's feeder went through GPU 0's."""
        if self.device is not None and torch.cuda.current_device() != self.device.index:
            torch.cuda.set_device(self.device)

    def use_staged(self, staged: torch.Tensor | _InPlaceParts) -> None:
        self.workload = Workload(staged, int(staged.shape[0]))  # units read ``bank``; the workload counts rows
        self._bank_of, self._banks, self.bank = staged, {staged.dtype: staged}, staged
        self._ahead = {}

    def _bank(self, dtype: torch.dtype) -> torch.Tensor:
        """The workload once in pinned host memory in ``dtype`` (kept per dtype, for this workload)."""
        assert self.workload is not None
        if getattr(self, "_bank_of", None) is not self.workload.bank:
            self._banks = {}
            self._bank_of = self.workload.bank
        if dtype not in self._banks:
            source = torch.from_numpy(np.asarray(self.workload.bank))
            bank = torch.empty(source.shape, dtype=dtype, pin_memory=True)
            bank.copy_(source)
            self._banks = {d: b for d, b in self._banks.items() if d == torch.float32} | {dtype: bank}
        return self._banks[dtype]
