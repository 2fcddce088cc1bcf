"""Running a placed model: each block on its assigned device and backend, transfers in between."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from autohet.backends._base import BlockRunner, time_runner
from autohet.backends._torch import TorchRunner
from autohet.errors import UserError, unknown_name
from autohet.partition import BlockGraph

__all__ = ["BACKENDS", "PlacedModel", "PlacementMeasure", "backend_of", "make_runner", "measure_blocks",
           "measure_links"]

BACKENDS = ("torch", "tvm")


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
        from autohet.backends._tvm import TvmRunner

        return TvmRunner(graph[block], device, dtype, model=graph.model, **tvm_options)
    raise unknown_name("backend", backend, BACKENDS)


def measure_blocks(graph: BlockGraph, devices: list[str], backend: str = "torch", runs: int = 10,
                   warmup: int = 3, dtype: str | torch.dtype | None = None) -> dict[tuple[str, str], float]:
    """Mean seconds of each block on each device: the per-(block, device) table placement needs.

    Inputs are created on the block's device, so the figures exclude transfers."""
    out: dict[tuple[str, str], float] = {}
    for device in devices:
        for block in graph.blocks:
            runner = make_runner(graph, block.name, device, backend, dtype)
            inputs = block.example_inputs(runner.device, dtype=getattr(runner, "dtype", None))
            times = time_runner(runner, inputs, runs, warmup)
            out[(block.name, device)] = sum(times) / len(times)
    return out


class PlacedModel:
    """The model with each block on its assigned device, runnable end to end.

    ``assignment`` maps every block name to a device ('cpu', 'cuda:0'); ``backend`` is one backend
    for all blocks or a per-block mapping. Calling it moves each input to the device of the block
    reading it (the transfers) and returns the output on ``output_device``.
    """

    def __init__(self, graph: BlockGraph, assignment: Mapping[str, str],
                 backend: str | Mapping[str, str] = "torch", dtype: str | torch.dtype | None = None,
                 output_device: str = "cpu") -> None:
        missing = [b for b in graph.names if b not in assignment]
        if missing:
            raise UserError(f"assignment has no device for block {missing[0]!r}; give one per block")
        self.graph = graph
        self.assignment = dict(assignment)
        self.output_device = torch.device(output_device)
        self.runners: dict[str, BlockRunner] = {}
        for block in graph.names:
            kind = backend if isinstance(backend, str) else backend.get(block, "torch")
            self.runners[block] = make_runner(graph, block, self.assignment[block], kind, dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.graph.run(x, self.runners)
        return out.to(self.output_device, torch.float32)

    def sync(self) -> None:
        for runner in {r.device: r for r in self.runners.values()}.values():
            runner.sync()


class PlacementMeasure:
    """``measure(assignment) -> seconds``: mean end-to-end latency of the placed model over ``runs``
    calls after ``warmup``, input starting on and output returning to the CPU. Runners are built once
    per (block, device) and reused across assignments, so correction rounds only pay for running."""

    def __init__(self, graph: BlockGraph, backend: str | Mapping[str, str] = "torch",
                 dtype: str | torch.dtype | None = None, runs: int = 10, warmup: int = 3,
                 seed: int = 0) -> None:
        self.graph, self.backend, self.dtype = graph, backend, dtype
        self.runs, self.warmup = runs, warmup
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn((graph.batch, *graph.input_shape), generator=gen)
        self._runners: dict[tuple[str, str], BlockRunner] = {}
        self.calls = 0

    def runner(self, block: str, device: str) -> BlockRunner:
        key = (block, device)
        if key not in self._runners:
            self._runners[key] = make_runner(self.graph, block, device, backend_of(self.backend, block, device),
                                             self.dtype)
        return self._runners[key]

    def __call__(self, assignment: Mapping[str, str]) -> float:
        runners = {b: self.runner(b, assignment[b]) for b in self.graph.names}
        devices = {r.device: r for r in runners.values()}.values()
        self.calls += 1
        with torch.no_grad():
            for _ in range(self.warmup):
                self.graph.run(self.x, runners).cpu()
            start = time.perf_counter()
            for _ in range(self.runs):
                self.graph.run(self.x, runners).cpu()  # .cpu() waits for the last device
            for r in devices:
                r.sync()
            return (time.perf_counter() - start) / self.runs


def measure_links(devices: Sequence[str], sizes: tuple[int, int] = (4096, 16 << 20),
                  runs: int = 10) -> dict[tuple[str, str], tuple[float, float]]:
    """(latency s, bytes/s) per ordered pair of different devices, fitted from copies of two sizes;
    the table ``autohet.placement.table_transfer`` takes."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for src in devices:
        for dst in devices:
            if src == dst:
                continue
            secs = []
            for size in sizes:
                t = torch.empty(size // 4, dtype=torch.float32, device=src)
                for _ in range(2):
                    t.to(dst)
                start = time.perf_counter()
                for _ in range(runs):
                    t.to(dst)
                if torch.device(dst).type == "cuda" or torch.device(src).type == "cuda":
                    torch.cuda.synchronize()
                secs.append((time.perf_counter() - start) / runs)
            slope = max((secs[1] - secs[0]) / (sizes[1] - sizes[0]), 1e-15)
            out[(src, dst)] = (max(secs[0] - slope * sizes[0], 0.0), 1.0 / slope)
    return out
