"""The PyTorch backend: the block's GraphModule as is, on a CPU or a GPU, in fp32/fp16/bf16."""

from __future__ import annotations

import copy

import torch

from autohet.block_runners._base import parse_device, parse_dtype
from autohet.partition import Block

__all__ = ["TorchRunner"]


class TorchRunner:
    """A block on one device; a copy of its weights is made only when device or dtype differ."""

    backend = "torch"

    def __init__(self, block: Block, device: str = "cpu", dtype: str | torch.dtype | None = None) -> None:
        self.block = block
        self._dev = parse_device(device)
        self.device = str(self._dev)
        self.dtype = parse_dtype(dtype)
        module = block.module
        if self._dev.type != "cpu" or self.dtype != torch.float32:
            module = copy.deepcopy(module).to(device=self._dev, dtype=self.dtype)
        self.module = module.eval()

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        args = [t.to(device=self._dev, dtype=self.dtype) for t in inputs]
        with torch.no_grad():
            return self.module(*args)

    def sync(self) -> None:
        if self._dev.type == "cuda":
            torch.cuda.synchronize(self._dev)
