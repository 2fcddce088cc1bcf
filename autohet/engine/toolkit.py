"""What every engine family does with a device, written once: a tensor moved into the device's
memory, dtype and layout; a call captured as a CUDA graph on a GPU; calls timed; a link's latency
and bandwidth fitted from two transfer sizes; a torch block runner in channels_last."""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from autohet.executors.compiled import graph_call
from autohet.platform.gc_control import settle

if TYPE_CHECKING:
    from autohet.engine.devices import Device
    from autohet.engine.program import Engine, Program

__all__ = ["ChannelsLast", "fit_link", "graphed", "in_layout", "mean_seconds", "on_stream", "seconds_each",
           "step_seconds", "time_each", "to_device"]


def in_layout(x: torch.Tensor, device: Device) -> torch.Tensor:
    """``x`` in the device's memory layout (channels_last for a 4-d tensor where the device uses it)."""
    return x.contiguous(memory_format=torch.channels_last) if device.channels_last and x.dim() == 4 else x


def to_device(x: torch.Tensor, device: Device) -> torch.Tensor:
    """``x`` in the device's memory, dtype (floating tensors) and layout (a no-op when it already is)."""
    x = x.to(device.torch_device, device.dtype) if x.is_floating_point() else x.to(device.torch_device)
    return in_layout(x, device)


def graphed(call: Callable[..., Any], device: Device, examples: Sequence[torch.Tensor] | Callable[[], Sequence[Any]],
            graphs: bool = True) -> Callable[..., Any]:
    """``call`` captured as a CUDA graph on a GPU device when ``graphs`` (static shapes: ``examples``,
    or a function making them, run on the device's worker); elsewhere ``call`` itself."""
    if not device.on_gpu or not graphs:
        return call
    return device.call(lambda: graph_call(call, list(examples() if callable(examples) else examples),
                                          device.stream))


@contextmanager
def on_stream(device: Device) -> Iterator[None]:
    """Work in the block runs on the device's stream (a GPU's); elsewhere nothing changes."""
    if not device.on_gpu:
        yield
        return
    with torch.cuda.stream(device.stream):
        yield


def mean_seconds(fn: Callable[[], Any], runs: int, warmup: int) -> float:
    """Mean seconds of ``fn``: ``warmup`` untimed calls, then one clock around ``runs`` calls."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - start) / runs


def seconds_each(fn: Callable[[], Any], runs: int, warmup: int) -> list[float]:
    """Seconds of each of ``runs`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def time_each(one: Callable[[Any], Any], requests: Sequence[Any], warmup: int, settled: bool = True
              ) -> tuple[list[float], list[Any]]:
    """``one`` on each request in turn, each timed, after ``warmup`` untimed ones (the requests
    cycled); ``settled``: the collector is settled before the clock starts. (seconds, outputs)."""
    for i in range(warmup):
        one(requests[i % len(requests)])
    if settled:
        settle()
    times, outs = [], []
    for x in requests:
        start = time.perf_counter()
        outs.append(one(x))
        times.append(time.perf_counter() - start)
    return times, outs


def step_seconds(engine: Engine, program: Program, feeds: dict[str, Any], tags: dict[str, tuple[str, ...]],
                 runs: int) -> tuple[dict[tuple[str, ...], float], float]:
    """Median seconds per step tag over ``runs`` timed runs (after one warm-up), and the median wall:
    of the timed runs on CPUs, of as many untimed ones when a GPU takes part (timing a GPU step
    synchronises it)."""
    engine.run(program, feeds)
    gpu = any(engine[d].on_gpu for d in program.devices)
    walls = seconds_each(lambda: engine.run(program, feeds), runs if gpu else 0, 0)
    per: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for _ in range(runs):
        timings: list[Any] = []
        start = time.perf_counter()
        engine.run(program, feeds, timings)
        if not gpu:
            walls.append(time.perf_counter() - start)
        sums: dict[tuple[str, ...], float] = defaultdict(float)
        for t in timings:
            sums[tags.get(t.step, ("other",))] += t.seconds
        for tag, seconds in sums.items():
            per[tag].append(seconds)
    return {tag: float(np.median(v)) for tag, v in per.items()}, float(np.median(walls))


def fit_link(sizes: tuple[int, int], secs: Sequence[float]) -> tuple[float, float]:
    """(latency s, bytes/s) of a link from the seconds of transfers of two sizes (bytes)."""
    slope = max((secs[1] - secs[0]) / (sizes[1] - sizes[0]), 1e-15)
    return max(secs[0] - slope * sizes[0], 0.0), 1.0 / slope


class ChannelsLast:
    """A torch block runner with its weights and 4-d inputs in channels_last (a device's layout)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        # a copy: a CPU fp32 runner shares the block's own module, which other runners and the graph use
        runner.module = copy.deepcopy(runner.module).to(memory_format=torch.channels_last)
        self.backend, self.device = runner.backend, runner.device

    def __call__(self, *xs: torch.Tensor) -> Any:
        return self.runner(*(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in xs))

    def sync(self) -> None:
        self.runner.sync()
