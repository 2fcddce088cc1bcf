"""Batch-1 latency of the whole model on one executor: the single-device baseline of every
latency strategy, timed like them from host input to host output, with the executor's backend
(eager, a CUDA graph, or inductor) and served on the device's own thread, as a user's serving
loop would be (no step of a request crosses threads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.engine import EngineJob, device_module, request_example, served_request_latencies
from autohet.executors.compiled import compile_module
from autohet.measurement import ExecutorReport, Measurement
from autohet.models import ModelSpec, build_model
from autohet.strategies._inprocess import run_on_engine

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.engine import Engine
    from autohet.executors import ExecutorSpec
    from autohet.pool import Pool

__all__ = ["SingleLatencyJob", "latency_on_executor"]


class SingleLatencyJob(EngineJob):
    """The whole model on one device with its executor's backend, batch-1 requests timed one by one,
    served on the device's own thread (``served_request_latencies``): a GPU with ``cudagraphs`` (or
    ``inductor``, its compiled kernels captured) runs each request as one graph replay, as the
    CUDA-graph peer a user would write does."""

    def __init__(self, model: ModelSpec, images: np.ndarray, spec: ExecutorSpec) -> None:
        self.model, self.images, self.spec = model, images, spec

    def run(self, engine: Engine) -> dict[str, Any]:
        dev = engine[self.spec.name]
        fn = device_module(build_model(self.model), dev)
        compile_s = 0.0
        if self.spec.backend == "inductor":  # compiled on a request as it will be served (no recompile)
            example = request_example(dev, self.images[0])
            fn, compile_s = dev.call(lambda: compile_module(fn, self.spec.inductor_mode, example))
        # inductor's kernels captured in a CUDA graph too (torch.compile's "reduce-overhead" idea): at
        # batch 1 a GPU is launch-bound, and fused kernels shorten the graph itself
        graph = self.spec.backend in ("cudagraphs", "inductor") and dev.kind == "gpu"
        times, outputs, served = served_request_latencies(dev, fn, list(self.images), graph=graph)
        return {"times_s": times, "outputs": outputs, "backend": self.spec.backend, "served": served,
                "compile_s": compile_s}


def latency_on_executor(pool: Pool, ctx: RunContext, executor: int, strategy: str,
                        params: dict[str, Any]) -> Measurement:
    """Batch-1 latency of the whole model on one executor of the pool (see module doc)."""
    spec = pool.spec.executors[executor]
    images = np.ascontiguousarray(ctx.workload.rows(0, min(ctx.latency_runs, ctx.workload.images)))
    out = run_on_engine(pool, SingleLatencyJob(ctx.model, images, spec), [spec], ctx.deadline_s, "single")
    times = out["times_s"]
    reports = [ExecutorReport(s.name, s.device, len(times) if k == executor else 0,
                              float(sum(times)) if k == executor else 0.0, 0.0, s.kind == "sim")
               for k, s in enumerate(pool.spec.executors)]
    m = ctx.latency_measurement(pool, strategy, params, times, out["outputs"], reports, spec.precision)
    m.extra.update(backend=out["backend"], served=out["served"], compile_s=out["compile_s"])
    return m
