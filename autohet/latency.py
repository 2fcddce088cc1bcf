"""Batch-1 latency: requests one after another, timed end to end as a caller sees them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.measurement import ExecutorReport, Measurement, percentile
from autohet.strategies._driver import DriveResult

if TYPE_CHECKING:
    from autohet.pool import Pool
    from autohet.run import RunContext

__all__ = ["latency_measurement", "latency_on_executor"]


def latency_measurement(ctx: RunContext, pool: Pool, strategy: str, params: dict[str, Any], times_s: list[float],
                        outputs: np.ndarray, executors: list[ExecutorReport]) -> Measurement:
    """A Measurement for a latency run: p50/p95/mean in ms; throughput = 1 / p50; outputs checked."""
    runs = len(times_s)
    run_ctx = ctx.with_images(runs)
    coverage = np.ones(runs, dtype=np.int32)
    result = DriveResult(outputs, coverage, [], float(sum(times_s)), [e.images for e in executors],
                         [e.busy_s for e in executors], [], [e.died for e in executors])
    p50 = percentile(times_s, 50)
    m = run_ctx.measurement(pool, strategy, params, result, [e.standalone_ips for e in executors])
    m.latency_ms = {"p50": p50 * 1e3, "p95": percentile(times_s, 95) * 1e3,
                    "mean": float(np.mean(times_s)) * 1e3, "runs": runs}
    m.throughput_ips = 1.0 / p50 if p50 > 0 else 0.0
    m.limit_ips = m.throughput_ips
    m.efficiency = 1.0
    return m


def latency_on_executor(pool: Pool, ctx: RunContext, executor: int, strategy: str,
                        params: dict[str, Any], warmup: int = 5) -> Measurement:
    """The whole model on one executor, one image per request, through its dispatcher."""
    dispatcher = pool.dispatcher()
    runs = ctx.latency_runs
    for i in range(warmup):
        dispatcher.submit(executor, i % ctx.workload.images, 1)
        dispatcher.wait_any()
    times, outs = [], []
    for i in range(runs):
        dispatcher.submit(executor, i, 1)
        done = dispatcher.wait_any()
        if not done.ok or done.outputs is None:
            raise RuntimeError(f"executor {pool.names[executor]} failed during the latency run: {done.error}")
        times.append(done.done_s - done.submitted_s)
        outs.append(done.outputs)
    dispatcher.close()
    reports = [ExecutorReport(s.name, s.device, runs if k == executor else 0,
                              float(sum(times)) if k == executor else 0.0, 0.0, s.kind == "sim")
               for k, s in enumerate(pool.spec.executors)]
    return latency_measurement(ctx, pool, strategy, params, times, np.concatenate(outs), reports)
