"""Batch-1 latency: requests one after another, timed end to end as a caller sees them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.measurement import ExecutorReport, Measurement, percentile

if TYPE_CHECKING:
    from autohet.pool import Pool
    from autohet.run import RunContext

__all__ = ["latency_measurement", "latency_on_executor"]


def latency_measurement(ctx: RunContext, pool: Pool, strategy: str, params: dict[str, Any], times_s: list[float],
                        outputs: np.ndarray, executors: list[ExecutorReport]) -> Measurement:
    """A Measurement for a latency run: p50/p95/mean in ms; throughput = 1 / p50; outputs checked."""
    from autohet.run import precision_of

    runs = len(times_s)
    run_ctx = ctx.with_images(runs)
    ok, diff, tol, problems = run_ctx.check(outputs, np.ones(runs, dtype=np.int32), precision_of(pool),
                                            pool.simulated)
    p50 = percentile(times_s, 50)
    throughput = 1.0 / p50 if p50 > 0 else 0.0
    return Measurement(
        model=ctx.model.name, strategy=strategy, params=params, images=runs, wall_s=float(sum(times_s)),
        throughput_ips=throughput, limit_ips=throughput, efficiency=1.0, output_ok=ok, max_abs_diff=diff,
        tolerance=tol, executors=executors, failures=problems, simulated=pool.simulated,
        latency_ms={"p50": p50 * 1e3, "p95": percentile(times_s, 95) * 1e3,
                    "mean": float(np.mean(times_s)) * 1e3, "runs": runs},
        extra={"pool": pool.spec.to_dict()},
    )


def latency_on_executor(pool: Pool, ctx: RunContext, executor: int, strategy: str,
                        params: dict[str, Any], warmup: int = 5) -> Measurement:
    """The whole model on one executor, one image per request, through its dispatcher.

    The latency is the executor's own time per request (as the placement job measures its own),
    so the two compare like for like; the Ray round trip on top is reported as ``rpc_p50_ms``.
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
    m = latency_measurement(ctx, pool, strategy, params, times, np.concatenate(outs), reports)
    m.extra["rpc_p50_ms"] = percentile(round_trips, 50) * 1e3
    return m
