"""A group of pinned CPU cores running the model with intra-op threads = group size."""

from __future__ import annotations

import os
import time
import warnings

import numpy as np
import torch

from autohet.errors import UserError
from autohet.executors.base import Executor, UnitResult
from autohet.models import build_model
from autohet.workload import Workload

__all__ = ["CpuExecutor", "pin_cores"]


def pin_cores(cores: tuple[int, ...]) -> None:
    """Pins this process to ``cores`` and sets torch's intra-op threads to their number."""
    if cores and hasattr(os, "sched_setaffinity"):
        available = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
        missing = sorted(set(cores) - available)
        if missing:
            raise UserError(f"cores {missing} do not exist on this node (it has {os.cpu_count()}); "
                            "fix the cores of the pool file or use actors/auto.yaml")
        os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(max(1, len(cores)))


class CpuExecutor(Executor):
    def load(self, workload: Workload) -> None:
        if self.spec.precision in ("fp16",):
            raise UserError(f"executor {self.spec.name}: CPU runs fp32, tf32 (=fp32) or bf16; "
                            "set precision: fp32 or bf16")
        pin_cores(self.spec.cores)
        self.workload = workload
        model = build_model(self.model_spec)
        if self.spec.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.dtype = torch.bfloat16 if self.spec.precision == "bf16" else torch.float32
        if self.dtype != torch.float32:
            self.model = self.model.to(self.dtype)
        self.run(0, min(self.spec.batch, workload.images, 8))  # warm-up: first-call costs, not a full batch

    def run(self, start: int, size: int) -> UnitResult:
        assert self.workload is not None
        t0 = time.perf_counter()
        chunks = []
        batch = self.spec.batch
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays from the object store
            for offset in range(0, size, batch):
                n = min(batch, size - offset)
                x = torch.from_numpy(self.workload.rows(start + offset, n))
                if self.dtype != torch.float32:
                    x = x.to(self.dtype)
                if self.spec.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                chunks.append(self.model(x).float().numpy())
        outputs = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        return UnitResult(outputs, time.perf_counter() - t0)
