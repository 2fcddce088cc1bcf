"""A block runner by backend name: the one place that knows which backends exist."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from autohet.block_runners._base import BlockRunner
from autohet.block_runners._torch import TorchRunner
from autohet.core.errors import unknown_name
from autohet.executors.backends import BLOCK_RUNNERS
from autohet.partition import BlockGraph

__all__ = ["BACKENDS", "backend_of", "make_runner"]

BACKENDS = BLOCK_RUNNERS  # the block runners of the backend registry (``executors.backends``)


def backend_of(backend: str | Mapping[Any, str], block: str, device: str) -> str:
    """One backend for all blocks, or a mapping by (block, device) or by block (default torch)."""
    if isinstance(backend, str):
        return backend
    return backend.get((block, device)) or backend.get(block, "torch")


def make_runner(graph: BlockGraph, block: str, device: str = "cpu", backend: str = "torch",
                dtype: str | torch.dtype | None = None, **tvm_options: object) -> BlockRunner:
    """A runner for one block of ``graph`` on ``device`` with ``backend`` (torch or tvm)."""
    if block not in graph.names:
        raise unknown_name("block", block, graph.names)
    if backend == "torch":
        return TorchRunner(graph[block], device, dtype)
    if backend == "tvm":
        from autohet.block_runners.tvm import TvmRunner

        return TvmRunner(graph[block], device, dtype, model=graph.model, **tvm_options)
    raise unknown_name("backend", backend, BACKENDS)
