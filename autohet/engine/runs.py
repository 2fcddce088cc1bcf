"""Running programs the two ways strategies are measured: a stream of frames (throughput) and
batch-1 requests one after another (latency); and the whole model on one device, the baseline
every in-process strategy is compared with in the same run.

A program here takes one input value ``x`` (a batch in host memory) and returns the model's
output in host memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from autohet.engine.devices import Device
from autohet.engine.program import Engine, FrameStream, Program, Step, with_transfers
from autohet.executors.compiled import graph_call
from autohet.heap import settle

__all__ = ["device_module", "pinned_host", "request_example", "request_latencies", "served_request_latencies",
           "stream_frames", "whole_model_program"]


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


def _in_layout(x: torch.Tensor, device: Device) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if device.channels_last and x.dim() == 4 else x


def request_example(device: Device, image: np.ndarray) -> torch.Tensor:
    """A batch-1 request as ``served_request_latencies`` feeds it to the model: on the device, in its
    dtype and layout, a plain (not inference-mode) tensor. ``torch.compile`` guards on all of these:
    a model compiled on another form compiles again on the first request."""
    x = torch.as_tensor(np.ascontiguousarray(image))[None]
    if device.kind == "gpu":
        x = x.to(device.torch_device, device.dtype)
    return _in_layout(x, device)


def whole_model_program(engine: Engine, module: torch.nn.Module, device: str, example: torch.Tensor,
                        graphs: bool = True) -> Program:
    """The whole model as one step on one device (a CUDA graph on a GPU when ``graphs``): the
    single-device baseline, built on the same engine as the strategy it is compared with."""
    dev = engine[device]
    fn = device_module(module, dev)
    if dev.kind == "gpu" and graphs:
        fn = dev.call(lambda: graph_call(fn, [example.to(dev.torch_device, dev.dtype)], dev.stream))
    return with_transfers([Step(f"model@{device}", device, ("x",), ("y",), fn)], ("x",), "y", engine.devices)


_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: the Ray object store maps workloads read-only


@contextmanager
def pinned_host(array: np.ndarray) -> Iterator[bool]:
    """Page-locks ``array`` in place while the block runs (cudaHostRegister), so a GPU's copy of a
    frame that is a view of it is a DMA straight from it. Without it every host-to-GPU move first
    copies the frame into pinned memory on the GPU's worker: 19 MB per resnet18 frame of 32, about
    1 ms of a 1.4 ms stage, with CPU threads that, in a pipeline, compete with the CPU stage's cores.
    Yields whether the array is pinned (not where there is no GPU or the driver refuses)."""
    if not torch.cuda.is_available() or array.nbytes == 0 or not array.flags.c_contiguous:
        yield False
        return
    cudart = torch.cuda.cudart()
    ptr = array.ctypes.data
    flags = 0 if array.flags.writeable else _REGISTER_READ_ONLY
    ok = int(cudart.cudaHostRegister(ptr, array.nbytes, flags)) == 0
    if not ok:
        _clear_cuda_error()
    try:
        yield ok
    finally:
        if ok:
            cudart.cudaHostUnregister(ptr)


def _clear_cuda_error() -> None:
    """Resets the CUDA runtime's last error after a refused registration (else the next kernel
    launch check would raise it), through the libcudart torch has loaded."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart" in line}
    for path in paths:
        ctypes.CDLL(path).cudaGetLastError()


def stream_frames(engine: Engine, program: Program, rows: Callable[[int, int], np.ndarray], images: int,
                  batch: int, depth: int = 2, warmup: int = 2, pinned: bool = False) -> tuple[float, np.ndarray]:
    """``images`` through the program in frames of ``batch`` with ``depth`` frames in flight; returns
    (wall seconds, outputs in image order). Partial last frames are padded to the batch (fixed shapes
    for graphs) and the padding dropped. ``pinned``: ``rows`` are views of a pinned bank
    (``pinned_host``); a frame that is not (it wraps around the bank, or is padded) is made pinned
    here, on the submitting thread, so a GPU's worker never stops to stage a copy (one frame in 27
    of resnet18's at batch 32, 19 MB each). The collector is settled before the clock starts."""
    def frame(start: int) -> tuple[torch.Tensor, int]:
        n = min(batch, images - start)
        x = torch.from_numpy(np.ascontiguousarray(rows(start, n)))
        if n < batch:
            x = torch.cat([x, x.new_zeros((batch - n, *x.shape[1:]))])
        if pinned and not x.is_pinned():
            x = x.pin_memory()
        return x, n

    for _ in range(warmup):
        engine.run(program, {"x": frame(0)[0]})
    stream = FrameStream(engine, program, depth)
    settle()
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
    settle()
    times, outs = [], []
    for row in images:
        x = torch.as_tensor(row)[None]
        t0 = time.perf_counter()
        y = engine.run(program, {"x": x})
        times.append(time.perf_counter() - t0)
        outs.append(y.float().numpy())
    return times, np.concatenate(outs)


def served_request_latencies(device: Device, fn: Callable[[torch.Tensor], Any], images: Sequence[np.ndarray],
                             graph: bool = False, warmup: int = 3) -> tuple[list[float], np.ndarray, str]:
    """Batch-1 requests of the whole model on one device, served the way a user's own loop would:
    on the device's worker (the thread that owns its cores or stream), with no step crossing
    threads; the engine's step-by-step path pays a queue hop per step, a large share of a 0.4 ms
    request. Each request is timed from host input to host output. Returns (seconds per request,
    outputs, how it was served).

    On a GPU the requests are staged in pinned memory in the device's dtype and layout first (as the
    CUDA-graph peer of ``bench/peers.py`` stages its input); a request is one copy in, the model
    (with ``graph``: one CUDA-graph replay holding the model, its fp32 logits and, where torch lets
    the capture hold it, the copy back into pinned memory; a model that cannot be captured is
    served without, and says so), one wait."""
    if device.kind != "gpu":
        def serve_host() -> tuple[list[float], np.ndarray, str]:
            rows = [request_example(device, r) for r in images]  # in the form a compiled model was compiled on
            with torch.inference_mode():
                return (*_time_each(lambda x: fn(x).float().numpy().copy(), rows, warmup), "direct")
        return device.call(serve_host)

    def serve() -> tuple[list[float], np.ndarray, str]:
        bank = _in_layout(torch.stack([torch.as_tensor(r) for r in images]).to(device.dtype), device).pin_memory()
        requests = [bank[i : i + 1] for i in range(bank.shape[0])]
        stream = device.stream
        with torch.cuda.stream(stream):  # made on the stream that reads it: no copy to order against
            static_in = request_example(device, images[0])
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(warmup):  # cuDNN picks its algorithms here, not inside a capture
                probe = fn(static_in).float()
            stream.synchronize()
            out_host = torch.empty(probe.shape, dtype=torch.float32, pin_memory=True)
            replay, holds, static_out = None, "direct", None
            if graph:
                try:
                    replay, holds = torch.cuda.CUDAGraph(), "cuda graph: model+copy-out"
                    with torch.cuda.graph(replay, stream=stream, capture_error_mode="thread_local"):
                        out_host.copy_(fn(static_in).float(), non_blocking=True)
                except RuntimeError:  # this torch refuses device-to-host copies in a capture: copy after
                    stream.synchronize()
                    try:
                        replay, holds = torch.cuda.CUDAGraph(), "cuda graph: model"
                        with torch.cuda.graph(replay, stream=stream, capture_error_mode="thread_local"):
                            static_out = fn(static_in).float()
                    except RuntimeError as exc:  # a host sync inside the model: served without a graph
                        stream.synchronize()
                        replay, static_out = None, None
                        holds = f"direct (capture failed: {str(exc).splitlines()[0][:80]})"

            def one(x: torch.Tensor) -> np.ndarray:
                static_in.copy_(x, non_blocking=True)
                if replay is None:
                    out_host.copy_(fn(static_in).float(), non_blocking=True)
                else:
                    replay.replay()
                    if static_out is not None:
                        out_host.copy_(static_out, non_blocking=True)
                stream.synchronize()
                return out_host.numpy().copy()

            return (*_time_each(one, requests, warmup), holds)

    return device.call(serve)


def _time_each(one: Callable[[Any], np.ndarray], requests: Sequence[Any], warmup: int
               ) -> tuple[list[float], np.ndarray]:
    """``one`` on each request after ``warmup`` untimed ones: (seconds each, outputs joined)."""
    for i in range(warmup):
        one(requests[i % len(requests)])
    settle()
    times, outs = [], []
    for x in requests:
        t0 = time.perf_counter()
        outs.append(one(x))
        times.append(time.perf_counter() - t0)
    return times, np.concatenate(outs)
