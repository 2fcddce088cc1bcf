"""Batch-1 latency of the whole model on one executor: the single-device baseline of every
latency strategy, timed like them from host input to host output, with the executor's backend
(eager, a CUDA graph, or inductor) and served on the device's own thread, as a user's serving
loop would be (no step of a request crosses threads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.core.measurement import ExecutorReport, Measurement
from autohet.core.models import ModelSpec, build_model
from autohet.engine import (
    BatchOneServer,
    EngineJob,
    EngineResult,
    build_engine,
    device_module,
    request_example,
    timed_requests,
)
from autohet.executors.compiled import compile_module
from autohet.strategies._inprocess import run_on_engine
from autohet.strategies.registry import BASELINE
from autohet.strategies.served import Served

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.engine import Engine
    from autohet.executors import ExecutorSpec
    from autohet.pool import Pool

__all__ = ["SingleLatencyJob", "SingleLatencyServed", "latency_on_executor", "single_server"]


def single_server(engine: Engine, model: ModelSpec, spec: ExecutorSpec, example: np.ndarray
                  ) -> tuple[BatchOneServer, float]:
    """The whole model on the executor's engine device with its backend, ready for batch-1 requests
    (compiled and captured now); returns it and the seconds compiling took. A GPU with ``cudagraphs``
    (or ``inductor``, its compiled kernels captured) runs each request as one graph replay, as the
    CUDA-graph peer a user would write does."""
    dev = engine[spec.name]
    fn = device_module(build_model(model), dev)
    compile_s = 0.0
    if spec.compiles:  # compiled on a request as it will be served (no recompile)
        fn, compile_s = dev.call(lambda: compile_module(fn, spec.inductor_mode, request_example(dev, example)))
    # inductor's kernels captured in a CUDA graph too (torch.compile's "reduce-overhead" idea): at
    # batch 1 a GPU is launch-bound, and fused kernels shorten the graph itself
    graph = spec.request_graph and dev.on_gpu
    return BatchOneServer(dev, fn, example, graph), compile_s


class SingleLatencyJob(EngineJob):
    """The whole model on one device with its executor's backend (``single_server``), batch-1
    requests timed one by one, served on the device's own thread (``timed_requests``)."""

    def __init__(self, model: ModelSpec, images: np.ndarray, spec: ExecutorSpec) -> None:
        self.model, self.images, self.spec = model, images, spec

    def run(self, engine: Engine) -> EngineResult:
        server, compile_s = single_server(engine, self.model, self.spec, self.images[0])
        times, outputs, served = timed_requests(server, list(self.images))
        return EngineResult(outputs, times_s=times,
                            report={"backend": self.spec.backend, "served": served, "compile_s": compile_s})


class SingleLatencyServed(Served):
    """A latency config of ``single``: each image of a call a batch-1 request on the executor's
    device, one after another, exactly as the run timed them (``single_server``), on an engine of
    this process."""

    def __init__(self, spec: ExecutorSpec, model: ModelSpec, example: np.ndarray) -> None:
        self.engine = build_engine([spec])
        self.precision, self.cores, self.deaths = spec.precision, frozenset(spec.cores), []
        try:
            self.server, self.compile_s = single_server(self.engine, model, spec, example)
        except BaseException:
            self.engine.close()
            raise

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return self.server(images)

    def describe(self) -> dict[str, Any]:
        return {"device": self.server.device.name, "served": self.server.holds}

    def close(self) -> None:
        self.engine.close()


def latency_on_executor(pool: Pool, ctx: RunContext, executor: int, strategy: str,
                        params: dict[str, Any]) -> Measurement:
    """Batch-1 latency of the whole model on one executor of the pool (see module doc)."""
    spec = pool.spec.executors[executor]
    images = np.ascontiguousarray(ctx.workload.rows(0, min(ctx.latency_runs, ctx.workload.images)))
    out = run_on_engine(pool, SingleLatencyJob(ctx.model, images, spec), [spec], ctx.deadline_s, BASELINE)
    times = out.times_s or []
    reports = [ExecutorReport(s.name, s.device, len(times) if k == executor else 0,
                              float(sum(times)) if k == executor else 0.0, 0.0, s.simulated)
               for k, s in enumerate(pool.spec.executors)]
    m = ctx.latency_measurement(pool, strategy, params, times, out.outputs, reports, spec.precision)
    m.extra.update(out.report)
    return m
