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
from autohet.engine.toolkit import graphed, in_layout, on_stream, time_each
from autohet.platform.gc_control import settle

__all__ = ["BatchOneServer", "device_module", "frames_through", "pinned_host", "request_example", "request_latencies",
           "served_request_latencies", "stream_frames", "timed_requests", "whole_model_program"]


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


def request_example(device: Device, image: np.ndarray) -> torch.Tensor:
    """A batch-1 request as ``served_request_latencies`` feeds it to the model: on the device, in its
    dtype and layout, a plain (not inference-mode) tensor. ``torch.compile`` guards on all of these:
    a model compiled on another form compiles again on the first request."""
    x = torch.as_tensor(np.ascontiguousarray(image))[None]
    if device.on_gpu:
        x = x.to(device.torch_device, device.dtype)
    return in_layout(x, device)


def whole_model_program(engine: Engine, module: torch.nn.Module, device: str, example: torch.Tensor,
                        graphs: bool = True) -> Program:
    """The whole model as one step on one device (a CUDA graph on a GPU when ``graphs``): the
    single-device baseline, built on the same engine as the strategy it is compared with."""
    dev = engine[device]
    fn = graphed(device_module(module, dev), dev, lambda: [example.to(dev.torch_device, dev.dtype)], graphs)
    return with_transfers([Step(f"model@{device}", device, ("x",), ("y",), fn)], ("x",), "y", engine.devices)


_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: the Ray object store maps workloads read-only


@contextmanager
def pinned_host(array: np.ndarray) -> Iterator[bool]:
    """Page-locks ``array`` in place while the block runs (cudaHostRegister), so a GPU's copy of a
    frame that is a view of it is a DMA straight from it. Without it every host-to-GPU move first
    copies the frame into pinned memory on the GPU's worker (19 MB per resnet18 frame of 32, most of a
    stage's time: docs/why.md, engine/runs.py), with CPU threads that, in a pipeline, compete with the
    CPU stage's cores.
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
    """``images`` through the program in frames of ``batch`` with ``depth`` frames in flight
    (``frames_through``), timed; returns (wall seconds, outputs in image order). ``warmup`` frames
    run first, and the collector is settled before the clock starts."""
    for _ in range(warmup):
        engine.run(program, {program.inputs[0]: _frame(rows, 0, images, batch, pinned)[0]})
    settle()
    start = time.perf_counter()
    outs = frames_through(engine, program, rows, images, batch, depth, pinned)
    wall = time.perf_counter() - start
    return wall, np.concatenate([o.float().numpy() for o in outs])


def _frame(rows: Callable[[int, int], np.ndarray], start: int, images: int, batch: int, pinned: bool
           ) -> tuple[torch.Tensor, int]:
    n = min(batch, images - start)
    x = torch.from_numpy(np.ascontiguousarray(rows(start, n)))
    if n < batch:
        x = torch.cat([x, x.new_zeros((batch - n, *x.shape[1:]))])
    if pinned and not x.is_pinned():
        x = x.pin_memory()
    return x, n


def frames_through(engine: Engine, program: Program, rows: Callable[[int, int], np.ndarray], images: int,
                   batch: int, depth: int = 2, pinned: bool = False) -> list[torch.Tensor]:
    """``images`` through the program in frames of ``batch`` with ``depth`` frames in flight
    (``FrameStream``); each frame's output rows in image order, on the host. Partial last frames are padded to the
    batch (fixed shapes for graphs) and the padding dropped. ``pinned``: ``rows`` are views of a
    pinned bank (``pinned_host``); a frame that is not (it wraps around the bank, or is padded) is
    made pinned here, on the submitting thread, so a GPU's worker never stops to stage a copy (one
    frame in 27 of resnet18's at batch 32, 19 MB each)."""
    stream = FrameStream(engine, program, depth)
    sizes: list[int] = []
    outs: list[Any] = []
    for offset in range(0, images, batch):
        x, n = _frame(rows, offset, images, batch, pinned)
        sizes.append(n)
        outs += stream.push({program.inputs[0]: x})
    outs += stream.drain()
    return [o[:n] for o, n in zip(outs, sizes, strict=True)]


def request_latencies(engine: Engine, program: Program, images: Sequence[np.ndarray], warmup: int = 3
                      ) -> tuple[list[float], np.ndarray]:
    """Batch-1 requests one after another, each timed from host input to host output."""
    times, outs = time_each(lambda x: engine.run(program, {"x": x}), [torch.as_tensor(r)[None] for r in images],
                            warmup)
    return times, np.concatenate([y.float().numpy() for y in outs])


class BatchOneServer:
    """The whole model on one device serving batch-1 requests the way a user's own loop would: on
    the device's worker (the thread that owns its cores or stream), with no step crossing threads;
    the engine's step-by-step path pays a queue hop per step, a large share of a batch-1 request
    (docs/why.md, engine/runs.py).

    On a GPU the requests are staged in pinned memory in the device's dtype and layout first (as the
    CUDA-graph peer of ``bench/peers.py`` stages its input); a request is one copy in, the model
    (with ``graph``: one CUDA-graph replay holding the model, its fp32 logits and, where torch lets
    the capture hold it, the copy back into pinned memory; a model that cannot be captured is
    served without, and ``holds`` says so), one wait. Built once (warm-up and capture here); the
    runtime serves every call through it, ``served_request_latencies`` times requests with it."""

    def __init__(self, device: Device, fn: Callable[[torch.Tensor], Any], example: np.ndarray, graph: bool = False,
                 warmup: int = 3) -> None:
        self.device, self.fn = device, fn
        self.holds = "direct"
        self.replay: Any = None
        self.static_out: Any = None
        if device.on_gpu:
            device.call(lambda: self._capture(example, graph, warmup))

    def _capture(self, example: np.ndarray, graph: bool, warmup: int) -> None:
        """The static input and pinned output, cuDNN's choices, the graph (on the GPU's worker)."""
        stream, fn = self.device.stream, self.fn
        with torch.cuda.stream(stream):  # made on the stream that reads it: no copy to order against
            self.static_in = static_in = request_example(self.device, example)
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(warmup):  # cuDNN picks its algorithms here, not inside a capture
                probe = fn(static_in).float()
            stream.synchronize()
            self.out_host = out_host = torch.empty(probe.shape, dtype=torch.float32, pin_memory=True)
            if not graph:
                return
            try:
                replay, holds = torch.cuda.CUDAGraph(), "cuda graph: model+copy-out"
                with torch.cuda.graph(replay, stream=stream, capture_error_mode="thread_local"):
                    out_host.copy_(fn(static_in).float(), non_blocking=True)
            except RuntimeError:  # this torch refuses device-to-host copies in a capture: copy after
                stream.synchronize()
                try:
                    replay, holds = torch.cuda.CUDAGraph(), "cuda graph: model"
                    with torch.cuda.graph(replay, stream=stream, capture_error_mode="thread_local"):
                        self.static_out = fn(static_in).float()
                except RuntimeError as exc:  # a host sync inside the model: served without a graph
                    stream.synchronize()
                    replay, self.static_out = None, None
                    holds = f"direct (capture failed: {str(exc).splitlines()[0][:80]})"
            self.replay, self.holds = replay, holds

    def stage(self, images: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """The requests in the form ``one`` takes (on the worker): on a GPU, views of one pinned bank
        in the device's dtype and layout; elsewhere each in the form a compiled model was compiled on."""
        if not self.device.on_gpu:
            return [request_example(self.device, r) for r in images]
        stacked = torch.stack([torch.as_tensor(r) for r in images]).to(self.device.dtype)
        bank = in_layout(stacked, self.device).pin_memory()
        return [bank[i : i + 1] for i in range(bank.shape[0])]

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Where ``one`` runs (on the worker): inference mode, and a GPU's stream current."""
        with on_stream(self.device), torch.inference_mode():
            yield

    def one(self, x: torch.Tensor) -> np.ndarray:
        """One staged request to its fp32 output row, waited for (inside ``serving``)."""
        if not self.device.on_gpu:
            return self.fn(x).float().numpy().copy()
        self.static_in.copy_(x, non_blocking=True)
        if self.replay is None:
            self.out_host.copy_(self.fn(self.static_in).float(), non_blocking=True)
        else:
            self.replay.replay()
            if self.static_out is not None:
                self.out_host.copy_(self.static_out, non_blocking=True)
        self.device.stream.synchronize()
        return self.out_host.numpy().copy()

    def __call__(self, images: np.ndarray) -> np.ndarray:
        """Each image a request, one after another on the device's worker; the outputs joined."""
        def serve() -> np.ndarray:
            requests = self.stage(list(images))
            with self.serving():
                return np.concatenate([self.one(x) for x in requests])

        return self.device.call(serve)


def served_request_latencies(device: Device, fn: Callable[[torch.Tensor], Any], images: Sequence[np.ndarray],
                             graph: bool = False, warmup: int = 3) -> tuple[list[float], np.ndarray, str]:
    """Batch-1 requests of the whole model on one device served by a ``BatchOneServer``
    (``timed_requests``). Returns (seconds per request, outputs, how it was served)."""
    return timed_requests(BatchOneServer(device, fn, images[0], graph, warmup), images, warmup)


def timed_requests(server: BatchOneServer, images: Sequence[np.ndarray], warmup: int = 3
                   ) -> tuple[list[float], np.ndarray, str]:
    """Each image a request through the server, one after another on its device's worker, each timed
    from host input to host output after ``warmup`` untimed ones: (seconds each, outputs, ``holds``)."""
    def serve() -> tuple[list[float], np.ndarray, str]:
        requests = server.stage(images)
        with server.serving():
            return (*_time_each(server.one, requests, warmup), server.holds)

    return server.device.call(serve)


def _time_each(one: Callable[[Any], np.ndarray], requests: Sequence[Any], warmup: int
               ) -> tuple[list[float], np.ndarray]:
    """``one`` on each request after ``warmup`` untimed ones: (seconds each, outputs joined)."""
    times, outs = time_each(one, requests, warmup)
    return times, np.concatenate(outs)
