"""Executors as Ray actors. The actor class only forwards to the plain Executor: no logic here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from autohet.errors import UserError
from autohet.executors import ExecutorSpec, make_executor
from autohet.models import ModelSpec
from autohet.pool.dispatch import Completion, Dispatcher
from autohet.pool.spec import PoolSpec
from autohet.workload import Workload

__all__ = ["ExecutorActor", "RayDispatcher", "actor_options"]


class ExecutorActor:
    """Wrapped with ``ray.remote`` at use; every method forwards to the Executor it holds."""

    def __init__(self, spec: ExecutorSpec, model: ModelSpec) -> None:
        self.executor = make_executor(spec, model)

    def load(self, workload: Workload) -> dict[str, Any]:
        self.executor.load(workload)
        return self.executor.describe()

    def configure(self, params: dict[str, Any]) -> dict[str, Any]:
        self.executor.configure(params)
        return self.executor.describe()

    def run(self, start: int, size: int, following: tuple[int, int] | None = None) -> tuple[Any, float]:
        result = self.executor.run_ahead(start, size, following)
        return result.outputs, result.compute_s

    def standalone_ips(self, min_seconds: float, max_images: int | None = None) -> float:
        return self.executor.standalone_ips(min_seconds, max_images)

    def ping(self) -> str:
        return self.executor.ping()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def _node_id(node: str) -> str:
    import ray

    alive = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["NodeID"])
    for n in alive:
        if node in (n["NodeID"], n["NodeManagerAddress"], n.get("NodeName")):
            return n["NodeID"]
    if node.isdigit() and int(node) < len(alive):
        return alive[int(node)]["NodeID"]
    raise UserError(f"node {node!r} is not in the Ray cluster; use a node index 0-{len(alive) - 1}, "
                    "a node ID or a node IP")


def actor_options(spec: ExecutorSpec, name: str | None = None, reserve_cpus: bool = True) -> dict[str, Any]:
    """Ray resources and placement for one executor. ``reserve_cpus=False`` (the tuner's idle
    topologies kept alive) claims no Ray CPUs: the cores are pinned by the executor itself, and
    the owner guarantees that only one topology runs at a time."""
    opts: dict[str, Any] = {"num_cpus": len(spec.cores) if spec.kind != "sim" and reserve_cpus else 0,
                            "num_gpus": 1 if spec.kind == "gpu" or spec.needs_gpu else 0,
                            "max_restarts": 0, "max_concurrency": 1}
    if spec.node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(_node_id(spec.node), soft=False)
    if name:
        opts["name"] = name
    return opts


def check_cluster_resources(spec: PoolSpec) -> None:
    """One line when the Ray cluster cannot hold the pool (e.g. a GPU executor and no GPU)."""
    import ray

    total = ray.cluster_resources()
    gpus = sum(1 for e in spec.executors if e.kind == "gpu" or e.needs_gpu)
    if gpus > total.get("GPU", 0):
        raise UserError(f"pool {spec.source} needs {gpus} GPUs but the Ray cluster has "
                        f"{int(total.get('GPU', 0))}; use a CPU pool such as actors/cpu2.yaml")
    cpus = sum(len(e.cores) for e in spec.executors if e.kind != "sim")
    if cpus > total.get("CPU", 0):
        raise UserError(f"pool {spec.source} pins {cpus} cores but the Ray cluster has "
                        f"{int(total.get('CPU', 0))} CPUs; use smaller groups or actors/auto.yaml")


@dataclass
class _Unit:
    """A scheduler's work unit on one executor, run as executor-sized parts kept in flight."""

    executor: int
    start: int
    size: int
    submitted: float
    parts: list[tuple[int, int]]
    launched: int = 0
    done: int = 0
    compute_s: float = 0.0
    outputs: dict[int, Any] = field(default_factory=dict)


class RayDispatcher(Dispatcher):
    """Work units as actor calls; an actor that dies turns its unit into a failed Completion.

    A unit larger than its executor's ``max_unit_images`` is split into parts and up to ``depth``
    parts stay queued on the actor, and each call names the part after it, so a GPU queues that
    part before returning this one's outputs (no idle device between parts, no driver round trip)
    and no single call moves a huge output array.
    """

    def __init__(self, names: list[str], actors: list[Any], max_unit: list[int] | None = None,
                 depth: int = 2) -> None:
        super().__init__(names)
        self.actors = actors
        self.max_unit = max_unit or [1 << 30] * len(actors)
        self.depth = depth
        self.refs: dict[Any, tuple[_Unit, int]] = {}
        self.units: dict[int, _Unit] = {}
        self.stale: set[Any] = set()  # parts of failed units still in flight: ignored
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _launch(self, unit: _Unit) -> None:
        while unit.launched < len(unit.parts) and unit.launched - unit.done < self.depth:
            start, size = unit.parts[unit.launched]
            following = unit.parts[unit.launched + 1] if unit.launched + 1 < len(unit.parts) else None
            self.refs[self.actors[unit.executor].run.remote(start, size, following)] = (unit, unit.launched)
            unit.launched += 1

    def _submit(self, executor: int, start: int, size: int) -> None:
        step = max(1, self.max_unit[executor])
        parts = [(s, min(step, start + size - s)) for s in range(start, start + size, step)]
        unit = _Unit(executor, start, size, self.now(), parts)
        self.units[executor] = unit
        self._launch(unit)

    def _wait_any(self, timeout: float | None = None) -> Completion | None:
        import numpy as np
        import ray

        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            ready, _ = ray.wait(list(self.refs) + list(self.stale), num_returns=1, timeout=left)
            if not ready:
                return None
            ref = ready[0]
            if ref in self.stale:
                self.stale.discard(ref)
                continue
            unit, index = self.refs.pop(ref)
            try:
                outputs, compute_s = ray.get(ref)
            except Exception as exc:  # RayActorError when killed; any executor error fails the unit
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.stale |= {r for r, (u, _) in self.refs.items() if u is unit}
                for r in list(self.refs):
                    if self.refs[r][0] is unit:
                        del self.refs[r]
                self.units.pop(unit.executor, None)
                return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(), 0.0,
                                  error=f"{type(exc).__name__}: {text[:200]}")
            unit.done += 1
            unit.compute_s += compute_s
            if self.sink is not None:  # placed now, while the actor runs the unit's next parts
                self.sink(unit.parts[index][0], outputs)
            else:
                unit.outputs[index] = outputs
            if unit.done == len(unit.parts):
                self.units.pop(unit.executor, None)
                if self.sink is not None:
                    return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(),
                                      unit.compute_s, delivered=True)
                parts = [unit.outputs[i] for i in range(len(unit.parts))]
                joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
                return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(), unit.compute_s,
                                  joined)
            self._launch(unit)
