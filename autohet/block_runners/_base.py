"""The block runner interface shared by the torch and TVM backends, and how runners are timed."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import torch

from autohet.core.errors import UserError

__all__ = ["BlockRunner", "parse_device", "parse_dtype", "time_runner"]

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
           "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


@runtime_checkable
class BlockRunner(Protocol):
    """Runs one block on one device: takes and returns torch tensors on any device.

    Inputs are moved to the runner's device (that move is the transfer between blocks placed on
    different devices); outputs stay on the runner's device.
    """

    backend: str
    device: str

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]: ...

    def sync(self) -> None:
        """Waits until work queued on the runner's device is done (for timing)."""


def parse_device(device: str) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N'; a GPU that is not there is a UserError."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device} asked for but torch sees no CUDA GPU; use --target cpu")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise UserError(f"device {device} does not exist; this machine has "
                            f"{torch.cuda.device_count()} GPU(s), use cuda:0..")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise UserError(f"device type {dev.type!r} is not supported; use cpu, cuda or cuda:N")
    return dev


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype.lower() not in _DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; valid: fp32, fp16, bf16")
    return _DTYPES[dtype.lower()]


def time_runner(runner: BlockRunner, inputs: tuple[torch.Tensor, ...], runs: int = 10,
                warmup: int = 3) -> list[float]:
    """Seconds of each of ``runs`` calls after ``warmup`` calls, with the device synchronised."""
    with torch.no_grad():
        for _ in range(warmup):
            runner(*inputs)
        runner.sync()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            runner(*inputs)
            runner.sync()
            times.append(time.perf_counter() - start)
    return times
