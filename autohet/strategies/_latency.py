"""Batch-1 latency of the whole model on one executor, timed as the executor sees each request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.measurement import ExecutorReport, Measurement, percentile

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.pool import Pool

__all__ = ["latency_on_executor"]


def latency_on_executor(pool: Pool, ctx: RunContext, executor: int, strategy: str,
                        params: dict[str, Any], warmup: int = 5) -> Measurement:
    """The whole model on one executor, one image per request, through its dispatcher.

    The latency is the executor's own time per request (as the in-process strategies measure
    theirs), so the two compare like for like; the Ray round trip on top is reported as ``rpc_p50_ms``.
    """
    dispatcher = pool.dispatcher()
    runs = ctx.latency_runs
    for i in range(warmup):
        dispatcher.submit(executor, i % ctx.workload.images, 1)
        dispatcher.wait_any()
    times, round_trips, outs = [], [], []
    for i in range(runs):
        dispatcher.submit(executor, i, 1)
        done = dispatcher.wait_any()
        if not done.ok or done.outputs is None:
            raise RuntimeError(f"executor {pool.names[executor]} failed during the latency run: {done.error}")
        times.append(done.compute_s)
        round_trips.append(done.done_s - done.submitted_s)
        outs.append(done.outputs)
    dispatcher.close()
    reports = [ExecutorReport(s.name, s.device, runs if k == executor else 0,
                              float(sum(times)) if k == executor else 0.0, 0.0, s.kind == "sim")
               for k, s in enumerate(pool.spec.executors)]
    m = ctx.latency_measurement(pool, strategy, params, times, np.concatenate(outs), reports,
                                pool.spec.executors[executor].precision)
    m.extra["rpc_p50_ms"] = percentile(round_trips, 50) * 1e3
    return m
