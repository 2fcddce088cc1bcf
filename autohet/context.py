"""What every strategy run needs: the model, the workload, the output check, run-wide settings.

It sits below the strategies (they import it) and above the pools (it reads their specs), so
strategies never import the code that runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.core.measurement import ExecutorReport, Measurement, percentile
from autohet.core.models import ModelSpec, build_model
from autohet.core.objectives import RUN_MODES, RunMode
from autohet.core.workload import Workload
from autohet.pool.standalone import spread

if TYPE_CHECKING:
    from autohet.pool import Pool

__all__ = ["TOLERANCE", "RunContext", "precision_of", "tolerance_for"]

# Allowed max |out - ref| relative to max |ref|, by the least precise precision taking part.
TOLERANCE = {"fp32": 1e-3, "tf32": 5e-3, "fp16": 1e-2, "bf16": 5e-2}
_ORDER = ["fp32", "tf32", "fp16", "bf16"]


def tolerance_for(precisions: list[str] | tuple[str, ...]) -> str:
    """The least precise of ``precisions``: it sets the output check's tolerance."""
    return max(precisions, key=_ORDER.index) if precisions else "fp32"


def precision_of(pool: Pool) -> str:
    """The least precise executor precision of a pool."""
    return tolerance_for([e.precision for e in pool.spec.executors])


@dataclass
class RunContext:
    """The model and workload of a run, the reference for the output check, run-wide settings.

    ``mode`` is the kind of run: ``throughput`` (all images through the pool) or ``latency``
    (batch-1 requests timed one by one). ``deadline_s`` bounds a run (RunTimeout past it);
    ``progress`` is called with (images done, images total) as work completes.
    """

    model: ModelSpec
    workload: Workload
    check_images: int = 64
    standalone_seconds: float = 1.0
    on_event: Callable[[Any], None] | None = None
    mode: RunMode = RunMode.THROUGHPUT
    latency_runs: int = 50
    standalone_provider: Callable[[Pool, int, list[int] | None], list[float]] | None = None
    deadline_s: float | None = None
    lookahead: bool = True  # GPUs get their next unit while the current one drains (off: for A/B benches)
    progress: Callable[[int, int], None] | None = None
    _reference: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    reference_stats: dict[str, float] = field(default_factory=lambda: {"computed": 0, "reused": 0, "seconds": 0.0})

    def __post_init__(self) -> None:
        if self.mode not in RUN_MODES:
            raise ValueError(f"mode must be one of {', '.join(RUN_MODES)}, got {self.mode!r}")
        self.mode = RunMode(self.mode)

    def standalone(self, pool: Pool, used: list[int] | None = None) -> list[float]:
        """Each executor's standalone throughput: measured now, or by the provider (the tuner
        measures once per executor configuration and reuses it). ``used``: only those executors (a
        single's one: the others, given no image, count 0 towards its limit), None: all."""
        share = max(1, self.workload.images // max(1, len(pool)))
        if self.standalone_provider is not None:
            return self.standalone_provider(pool, share, used)
        return spread(pool.standalone_ips(self.standalone_seconds, share, used), used, len(pool))

    def with_images(self, images: int) -> RunContext:
        """The same context over the first ``images`` images of the same bank (reference kept)."""
        return replace(self, workload=Workload(self.workload.bank, images))

    def references(self) -> dict[str, np.ndarray]:
        """The reference outputs computed so far, by image (a copy): what another context can start from."""
        return dict(self._reference)

    def reference(self, indices: np.ndarray, simulated: bool) -> np.ndarray:
        """Single-device fp32 CPU outputs for ``indices``. Cached per image, keyed by the model and a
        digest of the image's bytes: stable across processes (a tune's trial processes reuse what the
        tuner computed) and across runs of other sizes over the same bank (``reference_stats`` counts
        the images computed and reused)."""
        if simulated:  # a simulated executor outputs the image's index
            return indices.astype(np.float32).reshape(-1, 1)
        keys = [self._reference_key(int(i)) for i in indices]
        missing = sorted({k: int(i) for k, i in zip(keys, indices, strict=True) if k not in self._reference}.items(),
                         key=lambda item: item[1])
        self.reference_stats["reused"] += len(set(keys)) - len(missing)
        if missing:
            import time

            import torch

            started = time.perf_counter()
            model = build_model(self.model)
            with torch.inference_mode():
                for lo in range(0, len(missing), 16):
                    chunk = missing[lo : lo + 16]
                    batch = np.stack([self.workload.rows(i, 1)[0] for _, i in chunk])
                    for (key, _), out in zip(chunk, model(torch.from_numpy(batch)).numpy(), strict=True):
                        self._reference[key] = out
            self.reference_stats["computed"] += len(missing)
            self.reference_stats["seconds"] += time.perf_counter() - started
        return np.stack([self._reference[k] for k in keys])

    def _reference_key(self, index: int) -> str:
        """The model (name, weights) and a digest of image ``index``'s bytes: what its output depends on."""
        import hashlib

        image = np.ascontiguousarray(self.workload.rows(index, 1)[0])
        digest = hashlib.blake2b(image.tobytes(), digest_size=16).hexdigest()
        return f"{self.model.name}:{self.model.seed}:{self.model.checkpoint}:{digest}"

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

    def latency_measurement(self, pool: Pool, strategy: str, params: dict[str, Any], times_s: list[float],
                            outputs: np.ndarray, executors: list[ExecutorReport],
                            precision: str | None = None) -> Measurement:
        """A batch-1 latency run's Measurement: p50/p95/mean in ms, outputs checked. No limit and no
        efficiency: a latency run has no measured bound to compare with (its baselines are separate runs)."""
        runs = len(times_s)
        run_ctx = self.with_images(runs)
        ok, diff, tol, problems = run_ctx.check(outputs, np.ones(runs, dtype=np.int32),
                                                precision or precision_of(pool), pool.simulated)
        p50 = percentile(times_s, 50)
        return Measurement(
            model=self.model.name, strategy=strategy, params=params, images=runs, wall_s=float(sum(times_s)),
            throughput_ips=1.0 / p50 if p50 > 0 else 0.0, limit_ips=None, efficiency=None, output_ok=ok,
            max_abs_diff=diff, tolerance=tol, executors=executors, failures=problems, simulated=pool.simulated,
            latency_ms={"p50": p50 * 1e3, "p95": percentile(times_s, 95) * 1e3,
                        "mean": float(np.mean(times_s)) * 1e3, "runs": runs},
            extra={"pool": pool.spec.to_dict()},
        )

    def stream_measurement(self, pool: Pool, strategy: str, params: dict[str, Any], wall_s: float,
                           outputs: np.ndarray, limit_ips: float | None, executors: list[ExecutorReport],
                           precision: str) -> Measurement:
        """An in-process throughput run's Measurement (every image through one program, in order):
        throughput against ``limit_ips`` (the strategy's measured bound), outputs checked."""
        images = self.workload.images
        ok, diff, tol, problems = self.check(outputs, np.ones(images, dtype=np.int32), precision, pool.simulated)
        throughput = images / wall_s if wall_s > 0 else 0.0
        return Measurement(
            model=self.model.name, strategy=strategy, params=params, images=images, wall_s=wall_s,
            throughput_ips=throughput, limit_ips=limit_ips,
            efficiency=throughput / limit_ips if limit_ips else None, output_ok=ok, max_abs_diff=diff,
            tolerance=tol, executors=executors, failures=problems, simulated=pool.simulated,
            extra={"pool": pool.spec.to_dict()},
        )
