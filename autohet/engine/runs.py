"""Running programs the two ways strategies are measured: a stream of frames (throughput) and
batch-1 requests one after another (latency); and the whole model on one device, the baseline
every in-process strategy is compared with in the same run.

A program here takes one input value ``x`` (a batch in host memory) and returns the model's
output in host memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from autohet.engine.devices import Device
from autohet.engine.program import Engine, FrameStream, Program, Step, with_transfers
from autohet.executors.compiled import graph_call

__all__ = ["device_module", "request_latencies", "stream_frames", "whole_model_program"]


def device_module(module: torch.nn.Module, device: Device) -> Callable[[torch.Tensor], Any]:
    """``module`` copied to the device (dtype, layout); the callable converts its input to match."""
    import copy

    moved = device.prepare(copy.deepcopy(module))
    layout = torch.channels_last if device.channels_last else torch.contiguous_format

    def run(x: torch.Tensor) -> Any:
        x = x.to(device.torch_device, device.dtype)
        if x.dim() == 4:
            x = x.contiguous(memory_format=layout)
        return moved(x)

    return run


def whole_model_program(engine: Engine, module: torch.nn.Module, device: str, example: torch.Tensor,
                        graphs: bool = True) -> Program:
    """The whole model as one step on one device (a CUDA graph on a GPU when ``graphs``): the
    single-device baseline, built on the same engine as the strategy it is compared with."""
    dev = engine[device]
    fn = device_module(module, dev)
    if dev.kind == "gpu" and graphs:
        fn = dev.call(lambda: graph_call(fn, [example.to(dev.torch_device, dev.dtype)], dev.stream))
    return with_transfers([Step(f"model@{device}", device, ("x",), ("y",), fn)], ("x",), "y", engine.devices)


def stream_frames(engine: Engine, program: Program, rows: Callable[[int, int], np.ndarray], images: int,
                  batch: int, depth: int = 2, warmup: int = 2) -> tuple[float, np.ndarray]:
    """``images`` through the program in frames of ``batch`` with ``depth`` frames in flight; returns
    (wall seconds, outputs in image order). Partial last frames are padded to the batch (fixed shapes
    for graphs) and the padding dropped."""
    def frame(start: int) -> tuple[torch.Tensor, int]:
        n = min(batch, images - start)
        x = torch.from_numpy(np.ascontiguousarray(rows(start, n)))
        if n < batch:
            x = torch.cat([x, x.new_zeros((batch - n, *x.shape[1:]))])
        return x, n

    for _ in range(warmup):
        engine.run(program, {"x": frame(0)[0]})
    stream = FrameStream(engine, program, depth)
    sizes: list[int] = []
    outs: list[Any] = []
    start = time.perf_counter()
    for offset in range(0, images, batch):
        x, n = frame(offset)
        sizes.append(n)
        outs += stream.push({"x": x})
    outs += stream.drain()
    wall = time.perf_counter() - start
    joined = np.concatenate([o[:n].float().numpy() for o, n in zip(outs, sizes, strict=True)])
    return wall, joined


def request_latencies(engine: Engine, program: Program, images: Sequence[np.ndarray], warmup: int = 3
                      ) -> tuple[list[float], np.ndarray]:
    """Batch-1 requests one after another, each timed from host input to host output."""
    for i in range(warmup):
        engine.run(program, {"x": torch.as_tensor(images[i % len(images)])[None]})
    times, outs = [], []
    for row in images:
        x = torch.as_tensor(row)[None]
        t0 = time.perf_counter()
        y = engine.run(program, {"x": x})
        times.append(time.perf_counter() - t0)
        outs.append(y.float().numpy())
    return times, np.concatenate(outs)
