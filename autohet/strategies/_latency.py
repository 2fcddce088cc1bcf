"""Batch-1 latency of the whole model on one executor: the single-device baseline of every
latency strategy, run on the same in-process engine and timed the same way (host input to host
output), with the executor's backend: eager, a CUDA graph, or inductor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from autohet.engine import EngineJob, Step, device_module, request_latencies, with_transfers
from autohet.executors.compiled import compile_module, graph_call
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
    """The whole model on one device with its executor's backend, batch-1 requests timed one by one."""

    def __init__(self, model: ModelSpec, images: np.ndarray, spec: ExecutorSpec) -> None:
        self.model, self.images, self.spec = model, images, spec

    def run(self, engine: Engine) -> dict[str, Any]:
        dev = engine[self.spec.name]
        fn = device_module(build_model(self.model), dev)
        example = torch.as_tensor(self.images[0])[None].to(dev.torch_device, dev.dtype)
        compile_s = 0.0
        if self.spec.backend == "cudagraphs" and dev.kind == "gpu":
            fn = dev.call(lambda: graph_call(fn, [example], dev.stream))
        elif self.spec.backend == "inductor":
            fn, compile_s = dev.call(lambda: compile_module(fn, self.spec.inductor_mode, example))
        program = with_transfers([Step(f"model@{dev.name}", dev.name, ("x",), ("y",), fn)], ("x",), "y",
                                 engine.devices)
        times, outputs = request_latencies(engine, program, list(self.images))
        return {"times_s": times, "outputs": outputs, "backend": self.spec.backend, "compile_s": compile_s}


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
    m.extra.update(backend=out["backend"], compile_s=out["compile_s"])
    return m
