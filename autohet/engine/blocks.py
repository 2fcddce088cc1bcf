"""A partitioned model's blocks placed on engine devices: programs, block and link timing.

Consecutive blocks on one device form a segment: one step of the program, and on a GPU one CUDA
graph (batch-1 launches would otherwise cost more than the compute). Segments on different
devices run at once where the block DAG allows (branches); every value crossing devices is an
explicit transfer step. Runners and graphs are built once per (segment, device) and reused by
every assignment the placement tries.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autohet.block_runners import backend_of, make_runner, time_runner
from autohet.engine.devices import HOST, Device, Value
from autohet.engine.program import Engine, Program, Step, move, transfer_worker, with_transfers
from autohet.engine.toolkit import ChannelsLast, fit_link, graphed, mean_seconds, on_stream, time_each
from autohet.executors.backends import backend
from autohet.partition import BlockGraph

__all__ = ["BlockPrograms", "Segment", "measure_links", "segments"]


@dataclass(frozen=True)
class Segment:
    """Consecutive blocks (topological order) on one device, the values they read from outside and
    the values read after them."""

    device: str
    blocks: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def segments(graph: BlockGraph, assignment: Mapping[str, str]) -> list[Segment]:
    """The assignment's maximal same-device runs of blocks, in topological order."""
    runs: list[list[str]] = []
    for block in graph.blocks:
        if runs and assignment[runs[-1][-1]] == assignment[block.name]:
            runs[-1].append(block.name)
        else:
            runs.append([block.name])
    out = []
    for k, run in enumerate(runs):
        inside = {v for b in run for v in graph[b].outputs}
        reads = [v for b in run for v in graph[b].inputs if v not in inside]
        later = {v for r in runs[k + 1:] for b in r for v in graph[b].inputs} | {graph.output_name}
        writes = [v for b in run for v in graph[b].outputs if v in later]
        out.append(Segment(assignment[run[0]], tuple(run), tuple(dict.fromkeys(reads)), tuple(writes)))
    return out


class BlockPrograms:
    """Programs of one block graph on an engine; ``backend`` is one backend or one per
    (block, device); ``graphs`` captures GPU segments run by torch as CUDA graphs."""

    def __init__(self, engine: Engine, graph: BlockGraph, backend: str | Mapping[Any, str] = "torch",
                 graphs: bool = True) -> None:
        self.engine, self.graph, self.backend, self.graphs = engine, graph, backend, graphs
        self._runners: dict[tuple[str, str], Any] = {}
        self._calls: dict[tuple[tuple[str, ...], str], Any] = {}
        self._programs: dict[tuple[str, ...], Program] = {}
        self.shapes = {graph.input_name: tuple((graph.batch, *graph.input_shape))}
        for block in graph.blocks:
            self.shapes.update(zip(block.outputs, block.out_shapes, strict=True))

    def backend_of(self, block: str, device: str) -> str:
        return backend_of(self.backend, block, device)

    def runner(self, block: str, device: str) -> Any:
        """The block's runner on an engine device (built on first use), in the device's layout."""
        key = (block, device)
        if key not in self._runners:
            dev = self.engine[device]
            kind = self.backend_of(block, device)
            in_format = backend(kind).device_format
            runner = make_runner(self.graph, block, str(dev.torch_device), kind, dev.dtype if in_format else None)
            if in_format and dev.channels_last:
                runner = ChannelsLast(runner)
            self._runners[key] = runner
        return self._runners[key]

    def _segment_call(self, seg: Segment) -> Any:
        key = (seg.blocks, seg.device)
        if key in self._calls:
            return self._calls[key]
        dev = self.engine[seg.device]
        runners = [(self.graph[b], self.runner(b, seg.device)) for b in seg.blocks]
        kinds = {self.backend_of(b, seg.device) for b in seg.blocks}

        def run(*xs: torch.Tensor) -> Any:
            values = dict(zip(seg.inputs, xs, strict=True))
            for block, runner in runners:
                out = runner(*(values[v] for v in block.inputs))
                values.update(zip(block.outputs, out if isinstance(out, tuple) else (out,), strict=True))
            outs = tuple(values[v] for v in seg.outputs)
            return outs if len(outs) > 1 else outs[0]

        call: Any = run
        if not any(backend(k).own_stream for k in kinds):
            call = graphed(run, dev, lambda: [torch.zeros(self.shapes[v], dtype=dev.dtype, device=dev.torch_device)
                                              for v in seg.inputs], self.graphs)
        elif dev.on_gpu:  # a block runner on a stream of its own (TVM): order it by syncs
            def call(*xs: torch.Tensor, _run: Any = run) -> Any:
                torch.cuda.current_stream().synchronize()
                out = _run(*xs)
                torch.cuda.synchronize(dev.torch_device)
                return out
        self._calls[key] = call
        return call

    def program(self, assignment: Mapping[str, str]) -> Program:
        """The assignment as a program: one step per segment, transfers between devices."""
        key = tuple(assignment[b] for b in self.graph.names)
        if key not in self._programs:
            steps = [Step(f"{s.device}:{s.blocks[0]}..{s.blocks[-1]}", s.device, s.inputs, s.outputs,
                          self._segment_call(s)) for s in segments(self.graph, assignment)]
            self._programs[key] = with_transfers(steps, (self.graph.input_name,), self.graph.output_name,
                                                 self.engine.devices)
        return self._programs[key]

    def run(self, assignment: Mapping[str, str], x: torch.Tensor) -> torch.Tensor:
        """One request end to end: ``x`` in host memory, the output back in host memory as fp32."""
        out = self.engine.run(self.program(assignment), {self.graph.input_name: x})
        return out.float()

    def measure(self, assignment: Mapping[str, str], runs: int = 10, warmup: int = 3, seed: int = 0) -> float:
        """Mean end-to-end seconds of one request (the measured placement time)."""
        x = torch.randn((self.graph.batch, *self.graph.input_shape), generator=torch.Generator().manual_seed(seed))
        return mean_seconds(lambda: self.run(assignment, x), runs, warmup)

    def latencies(self, assignment: Mapping[str, str], images: Sequence[Any], warmup: int = 3
                  ) -> tuple[list[float], list[torch.Tensor]]:
        """Per-request seconds and outputs for batch-1 requests taken one after another."""
        return time_each(lambda x: self.run(assignment, x), [torch.as_tensor(r)[None] for r in images], warmup,
                         settled=False)

    def block_times(self, devices: Sequence[str], runs: int = 10, warmup: int = 3) -> dict[tuple[str, str], float]:
        """Mean seconds of each block alone on each device, inputs already there (graphed on GPUs
        when graphs are on, as the program will run it)."""
        out: dict[tuple[str, str], float] = {}
        for device in devices:
            dev = self.engine[device]
            for block in self.graph.blocks:
                seg = Segment(device, (block.name,), tuple(block.inputs), tuple(block.outputs))
                call = self._segment_call(seg)
                inputs = tuple(torch.randn(self.shapes[v]).to(dev.torch_device, dev.dtype) for v in block.inputs)
                out[(block.name, device)] = dev.call(lambda c=call, i=inputs, d=dev: _mean_time(c, i, d, runs, warmup))
        return out


class _Timed:
    """A callable as a BlockRunner for ``time_runner`` (sync = the device's)."""

    def __init__(self, call: Any, device: Device) -> None:
        self.call, self.dev = call, device
        self.backend, self.device = "engine", str(device.torch_device)

    def __call__(self, *xs: torch.Tensor) -> Any:
        return self.call(*xs)

    def sync(self) -> None:
        if self.dev.on_gpu:
            torch.cuda.synchronize(self.dev.torch_device)


def _mean_time(call: Any, inputs: tuple[torch.Tensor, ...], device: Device, runs: int, warmup: int) -> float:
    with on_stream(device):
        times = time_runner(_Timed(call, device), inputs, runs, warmup)
    return sum(times) / len(times)


def measure_links(engine: Engine, devices: Sequence[str], sizes: tuple[int, int] = (4096, 4 << 20),
                  runs: int = 10) -> dict[tuple[str, str], tuple[float, float]]:
    """(latency s, bytes/s) of a transfer between each ordered pair of ``devices`` and the host, fitted
    from engine transfers of two sizes, each timed to completion on the worker that issues it (the
    figures placement's transfer model takes; correction rounds then measure whole programs)."""
    names = [HOST, *[d for d in devices if d != HOST]]
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for src in names:
        for dst in names:
            if src == dst:
                continue
            out[(src, dst)] = fit_link(sizes, [_time_move(engine, src, dst, size, runs) for size in sizes])
    return out


def _time_move(engine: Engine, src: str, dst: str, nbytes: int, runs: int) -> float:
    source, target = engine[src], engine[dst]
    worker = transfer_worker(engine, src, dst)
    tensor = torch.randn(nbytes // 4).to(source.torch_device)
    value = Value(tensor, src, source.publish(tensor).event if source.on_gpu else None)

    def timed() -> float:
        for k in range(runs + 2):
            if k == 2:
                start = time.perf_counter()
            moved = move(value, source, target, worker)
            if moved.event is not None:
                moved.event.synchronize()
        return (time.perf_counter() - start) / runs

    if worker.kind == "host":
        return timed()
    return worker.call(timed)
