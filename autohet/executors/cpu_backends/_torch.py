"""PyTorch on a CPU group: eager or inductor (``torch.compile``), fp32 or bf16, NCHW or channels_last.

bf16 and channels_last each made eager PyTorch much faster where the CPU computes bf16 natively
(docs/why.md, executors/cpu_backends/_torch.py).
"""

from __future__ import annotations

import copy
import shutil
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from autohet.executors.cpu_backends._base import CpuBackend, CpuProgram, ModelSource

if TYPE_CHECKING:
    from autohet.executors.base import ExecutorSpec

__all__ = ["EagerBackend", "InductorBackend", "TorchProgram"]


class TorchProgram(CpuProgram):
    """A module in the variant's dtype and layout; a compiled one runs one shape (partial batches padded)."""

    def __init__(self, module: Any, dtype: torch.dtype, channels_last: bool, fixed_batch: int | None) -> None:
        self.module, self.dtype, self.channels_last, self.fixed_batch = module, dtype, channels_last, fixed_batch

    def tensor(self, x: np.ndarray, pad_to: int = 0) -> torch.Tensor:
        """``x`` in the variant's dtype and layout, zero rows up to ``pad_to``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays from the object store
            t = torch.from_numpy(x)
        if pad_to > len(t):  # before the layout: a padded channels_last batch compiled the model a second time
            t = torch.cat([t, t.new_zeros((pad_to - len(t), *t.shape[1:]))])
        if self.dtype != torch.float32:
            t = t.to(self.dtype)
        if self.channels_last:
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    def run(self, x: np.ndarray, batch: int) -> np.ndarray:
        chunks = []
        for offset in range(0, len(x), batch):
            rows = x[offset : offset + batch]
            # the input made outside inference mode, as the model was compiled on: torch.compile guards on
            # the flag, and an inference-mode input compiled every model a second time at its warm-up
            t = self.tensor(rows, self.fixed_batch or 0)
            with torch.inference_mode():
                chunks.append(self.module(t)[: len(rows)].float().numpy())
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


class EagerBackend(CpuBackend):
    name = "eager"
    precisions = ("fp32", "bf16")

    def variant_key(self, spec: ExecutorSpec) -> tuple:
        return (*super().variant_key(spec), spec.channels_last)

    def convert(self, source: ModelSource, spec: ExecutorSpec) -> tuple[Any, torch.dtype]:
        """The fp32 module itself, or a converted copy (``.to`` is in place) in the variant's dtype/layout."""
        dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32
        module = source.module()
        if dtype != torch.float32 or spec.channels_last:
            module = copy.deepcopy(module).to(dtype)
            if spec.channels_last:
                module = module.to(memory_format=torch.channels_last)
        return module, dtype

    def build(self, source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...]) -> CpuProgram:
        module, dtype = self.convert(source, spec)
        return TorchProgram(module, dtype, spec.channels_last, None)


class InductorBackend(EagerBackend):
    name = "inductor"

    def missing(self) -> str | None:
        if not (shutil.which("g++") or shutil.which("c++")):
            return "no C++ compiler for inductor on the CPU (install g++)"
        return None

    def variant_key(self, spec: ExecutorSpec) -> tuple:
        return (*super().variant_key(spec), spec.inductor_mode, spec.batch)  # one compiled shape per batch

    def build(self, source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...]) -> CpuProgram:
        from autohet.executors.compiled import compile_module

        module, dtype = self.convert(source, spec)
        program = TorchProgram(module, dtype, spec.channels_last, spec.batch)
        example = program.tensor(np.zeros((spec.batch, *shape), dtype=np.float32))
        program.module, program.compile_s = compile_module(module, spec.inductor_mode, example)
        return program
