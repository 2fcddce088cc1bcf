"""Executors as Ray actors: ``ExecutorActor`` forwards each call to the plain Executor it holds;
``ExecutorGroupActor`` holds the green-context partitions of one GPU in one process, each member on its own
thread. The Ray resources and node placement of an actor come from its spec's kind
(``ExecutorSpec.ray_resources``); ``check_cluster_resources`` refuses a pool the cluster cannot hold."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.workload import Workload
from autohet.executors import ExecutorSpec, make_executor
from autohet.platform.gc_control import settle
from autohet.pool.spec import PoolSpec

__all__ = ["ASIDE_GROUP", "ExecutorActor", "ExecutorGroupActor", "MemberHandle", "actor_options",
           "check_cluster_resources", "group_options", "kill_actor", "ray_node_id", "user_errors"]


# an executor actor's calls about a setting set up in a child process (``compile_aside``, ``wait_aside``): on a
# thread of their own, so that waiting for the child does not wait for the actor's own work queued before it
ASIDE_GROUP = "aside"


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


def _configure_settled(executor: Any, params: dict[str, Any]) -> None:
    """``configure``, then its set-up's garbage collected (``settle``) where it set anything up. Unchanged
    params (most of a tune's trials on a live topology) skip the collection: with a compiled model held it
    walks every object the process has, 0.3-0.5 s a trial on the H200 boxes' Xeons, counted as acquiring
    (BENCHMARKS.md 45)."""
    if executor.configure(params):
        settle()


class ExecutorActor:
    """Wrapped with ``ray.remote`` at use; every method forwards to the Executor it holds."""

    def __init__(self, spec: ExecutorSpec, model: ModelSpec) -> None:
        self.executor = make_executor(spec, model)
        self._aside: Any = None  # a setting being set up in a child process (``compile_aside``)
        self._standby: Any = None  # a child waiting to be given one (``standby_aside``)

    def load(self, workload: Workload) -> dict[str, Any]:
        self.executor.load(workload)
        settle()  # the set-up's garbage collected here, not in the run's units
        return self.executor.describe()

    def configure(self, params: dict[str, Any]) -> dict[str, Any]:
        _configure_settled(self.executor, params)
        return self.executor.describe()

    def prepare_ahead(self, params: dict[str, Any], cores: list[int], after: list[Any] | None = None
                      ) -> dict[str, Any]:
        """``configure`` with its compiles on ``cores`` (``compiling_on``): this idle executor sets up a
        setting another executor's trial will need, while that trial runs (``autohet.tuning.ahead``); when it
        ended is reported with it. ``after``: the Ray ref of the work compiling that setting cold elsewhere
        (in a list, so that Ray leaves it to this call), waited for first, so that the set-up reads the cache
        it fills; where that work failed, nothing is set up (``skipped``): the trial that needs the setting
        meets the failure as its own."""
        from autohet.executors.compiled import compiling_on

        if after:
            import ray

            try:
                ray.get(after)
            except Exception as exc:  # noqa: BLE001 - reported, not raised: this executor is as it was
                return {"skipped": type(exc).__name__, "ended_at": time.time()}
        with compiling_on(frozenset(cores)):
            described = self.configure(params)
        return {**described, "ended_at": time.time()}

    def standby_aside(self, cores: list[int]) -> None:
        """Starts a child on standby for the next ``compile_aside``, its imports made on ``cores`` meanwhile.
        Called in ``ASIDE_GROUP``."""
        from autohet.executors.aside import spawn_aside

        if self._standby is None or not self._standby.waiting:
            self._standby = spawn_aside(frozenset(cores))

    def compile_aside(self, params: dict[str, Any], cores: list[int]) -> None:
        """Starts setting ``params`` up in a child process on this actor's device and ``cores``, beside this
        actor's own work, into the compile cache every executor shares (the child on standby, where there is
        one); returns at once (``wait_aside``). Called in ``ASIDE_GROUP``, as ``wait_aside`` is."""
        from autohet.executors.aside import spawn_aside

        assert self.executor.workload is not None, "load() first"
        if self._aside is not None:
            self._aside.end()
        standby, self._standby = self._standby, None
        self._aside = standby if standby is not None and standby.waiting else spawn_aside()
        self._aside.give(self.executor.spec.with_params(params), self.executor.model_spec,
                         self.executor.workload.shape, frozenset(cores))

    def wait_aside(self) -> dict[str, Any]:
        """Blocks until the child ``compile_aside`` started ends; what it reports. Raises where it failed."""
        aside, self._aside = self._aside, None
        return aside.wait()

    def aside_ended(self) -> None:
        """Blocks until the child ``compile_aside`` started ends, whatever its end (another executor's
        ``prepare_ahead`` waits on this before reading the cache it fills). Called in ``ASIDE_GROUP``."""
        if self._aside is not None:
            self._aside.proc.wait()

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
    only forward. Fed from whichever of Ray's pool threads took the call, a partition ran far slower
    than fed from its own thread (docs/why.md, pool/actors.py)."""

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
        # failed both (docs/why.md, pool/actors.py)
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
            self.workers[member].call(lambda: _configure_settled(executor, params))
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


