"""OpenVINO's CPU plugin: the model converted to IR once, compiled per executor with its threads,
precision and streams, fed by asynchronous infer requests so every stream stays busy.

Threads: OpenVINO sizes its thread pool from the *process's* CPU mask at its first compile and, with
``ENABLE_CPU_PINNING``, re-pins the calling thread to that mask. An executor actor runs on its
process's main thread, pinned to the group's cores before anything compiles, so its OpenVINO threads
stay on those cores. An in-process executor (a thread of a bigger process) compiles with pinning off
and ``INFERENCE_NUM_THREADS`` = its cores: its own thread stays pinned, and OpenVINO's helper threads
(more than one core or stream) may run on any core of the process.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.executors.cpu_backends._base import CpuBackend, CpuProgram, ModelSource
from autohet.executors.cpu_backends._cache import converted

if TYPE_CHECKING:
    from autohet.executors.base import ExecutorSpec

__all__ = ["OpenVinoBackend", "OpenVinoProgram", "piece_size"]

_CORE: Any = None
_CORE_LOCK = threading.Lock()


def _core() -> Any:
    global _CORE
    with _CORE_LOCK:
        if _CORE is None:
            import openvino as ov

            _CORE = ov.Core()
    return _CORE


def _owns_process(cores: tuple[int, ...]) -> bool:
    """Whether the calling thread is the process's main thread, already pinned to ``cores`` (an actor)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(os, "sched_getaffinity"):
        return False
    return os.sched_getaffinity(0) == set(cores)


def piece_size(images: int, requests: int, most: int) -> int:
    """Images per infer request for a call of ``images``: spread evenly over the requests, at most ``most``."""
    return min(most, max(1, -(-images // requests)))


class _Call:
    """One call's pieces: its output rows, filled by position as pieces complete; ``done`` when all have."""

    def __init__(self, images: int, classes: int) -> None:
        self.out = np.empty((images, classes), dtype=np.float32)
        self.left = 0  # pieces queued or running
        self.done = threading.Event()


class OpenVinoProgram(CpuProgram):
    """A compiled model and an infer-request queue over it, a batch per request.

    The model has a static batch (a call's last partial batch padded with zero rows), as OpenVINO's own
    THROUGHPUT peer: with a dynamic batch OpenVINO's THROUGHPUT hint ran far fewer streams than the static
    batch, and explicit streams on a dynamic batch ran slower than the peer (docs/why.md,
    executors/cpu_backends/_openvino.py). A call of several batches gives a batch to each free request; the
    executor sends calls of enough batches (``fill_images``) that two in flight keep every request busy.
    ``OpenVinoBackend.dynamic_batch`` (kept to measure against, ``bench.cpu_executor_sweep``) builds the
    earlier dynamic-batch model instead, whose calls are spread over the requests in even pieces of at
    most a batch (``piece_size``).

    Asynchronous (``launch``/``collect``): a launched call's pieces wait in one FIFO of pieces and go to
    the requests as they free up; ``collect`` feeds that FIFO until its call is done, so pieces of a call
    launched after it (the executor's next part, ``run_ahead``) start on the requests its last pieces
    free: the streams do not drain at a call boundary (one stream idles through the last piece of a call
    whose pieces do not divide evenly over the requests, e.g. 8 pieces over 3 streams) and stay busy
    while the actor returns this call and takes the next. One caller thread at a time."""

    asynchronous = True

    def __init__(self, compiled: Any, batch: int, shape: tuple[int, ...], queue: Any = None) -> None:
        self.compiled, self.shape = compiled, shape
        self.requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.static = compiled.input(0).get_partial_shape().is_static
        self.batch = batch  # images per request where the shape is static
        self.most = batch  # most images per request otherwise: a call's images are spread evenly over all requests
        self.classes = compiled.output(0).get_partial_shape()[1].get_length()
        if queue is None:  # ``queue``: a test's stand-in for OpenVINO's
            import openvino as ov

            queue = ov.AsyncInferQueue(compiled, self.requests)
        self.queue = queue
        self.queue.set_callback(self._done)
        self.pending: deque[tuple[_Call, int, np.ndarray, int]] = deque()  # (call, offset, rows, count) not yet started
        self.calls: list[_Call] = []  # launched, not known done
        self._lock = threading.Lock()  # callbacks of two requests may run at once

    def _done(self, request: Any, where: tuple[_Call, int, int]) -> None:
        call, start, count = where
        call.out[start : start + count] = request.get_output_tensor(0).data[:count]  # copied: the request is reused
        with self._lock:
            call.left -= 1
            last = call.left == 0
        if last:
            call.done.set()

    def _start_next(self) -> None:
        """Starts the oldest waiting piece on the next free request (waits for one where none is free)."""
        call, offset, rows, count = self.pending.popleft()
        self.queue.start_async({0: rows}, (call, offset, count))

    def launch(self, x: np.ndarray, batch: int) -> _Call:
        x = np.ascontiguousarray(x, dtype=np.float32)
        call = _Call(len(x), self.classes)
        piece = self.batch if self.static else piece_size(len(x), self.requests, self.most)
        for offset in range(0, len(x), piece):
            rows = x[offset : offset + piece]
            count = len(rows)
            if self.static and count < self.batch:  # one compiled shape: a partial batch padded with zero rows
                rows = np.concatenate([rows, np.zeros((self.batch - count, *rows.shape[1:]), np.float32)])
            self.pending.append((call, offset, rows, count))
            call.left += 1
        if not call.left:
            call.done.set()
        self.calls = [c for c in self.calls if not c.done.is_set()] + [call]
        while self.pending and self.queue.is_ready():  # what fits now; the rest goes as requests free up
            self._start_next()
        return call

    def collect(self, call: _Call) -> np.ndarray:
        while not call.done.is_set():
            if self.pending:  # this call's pieces first (FIFO), then later calls' onto the requests it frees
                self._start_next()
            else:
                self._wait(call)
        return call.out

    def _wait(self, call: _Call) -> None:
        """Waits for ``call``'s running pieces (none of it is waiting). With no later call unfinished,
        everything running is this call's (or a dropped call's): ``wait_all``, which also raises a failed
        piece's error. Else its event; a failed piece surfaces once every request is idle."""
        if not any(c is not call and not c.done.is_set() for c in self.calls):
            self.queue.wait_all()
        while not call.done.wait(1.0):
            if self.queue.is_ready() and all(self.queue[k].wait_for(0) for k in range(self.requests)):
                self.queue.wait_all()  # every request idle and the call not done: raises the failed piece's error
                if not call.done.is_set():
                    raise RuntimeError("OpenVINO finished every request without completing the call")

    def drop(self, call: _Call) -> None:
        """Forgets a launched call that will not be collected: its pieces not yet started never start."""
        self.pending = deque(p for p in self.pending if p[0] is not call)
        self.calls = [c for c in self.calls if c is not call]

    def drain(self) -> None:
        self.queue.wait_all()

    def run(self, x: np.ndarray, batch: int) -> np.ndarray:
        return self.collect(self.launch(x, batch))

    def warm_images(self, unit: int) -> int:
        """Every request's first inference sets up its stream: a static model warms with a batch per
        request. A dynamic-batch model prepares each new piece size on each stream the first time it meets
        it: one call of a piece per request warms the size a ``unit``-image call is cut into."""
        if self.static:
            return self.batch * self.requests if self.requests > 1 else 0
        return self.requests * piece_size(unit, self.requests, self.most)

    def fill_images(self, batch: int) -> int:
        """A batch per request with a static model; a dynamic one spreads a single batch over them all."""
        return batch * self.requests if self.static else batch

    def describe(self) -> dict[str, Any]:
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # what runs: bf16 or f32
        return {"openvino_precision": hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint),
                "openvino_streams": int(self.compiled.get_property("NUM_STREAMS")),
                "openvino_threads": int(self.compiled.get_property("INFERENCE_NUM_THREADS")),
                "openvino_requests": self.requests}


class OpenVinoBackend(CpuBackend):
    name = "openvino"
    precisions = ("fp32", "bf16")
    warm_full_batch = True
    asynchronous = True
    dynamic_batch = False  # the earlier dynamic-batch model, kept to measure against (see OpenVinoProgram)

    def missing(self) -> str | None:
        try:
            import openvino  # noqa: F401
        except ImportError:
            return "openvino is not installed (pip install openvino)"
        return None

    def refuse(self, precision: str) -> str | None:
        from autohet.executors.machine import native_cpu_bf16

        if precision == "bf16" and not native_cpu_bf16():
            return ("OpenVINO bf16 needs AVX512-BF16 or AMX (this CPU would run it as f32 under a bf16 label); "
                    "set precision: fp32")
        return super().refuse(precision)

    def variant_key(self, spec: ExecutorSpec) -> tuple:
        return (*super().variant_key(spec), spec.batch, spec.streams)

    def build(self, source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...]) -> CpuProgram:
        import openvino as ov
        import torch

        def write(path: Any) -> None:
            example = torch.zeros((1, *shape))
            model = ov.convert_model(source.module().eval(), example_input=example, input=[(-1, *shape)])
            ov.save_model(model, str(path), compress_to_fp16=False)  # fp16 weights would differ by ~2e-3

        started = time.perf_counter()
        xml = converted("openvino", source, shape, f"openvino-{ov.__version__}", (".xml", ".bin"), write)
        model = _core().read_model(str(xml))
        threads = max(1, len(spec.cores))
        # a static batch where a dynamic one gains nothing: it ran lenet's batch 1 faster (docs/why.md,
        # executors/cpu_backends/_openvino.py)
        if not self.dynamic_batch or spec.streams == 1 or threads == 1:
            model.reshape([spec.batch, *shape])
        config: dict[str, Any] = {
            # explicit: on AMX and AVX512-BF16 CPUs OpenVINO's default is bf16, so fp32 must be asked for
            "INFERENCE_PRECISION_HINT": "bf16" if spec.precision == "bf16" else "f32",
            "INFERENCE_NUM_THREADS": threads,
            "ENABLE_CPU_PINNING": _owns_process(spec.cores),
        }
        if spec.streams:
            config["NUM_STREAMS"] = min(spec.streams, threads)
        else:
            config["PERFORMANCE_HINT"] = "THROUGHPUT"
        program = OpenVinoProgram(_core().compile_model(model, "CPU", config), spec.batch, shape)
        program.compile_s = time.perf_counter() - started
        return program
