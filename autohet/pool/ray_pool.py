"""Executors as Ray actors. The actor class only forwards to the plain Executor: no logic here."""

from __future__ import annotations

import time
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

    def run(self, start: int, size: int) -> tuple[Any, float]:
        result = self.executor.run(start, size)
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


def actor_options(spec: ExecutorSpec, name: str | None = None) -> dict[str, Any]:
    """Ray resources and placement for one executor."""
    opts: dict[str, Any] = {"num_cpus": len(spec.cores) if spec.kind != "sim" else 0,
                            "num_gpus": 1 if spec.kind == "gpu" or spec.needs_gpu else 0,
                            "max_restarts": 0, "max_concurrency": 2}
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


class RayDispatcher(Dispatcher):
    """Work units as actor calls; an actor that dies turns its unit into a failed Completion."""

    def __init__(self, names: list[str], actors: list[Any]) -> None:
        super().__init__(names)
        self.actors = actors
        self.refs: dict[Any, int] = {}
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _submit(self, executor: int, start: int, size: int) -> None:
        self.refs[self.actors[executor].run.remote(start, size)] = executor

    def _wait_any(self) -> Completion:
        import ray

        ready, _ = ray.wait(list(self.refs), num_returns=1)
        ref = ready[0]
        executor = self.refs.pop(ref)
        start, size, submitted = self.busy[executor]
        try:
            outputs, compute_s = ray.get(ref)
        except Exception as exc:  # RayActorError when killed; any executor error fails only this unit
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return Completion(executor, start, size, submitted, self.now(), 0.0,
                              error=f"{type(exc).__name__}: {text[:200]}")
        return Completion(executor, start, size, submitted, self.now(), compute_s, outputs)
