"""Standalone throughputs, measured once per executor class and configuration.

Executors of the same kind, core count, GPU, node and parameters (the 15 one-core groups of a
16-core machine) run at the same speed alone: one measurement, on the first of them, serves all,
and later runs and trials reuse it. On a GPU machine this turns minutes of measuring slow CPU
groups one by one into seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from autohet.executors import ExecutorSpec

__all__ = ["StandaloneCache", "executor_class", "spread"]


def executor_class(spec: ExecutorSpec) -> ExecutorSpec:
    """The spec with what does not change its standalone speed blanked: its name and which cores
    (their count stays). Executors with equal classes share one standalone measurement."""
    return replace(spec, name="", cores=tuple(range(len(spec.cores))))


def spread(figures: list[float], used: list[int] | None, executors: int) -> list[float]:
    """Figures measured for the executors ``used`` (all where None) as one per executor of the pool,
    0 for the others: executors a run gives no image add nothing to its limit."""
    if used is None:
        return list(figures)
    out = [0.0] * executors
    for i, value in zip(used, figures, strict=True):
        out[i] = value
    return out


def _device(spec: ExecutorSpec) -> tuple:
    return (spec.kind, spec.cores, spec.gpu, spec.node, spec.sms, spec.needs_gpu, spec.speed_ips)


class StandaloneCache:
    """Standalone throughputs by executor class, configuration and unit cap."""

    def __init__(self) -> None:
        self.values: dict[tuple[ExecutorSpec, int | None], float] = {}

    def __len__(self) -> int:
        return len(self.values)

    def due(self, pool: Any, max_images: int | None, used: list[int] | None = None) -> list[int]:
        """The executors ``measure`` would measure: the first of each class not yet known (at this unit cap
        or without one), among ``used`` (all where None)."""
        keys = [(executor_class(e), max_images) for e in pool.spec.executors]
        first: dict[tuple, int] = {}
        for i in range(len(keys)) if used is None else used:
            if keys[i] not in self.values and (keys[i][0], None) not in self.values:
                first.setdefault(keys[i], i)
        return list(first.values())

    def measure(self, pool: Any, seconds: float, max_images: int | None,
                progress: Callable[[str], None] | None = None, used: list[int] | None = None) -> list[float]:
        """The pool's standalone figures, measuring only the ``due`` executors; with ``used``, those
        executors' figures only (0 for the others, ``spread``)."""
        keys = [(executor_class(e), max_images) for e in pool.spec.executors]
        chosen = list(range(len(keys))) if used is None else used
        due = self.due(pool, max_images, used)
        for i in chosen:  # measured without a cap (a single's executor, before its trial)
            uncapped = self.values.get((keys[i][0], None))
            if keys[i] not in self.values and uncapped is not None:
                self.values[keys[i]] = uncapped
        for n, index in enumerate(due):
            if progress is not None:
                same = sum(1 for k in keys if k == keys[index])
                progress(f"standalone {n + 1}/{len(due)}: {pool.names[index]}"
                         + (f" (and {same - 1} like it)" if same > 1 else ""))
            self.values[keys[index]] = pool.standalone_ips(seconds, max_images, indices=[index])[0]
        return spread([self.values[keys[i]] for i in chosen], used, len(keys))

    def measure_one(self, pool: Any, index: int, seconds: float) -> float:
        """One executor's standalone figure: the one known for its class (any unit cap), else measured
        now without a cap."""
        spec = pool.spec.executors[index]
        known = self.known(spec)
        if known is not None:
            return known
        value = pool.standalone_ips(seconds, None, indices=[index])[0]
        self.values[(executor_class(spec), None)] = value
        return value

    def known_any(self, spec: ExecutorSpec, backends: tuple[str, ...] | None = None) -> float | None:
        """The best figure known for this executor's device (its kind, core count, GPU or share) at any
        configuration with one of ``backends`` (any, by default), or None where none was measured."""
        device = _device(executor_class(spec))
        found = [v for (c, _), v in self.values.items()
                 if _device(c) == device and v > 0 and (backends is None or c.backend in backends)]
        return max(found) if found else None

    def known(self, spec: ExecutorSpec) -> float | None:
        """The best figure known for this executor's class and configuration (any unit cap), or None."""
        cls = executor_class(spec)
        found = [v for (c, _), v in self.values.items() if c == cls and v > 0]
        return max(found) if found else None

    def batch_doubling_gain(self) -> float | None:
        """The most a whole GPU's figure rose from a batch to twice it, the rest of its setting the same (0.05:
        5% more images a second), or None where no such pair was measured: near 0, the GPU was full at the
        smaller batch."""
        figures: dict[ExecutorSpec, float] = {}
        for (c, _), v in self.values.items():
            if c.uses_gpu and c.sms is None and v > 0:
                figures[c] = max(v, figures.get(c, 0.0))
        gains = [figures[twice] / v - 1 for c, v in figures.items()
                 if (twice := replace(c, batch=2 * c.batch)) in figures]
        return max(gains) if gains else None

    def best_per_core(self) -> float | None:
        """The best figure a core reached in any CPU group measured (the group's figure over its cores), or
        None where no CPU group was measured."""
        rates = [v / len(c.cores) for (c, _), v in self.values.items() if c.is_cpu and c.cores and v > 0]
        return max(rates) if rates else None
