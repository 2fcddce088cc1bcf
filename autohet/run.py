"""One run of a strategy on a pool: standalone limits, the run, the output check, the Measurement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.measurement import ExecutorReport, Measurement
from autohet.models import ModelSpec, build_model
from autohet.pool.dispatch import Completion
from autohet.workload import Workload

if TYPE_CHECKING:
    from autohet.pool import Pool
    from autohet.strategies._driver import DriveResult

__all__ = ["RunContext", "TOLERANCE", "precision_of", "run_strategy"]

# Allowed max |out - ref| relative to max |ref|, by the least precise executor's precision.
TOLERANCE = {"fp32": 1e-3, "tf32": 5e-3, "fp16": 1e-2, "bf16": 5e-2}
_ORDER = ["fp32", "tf32", "fp16", "bf16"]


@dataclass
class RunContext:
    """The model and workload of a run, the reference for the output check, run-wide settings."""

    model: ModelSpec
    workload: Workload
    check_images: int = 64
    standalone_seconds: float = 1.0
    on_event: Callable[[Completion], None] | None = None
    objective: str = "throughput"
    latency_runs: int = 50
    standalone_provider: Callable[[Pool, int], list[float]] | None = None
    deadline_s: float | None = None  # a data-parallel run that takes longer raises RunTimeout
    lookahead: bool = True  # GPUs get their next unit while the current one drains (off: for A/B benches)
    _reference: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def standalone(self, pool: Pool) -> list[float]:
        """Each executor's standalone throughput (the limit is their sum): measured now, or by the
        provider (the tuner measures once per executor configuration and reuses it)."""
        share = max(1, self.workload.images // max(1, len(pool)))
        if self.standalone_provider is not None:
            return self.standalone_provider(pool, share)
        return pool.standalone_ips(self.standalone_seconds, share)

    def with_images(self, images: int) -> RunContext:
        """The same context over the first ``images`` images of the same bank (reference kept)."""
        return RunContext(self.model, Workload(self.workload.bank, images), self.check_images,
                          self.standalone_seconds, self.on_event, self.objective, self.latency_runs,
                          self.standalone_provider, self.deadline_s, self.lookahead, self._reference)

    def reference(self, indices: np.ndarray, simulated: bool) -> np.ndarray:
        """Single-device fp32 CPU outputs for ``indices`` (cached per run context)."""
        key = f"{simulated}:{len(indices)}:{hash(indices.tobytes())}"
        if key not in self._reference:
            if simulated:
                self._reference[key] = indices.astype(np.float32).reshape(-1, 1)
            else:
                import torch

                model = build_model(self.model)
                outs = []
                with torch.inference_mode():
                    for lo in range(0, len(indices), 16):
                        batch = np.stack([self.workload.rows(int(i), 1)[0] for i in indices[lo : lo + 16]])
                        outs.append(model(torch.from_numpy(batch)).numpy())
                self._reference[key] = np.concatenate(outs)
        return self._reference[key]

    def check(self, outputs: np.ndarray | None, coverage: np.ndarray, precision: str,
              simulated: bool) -> tuple[bool, float, float, list[str]]:
        """(ok, max_abs_diff, tolerance, problems): exactly-once coverage and closeness to the reference."""
        problems = []
        if outputs is None:
            return False, float("inf"), 0.0, ["no outputs"]
        wrong = np.flatnonzero(coverage != 1)
        if len(wrong):
            problems.append(f"{len(wrong)} images not processed exactly once (first: {int(wrong[0])})")
        indices = self.workload.indices_sample(self.check_images)
        ref = self.reference(indices, simulated)
        diff = float(np.max(np.abs(outputs[indices] - ref)))
        tol = TOLERANCE[precision] * max(float(np.max(np.abs(ref))), 1e-6)
        if not np.isfinite(diff) or diff > tol:
            problems.append(f"outputs differ from the single-device reference: max |diff| {diff:.3g} > {tol:.3g}")
        return not problems, diff, tol, problems

    def measurement(self, pool: Pool, strategy: str, params: dict[str, Any], result: DriveResult,
                    standalone: list[float]) -> Measurement:
        precision = precision_of(pool)
        ok, diff, tol, problems = self.check(result.outputs, result.coverage, precision, pool.simulated)
        throughput = self.workload.images / result.wall_s if result.wall_s > 0 else 0.0
        limit = float(sum(standalone))
        executors = [
            ExecutorReport(spec.name, spec.device, result.images_by_executor[i], result.busy_by_executor[i],
                           standalone[i], spec.kind == "sim", result.died[i])
            for i, spec in enumerate(pool.spec.executors)
        ]
        return Measurement(
            model=self.model.name, strategy=strategy, params=params, images=self.workload.images,
            wall_s=result.wall_s, throughput_ips=throughput, limit_ips=limit,
            efficiency=throughput / limit if limit > 0 else 0.0, output_ok=ok, max_abs_diff=diff,
            tolerance=tol, executors=executors, timeline=result.timeline,
            failures=result.failures + problems, simulated=pool.simulated,
            extra={"pool": pool.spec.to_dict()},
        )


def precision_of(pool: Pool) -> str:
    """The least precise executor precision of a pool: it sets the output check's tolerance."""
    return max((e.precision for e in pool.spec.executors), key=_ORDER.index)


def run_strategy(strategy_name: str, params: dict[str, Any], pool: Pool, ctx: RunContext) -> Measurement:
    """Validates params, starts the pool for the context's model/workload, runs the strategy."""
    from autohet.strategies import get_strategy

    strategy = get_strategy(strategy_name)
    checked = strategy.validate(params)
    strategy.check_pool(pool, checked)
    pool.start(ctx.model, ctx.workload)
    return strategy.run(pool, ctx, checked)
