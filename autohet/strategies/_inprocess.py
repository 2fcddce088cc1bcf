"""What the in-process families share: which pool executors become engine devices, and running
their job (in this process, or in the engine actor when the pool is on Ray)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autohet.context import tolerance_for
from autohet.core.errors import UserError
from autohet.core.params import IntListParam
from autohet.engine import EngineJob, build_engine, run_job
from autohet.strategies.served import EngineServed

if TYPE_CHECKING:
    from autohet.engine import Engine, Program
    from autohet.executors import ExecutorSpec
    from autohet.pool import Pool, PoolSpec

__all__ = ["DEVICES", "chosen_devices", "default_devices", "run_on_engine", "serve_on_engine"]

DEVICES = IntListParam("devices", None, low=0, high=1023,
                       help="executor indices the model is spread over (default: every GPU executor and the "
                            "largest CPU group; without a GPU, the two largest CPU groups)")


def default_devices(spec: PoolSpec) -> list[int]:
    """Every GPU executor (partitions included) and the CPU group with most cores; on a CPU-only
    pool, the two CPU groups with most cores (the engine's numerics need two devices to test)."""
    gpus = [i for i, e in enumerate(spec.executors) if e.is_gpu]
    cpus = sorted((i for i, e in enumerate(spec.executors) if e.is_cpu),
                  key=lambda i: (-len(spec.executors[i].cores), i))
    return sorted(gpus + cpus[: 1 if gpus else 2])


def chosen_devices(pool: Pool, params: dict[str, Any], strategy: str) -> list[ExecutorSpec]:
    """The executors named by ``devices`` (or the default choice), checked against the pool."""
    if pool.simulated:
        raise UserError(f"{strategy} runs the real model on real devices; use a pool without sim executors")
    indices = params.get("devices") or default_devices(pool.spec)
    bad = [i for i in indices if not 0 <= i < len(pool)]
    if bad:
        raise UserError(f"{strategy}: devices names executor {bad[0]}; the pool has {len(pool)} "
                        f"({', '.join(f'{k} {n}' for k, n in enumerate(pool.names))})")
    if len(set(indices)) != len(indices):
        raise UserError(f"{strategy}: devices lists an executor twice: {indices}")
    return [pool.spec.executors[i] for i in indices]


def run_on_engine(pool: Pool, job: EngineJob, specs: list[ExecutorSpec], deadline_s: float | None = None,
                  strategy: str = "the run") -> dict[str, Any]:
    """The job on the pool's devices; past ``deadline_s`` (the run's limit, ``ctx.deadline_s``) it is
    stopped and RunTimeout raised, so a hopeless trial is cut like a data-parallel one."""
    return run_job(job, specs, on_ray=pool.on_ray, deadline_s=deadline_s, what=strategy)


def serve_on_engine(specs: list[ExecutorSpec], build: Callable[[Engine], tuple[Program, int, dict[str, Any]]],
                    batch: int) -> EngineServed:
    """A family's served form: an engine over the executors' devices in this process, with the
    program ``build`` makes on it (once: planned or taken from the params; it returns the program,
    the frames to keep in flight and what the plan was) run on every call in frames of ``batch``."""
    engine = build_engine(specs)
    try:
        program, depth, plan = build(engine)
    except BaseException:
        engine.close()
        raise
    return EngineServed(engine, program, batch, depth, tolerance_for([s.precision for s in specs]), plan,
                        frozenset(c for s in specs for c in s.cores))
