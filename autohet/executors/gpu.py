"""One GPU: the workload pinned once in host memory, copies on their own stream overlapped with compute.

Data path per work unit: slices of the pinned host bank (already in the compute dtype, so
fp16/bf16 halve the bytes) are copied host-to-device on a copy stream into one of two device
buffers while the compute stream runs the previous batch; outputs go device-to-host into a
pinned buffer on the compute stream; the host waits once per unit. ``launch`` queues a unit and
``collect`` waits for it; the actor announces a unit's next part (``run_ahead``), which is queued
before this part's outputs are handed back, so the GPU does not idle between parts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from autohet.errors import UserError
from autohet.executors.base import Executor, UnitResult
from autohet.executors.cpu import pin_cores
from autohet.models import build_model
from autohet.workload import Workload

__all__ = ["GpuExecutor", "DTYPES"]

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def padded_batch(n: int, batch: int) -> int:
    """The shape a partial batch of ``n`` runs at: the next power of two, at most ``batch``.

    cuDNN autotunes (cudnn.benchmark) once per input shape; schedulers make units of any size,
    so unpadded partial batches would trigger a fresh autotune on almost every unit.
    """
    return min(batch, 1 << max(0, n - 1).bit_length())


def local_gpu_index(requested: int) -> int:
    """The device index to use in this process: under Ray (CUDA_VISIBLE_DEVICES narrowed to the one
    GPU it assigned) that is 0, whatever index the pool file named."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and len([v for v in visible.split(",") if v.strip()]) == 1:
        return 0
    return requested


@dataclass
class _Launched:
    """A unit queued on the GPU: its pinned output rows and the events around its compute."""

    outputs: torch.Tensor
    begin: torch.cuda.Event
    end: torch.cuda.Event


class GpuExecutor(Executor):
    def load(self, workload: Workload) -> None:
        index = local_gpu_index(self.spec.gpu or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise UserError(f"executor {self.spec.name} asks for GPU {self.spec.gpu} but this node has "
                            f"{torch.cuda.device_count()} CUDA GPUs; use actors/auto.yaml or a CPU pool")
        if self.spec.cores:
            pin_cores(self.spec.cores)
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        tf32 = self.spec.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
        self.dtype = DTYPES[self.spec.precision]
        self.memory_format = torch.channels_last if self.spec.channels_last else torch.contiguous_format
        model = build_model(self.model_spec).to(self.device, self.dtype)
        self.model = model.to(memory_format=self.memory_format)
        self.workload = workload
        self._place_bank(workload)
        batch = self.spec.batch
        shape = workload.shape
        self.copy_stream = torch.cuda.Stream(self.device)
        self.compute_stream = torch.cuda.Stream(self.device)
        self.dev_in = [torch.empty((batch, *shape), dtype=self.dtype, device=self.device) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.consumed = [torch.cuda.Event() for _ in range(2)]
        self._slot = 0
        self._ahead: dict[tuple[int, int], _Launched] = {}
        # outputs go back as fp32, converted on the GPU: numpy's fp16 -> fp32 cast runs at ~10 ns an
        # element, which for 1000 classes costs the driver more than the whole GPU run
        self.out_dtype = torch.float32
        sizes = sorted({padded_batch(n, batch) for n in range(1, batch + 1)})
        for n in sizes:  # warm-up: cuDNN autotunes each shape a unit can run at, once
            self.run(0, min(n, workload.images))
        for _ in range(2):
            self.run(0, min(2 * batch, workload.images))

    def _place_bank(self, workload: Workload) -> None:
        """Copies the workload once into pinned host memory in the compute dtype (kept across
        reconfigurations that leave the workload and dtype as they were, e.g. a new batch size)."""
        current = getattr(self, "bank", None)
        if current is not None and current.dtype == self.dtype and getattr(self, "_bank_of", None) is workload.bank:
            return
        self._bank_of = workload.bank
        source = torch.from_numpy(np.asarray(workload.bank))
        self.bank = torch.empty(source.shape, dtype=self.dtype, pin_memory=True)
        self.bank.copy_(source)

    def _segments(self, start: int, n: int) -> list[tuple[int, int, int]]:
        """(bank_row, dest_offset, count) pieces of images [start, start+n) in the cyclic bank."""
        rows = self.bank.shape[0]
        out, done = [], 0
        while done < n:
            row = (start + done) % rows
            count = min(n - done, rows - row)
            out.append((row, done, count))
            done += count
        return out

    def launch(self, start: int, size: int) -> _Launched:
        """Queues the unit's copies, forward passes and output copies on the GPU and returns at once.

        One caller thread at a time (the actor runs one call at once). Queuing the next unit before
        collecting this one (``run_ahead``, ``standalone_ips``) keeps the GPU busy through the
        end-of-call wait, the output copy and the actor's return.
        """
        batch = self.spec.batch
        with torch.inference_mode():
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record(self.compute_stream)
            outputs: torch.Tensor | None = None
            for offset in range(0, size, batch):
                n = min(batch, size - offset)
                padded = padded_batch(n, batch)  # rows n..padded hold stale inputs; their outputs are dropped
                slot = self._slot
                self._slot ^= 1
                with torch.cuda.stream(self.copy_stream):
                    self.copy_stream.wait_event(self.consumed[slot])
                    for row, dest, count in self._segments(start + offset, n):
                        self.dev_in[slot][dest : dest + count].copy_(self.bank[row : row + count],
                                                                     non_blocking=True)
                    self.copied[slot].record(self.copy_stream)
                with torch.cuda.stream(self.compute_stream):
                    self.compute_stream.wait_event(self.copied[slot])
                    x = self.dev_in[slot][:padded].contiguous(memory_format=self.memory_format)
                    y = self.model(x)[:n]
                    self.consumed[slot].record(self.compute_stream)
                    if outputs is None:  # pinned, one per unit: freed to torch's host cache once returned
                        outputs = torch.empty((size, *y.shape[1:]), dtype=self.out_dtype, pin_memory=True)
                    outputs[offset : offset + n].copy_(y, non_blocking=True)
            end.record(self.compute_stream)
        assert outputs is not None
        return _Launched(outputs, begin, end)

    def collect(self, handle: _Launched) -> UnitResult:
        """Waits for a launched unit; ``compute_s`` is the GPU's own time on it (CUDA events), so
        a unit queued behind another is not charged for the wait."""
        handle.end.synchronize()
        compute_s = handle.begin.elapsed_time(handle.end) / 1e3
        return UnitResult(handle.outputs.numpy(), compute_s)  # keeps the pinned rows alive while used

    def run(self, start: int, size: int) -> UnitResult:
        return self.run_ahead(start, size, None)

    def run_ahead(self, start: int, size: int, following: tuple[int, int] | None) -> UnitResult:
        """Runs [start, start+size) — already queued if the previous call announced it — and queues
        ``following`` before waiting, all on the caller's thread (no second thread fighting the GIL
        for kernel launches while this one returns its outputs)."""
        handle = self._ahead.pop((start, size), None)
        self._ahead.clear()  # an announced part that was not asked for: its results are dropped
        if handle is None:
            handle = self.launch(start, size)
        if following is not None:
            self._ahead[following] = self.launch(*following)
        return self.collect(handle)

    def standalone_unit(self) -> int:
        """Eight batches: a per-call sync after every batch would understate the GPU."""
        return self.spec.batch * 8

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if torch.cuda.is_available():
            out["gpu_name"] = torch.cuda.get_device_name(self.device)
        return out
