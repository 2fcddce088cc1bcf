"""Executors as Ray actors, and the dispatcher that feeds them.

``ExecutorActor`` forwards each call to the plain Executor it holds; ``ExecutorGroupActor`` holds the
green-context partitions of one GPU in one process, each member on its own thread. The Ray
resources and node placement of an actor come from its spec's kind (``ExecutorSpec.ray_resources``);
``check_cluster_resources`` refuses a pool the cluster cannot hold. ``RayDispatcher`` runs work
units as actor calls: a large unit in parts kept in flight, an executor that uses a GPU queueing
its next unit ahead.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.workload import Workload
from autohet.executors import ExecutorSpec, make_executor
from autohet.platform.gc_control import settle
from autohet.pool.dispatch import Completion, Dispatcher, Ready
from autohet.pool.spec import PoolSpec

__all__ = ["ExecutorActor", "ExecutorGroupActor", "MemberHandle", "RayDispatcher", "actor_options", "group_options",
           "kill_actor", "ray_node_id", "user_errors"]


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """A UserError raised inside an actor (a bad checkpoint, a precision the device cannot run)
    reaches the user as its one line, not as Ray's wrapped traceback."""
    from ray.exceptions import RayTaskError

    try:
        yield
    except RayTaskError as exc:
        if isinstance(exc.cause, UserError):
            raise UserError(str(exc.cause)) from None
        raise


class ExecutorActor:
    """Wrapped with ``ray.remote`` at use; every method forwards to the Executor it holds."""

    def __init__(self, spec: ExecutorSpec, model: ModelSpec) -> None:
        self.executor = make_executor(spec, model)

    def load(self, workload: Workload) -> dict[str, Any]:
        self.executor.load(workload)
        settle()  # the set-up's garbage collected here, not in the run's units
        return self.executor.describe()

    def configure(self, params: dict[str, Any]) -> dict[str, Any]:
        self.executor.configure(params)
        settle()
        return self.executor.describe()

    def set_workload(self, workload: Workload) -> None:
        self.executor.set_workload(workload)

    def release(self) -> None:
        self.executor.release()
        settle()

    def run(self, start: int, size: int, following: tuple[int, int] | None = None) -> tuple[Any, float]:
        result = self.executor.run_ahead(start, size, following)
        return result.outputs, result.compute_s

    def standalone_ips(self, min_seconds: float, max_images: int | None = None) -> float:
        return self.executor.standalone_ips(min_seconds, max_images)

    def ping(self) -> str:
        return self.executor.ping()

    def drain(self) -> None:
        self.executor.drain()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class ExecutorGroupActor:
    """Several executors in one process, each method taking the member's index first: the green-context
    partitions of one GPU (kernels of different processes time-slice a GPU; partitions of one process
    run side by side on their own SMs). Each member lives on its own long-lived thread (a Worker):
    its load, runs and measurements all run there, one call at a time, while the actor's threads
    only forward. Fed from whichever of Ray's pool threads took the call, a 64-SM partition of the
    H100 box ran at 10137 img/s alone; fed from its own thread, 28777 (BENCHMARKS.md §10)."""

    def __init__(self, specs: list[ExecutorSpec], model: ModelSpec) -> None:
        import threading

        from autohet.executors.gpu import local_gpu_index
        from autohet.executors.green import sm_partitions
        from autohet.pool.worker import Worker

        self.executors = [make_executor(s, model) for s in specs]
        parts = sm_partitions(local_gpu_index(specs[0].gpu or 0), [s.sms for s in specs])
        for executor, part in zip(self.executors, parts, strict=True):
            executor.stream_override = part.stream
        self.sms = [p.sms for p in parts]  # what the driver actually gave (rounded up to its granularity)
        self.workers = [Worker(s.name) for s in specs]
        # one member sets up at a time: a member's cuDNN autotuning next to another's graph capture
        # failed both on the H100 box (CUDNN_STATUS_EXECUTION_FAILED_CUDART, capture invalidated)
        self.setup_lock = threading.Lock()

    def load(self, member: int, workload: Workload) -> dict[str, Any]:
        executor = self.executors[member]
        with self.setup_lock:
            self.workers[member].call(lambda: executor.load(workload))
            settle()
        return {**executor.describe(), "sms_granted": self.sms[member]}

    def configure(self, member: int, params: dict[str, Any]) -> dict[str, Any]:
        executor = self.executors[member]
        with self.setup_lock:
            self.workers[member].call(lambda: executor.configure(params))
            settle()
        return executor.describe()

    def set_workload(self, member: int, workload: Workload) -> None:
        self.workers[member].call(lambda: self.executors[member].set_workload(workload))

    def run(self, member: int, start: int, size: int, following: tuple[int, int] | None = None
            ) -> tuple[Any, float]:
        result = self.workers[member].call(lambda: self.executors[member].run_ahead(start, size, following))
        return result.outputs, result.compute_s

    def standalone_ips(self, member: int, min_seconds: float, max_images: int | None = None) -> float:
        return self.workers[member].call(lambda: self.executors[member].standalone_ips(min_seconds, max_images))

    def ping(self, member: int) -> str:
        return self.executors[member].ping()

    def drain(self, member: int) -> None:
        self.workers[member].call(self.executors[member].drain)


class _BoundMethod:
    def __init__(self, actor: Any, name: str, member: int) -> None:
        self.actor, self.name, self.member = actor, name, member

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.actor, self.name).remote(self.member, *args, **kwargs)


class MemberHandle:
    """One member of a group actor, used like an executor actor's handle (``h.run.remote(...)``)."""

    def __init__(self, actor: Any, member: int) -> None:
        self.actor, self.member = actor, member

    def __getattr__(self, name: str) -> _BoundMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _BoundMethod(self.actor, name, self.member)


def kill_actor(handle: Any) -> None:
    """Ends an executor's actor (a member's whole group), if it still runs."""
    import ray

    try:
        ray.kill(getattr(handle, "actor", handle), no_restart=True)
    except Exception:  # already dead
        return


def group_options(specs: list[ExecutorSpec], name: str | None, reserve_cpus: bool) -> dict[str, Any]:
    opts = actor_options(specs[0], name, reserve_cpus)
    # threads: the dispatcher keeps up to 2 calls in flight per member, each member's run one at a time
    opts.update(num_cpus=sum(len(s.cores) for s in specs) if reserve_cpus else 0, num_gpus=1,
                max_concurrency=4 * len(specs))
    return opts


def ray_node_id(node: str) -> str:
    """The Ray node ID of a pool file's ``node:`` (an index into the alive nodes sorted by ID, a node ID,
    an IP or a node name); one line when the cluster has no such node."""
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
    opts: dict[str, Any] = {**spec.ray_resources(reserve_cpus), "max_restarts": 0, "max_concurrency": 1}
    if spec.node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray_node_id(spec.node), soft=False)
    if name:
        opts["name"] = name
    return opts


def check_cluster_resources(spec: PoolSpec) -> None:
    """One line when the Ray cluster cannot hold the pool (e.g. a GPU executor and no GPU)."""
    import ray

    total = ray.cluster_resources()
    shared = sum(len(g) - 1 for g in spec.partition_groups())  # partitions of one GPU share it
    gpus = sum(1 for e in spec.executors if e.uses_gpu) - shared
    if gpus > total.get("GPU", 0):
        raise UserError(f"pool {spec.source} needs {gpus} GPUs but the Ray cluster has "
                        f"{int(total.get('GPU', 0))}; use a CPU pool such as actors/cpu2.yaml")
    cpus = sum(len(e.pinned_cores) for e in spec.executors)
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
    """Work units as actor calls; an actor that dies turns its units into failed Completions.

    A unit larger than its executor's ``max_unit_images`` is split into parts and up to ``depth``
    parts stay queued on the actor, and each call names the part after it, so a GPU queues that
    part before returning this one's outputs (no idle device between parts, no driver round trip)
    and no single call moves a huge output array.

    Across units (lookahead executors, once the driver allows it): the last part of an executor's
    last unit is held back while the driver may still queue a next unit, so that the call can name
    the next unit's first part; it is sent when the driver has decided (``_flush``) or when the
    next unit arrives. The device then runs from one unit into the next without waiting.
    """

    def __init__(self, names: list[str], actors: list[Any], max_unit: list[int] | None = None,
                 depth: int = 2, lookahead: list[bool] | None = None) -> None:
        super().__init__(names, lookahead)
        self.actors = actors
        self.max_unit = max_unit or [1 << 30] * len(actors)
        self.depth = depth
        self.refs: dict[Any, tuple[_Unit, int]] = {}
        self.units: dict[int, list[_Unit]] = {}  # per executor, in the order they run
        self.stale: dict[Any, int] = {}  # parts of failed units still in flight -> their executor: ignored
        self.failed: list[Completion] = []  # units queued behind a failed one, reported one by one
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _holding(self, executor: int) -> bool:
        return self.lookahead_on and self.lookahead[executor]

    def _launch(self, executor: int, release: bool = False) -> bool:
        """Sends the executor's next parts while fewer than ``depth`` are in flight; returns True
        when the last part of its last unit is held back for a next unit not yet decided."""
        units = self.units.get(executor, [])
        for k, unit in enumerate(units):
            while unit.launched < len(unit.parts):
                if sum(u.launched - u.done for u in units) >= self.depth:
                    return False
                last = unit.launched + 1 == len(unit.parts)
                if last and k + 1 == len(units) and self._holding(executor) and not release:
                    return True
                if not last:
                    following = unit.parts[unit.launched + 1]
                else:
                    following = units[k + 1].parts[0] if k + 1 < len(units) else None
                start, size = unit.parts[unit.launched]
                self.refs[self.actors[executor].run.remote(start, size, following)] = (unit, unit.launched)
                unit.launched += 1
        return False

    def _draining(self, executor: int) -> bool:
        units = self.units.get(executor, [])
        return len(units) == 1 and units[0].launched + 1 >= len(units[0].parts)

    def _flush(self) -> None:
        """The driver has had its chance to queue a next unit: an executor's held last part goes
        now, unless a unit ahead of it still runs (its completion gives the driver another chance)."""
        for executor, units in self.units.items():
            if len(units) == 1:
                self._launch(executor, release=True)

    def _submit(self, executor: int, start: int, size: int) -> None:
        step = max(1, self.max_unit[executor])
        parts = [(s, min(step, start + size - s)) for s in range(start, start + size, step)]
        self.units.setdefault(executor, []).append(_Unit(executor, start, size, self.now(), parts))
        self._launch(executor)

    def _fail(self, unit: _Unit, exc: Exception) -> Completion:
        """Drops every unit queued on the failed unit's executor: the first is returned, the rest
        are reported by the next waits, so each is re-dispatched."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        error = f"{type(exc).__name__}: {text[:200]}"
        units = self.units.pop(unit.executor, [unit])
        for r in [r for r, (u, _) in self.refs.items() if u.executor == unit.executor]:
            del self.refs[r]
            self.stale[r] = unit.executor
        self.failed += [Completion(u.executor, u.start, u.size, u.submitted, self.now(), 0.0, error=error)
                        for u in units if u is not unit]
        return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(), 0.0, error=error)

    def settle(self, seconds: float) -> list[int]:
        """Waits up to ``seconds`` for the parts already on the actors (at most ``depth`` each: the rest
        of a unit is never sent) and for each such actor to finish what it queued ahead (``drain``: a
        GPU's announced part, OpenVINO's started pieces). Names the executors not done by then, and
        those whose parts failed (a dead actor): they are to be replaced.

        One deadline for all, and each actor's drain is sent as soon as its own parts are back (a
        partition group's threaded actor may run a drain before a part sent earlier). Waiting for every
        actor's parts first left the drains no time where one executor's parts outlived the wait: a GPU
        done in milliseconds was replaced beside a busy CPU group (BENCHMARKS 23)."""
        import ray

        deadline = time.perf_counter() + max(0.0, seconds)
        owner = {**{r: u.executor for r, (u, _) in self.refs.items()}, **self.stale}
        parts: dict[int, int] = {}
        for i in owner.values():
            parts[i] = parts.get(i, 0) + 1
        pending = dict(owner)
        drains: set[Any] = set()
        busy: set[int] = set()

        def drain(i: int) -> None:
            ref = self.actors[i].drain.remote()
            drains.add(ref)
            pending[ref] = i

        for i in sorted((set(owner.values()) | set(self.busy)) - set(parts)):
            drain(i)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.perf_counter()))
            if not ready:
                break
            ref = ready[0]
            i = pending.pop(ref)
            try:
                ray.get(ref)
            except Exception:  # failed, or its actor died: replaced
                busy.add(i)
            if ref not in drains:
                parts[i] -= 1
                if parts[i] == 0 and i not in busy:
                    drain(i)
        return sorted(busy | set(pending.values()))

    def _wait_any(self, timeout: float | None = None) -> Completion | Ready | None:
        import numpy as np
        import ray

        if self.failed:
            return self.failed.pop(0)
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            ready, _ = ray.wait(list(self.refs) + list(self.stale), num_returns=1, timeout=left)
            if not ready:
                return None
            ref = ready[0]
            if ref in self.stale:
                self.stale.pop(ref)
                continue
            unit, index = self.refs.pop(ref)
            try:
                outputs, compute_s = ray.get(ref)
            except Exception as exc:  # RayActorError when killed; any executor error fails the unit
                return self._fail(unit, exc)
            unit.done += 1
            unit.compute_s += compute_s
            if self.sink is not None:  # placed now, while the actor runs the unit's next parts
                self.sink(unit.parts[index][0], outputs)
            else:
                unit.outputs[index] = outputs
            if unit.done == len(unit.parts):
                units = self.units.get(unit.executor, [])
                if unit in units:
                    units.remove(unit)
                if not units:
                    self.units.pop(unit.executor, None)
                self._launch(unit.executor)
                if self.sink is not None:
                    return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(),
                                      unit.compute_s, delivered=True)
                parts = [unit.outputs[i] for i in range(len(unit.parts))]
                joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
                return Completion(unit.executor, unit.start, unit.size, unit.submitted, self.now(), unit.compute_s,
                                  joined)
            if self._launch(unit.executor) and self._draining(unit.executor):
                return Ready(unit.executor)
