"""Pools: the executors of a run, in-process (threads), as Ray actors, or on a virtual clock."""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.workload import PixelScale, Workload
from autohet.executors import Executor, ExecutorSpec, executor_kind, make_executor, runs_ahead
from autohet.platform.ray_cluster import get_interruptibly, wait_interruptibly
from autohet.pool.dispatch import Dispatcher, LocalDispatcher, VirtualClockDispatcher
from autohet.pool.spec import PoolSpec
from autohet.pool.worker import Worker

if TYPE_CHECKING:
    from autohet.pool.lanes import Lanes

__all__ = ["Identity", "LocalPool", "Pool", "RayPool", "StreamStats", "VirtualPool", "identity"]


# loading a model, its workload and (inductor) compiling takes seconds to minutes; an actor that
# has not started after this long waits for resources it will not get
ACTOR_START_TIMEOUT_S = 600.0


class Identity(NamedTuple):
    """What makes two executors the same worker: an actor of one serves the other after
    ``configure`` (batch and precision are per run)."""

    name: str
    kind: str
    cores: tuple[int, ...]
    gpu: int | None
    node: str | None

    @property
    def holds_gpu(self) -> bool:
        """Its actor holds a real GPU while alive (see ``ExecutorKind.holds_gpu``)."""
        return executor_kind(self.kind).holds_gpu


def identity(spec: ExecutorSpec) -> Identity:
    return Identity(spec.name, spec.kind, spec.cores, spec.gpu, spec.node)


@dataclass
class StreamStats:
    """Where a stream's time went, summed over its windows (``stream_windows``): waiting for the
    source's next window (``wait_s``: a service's requests not there yet), staging windows into pinned
    memory (``stage_s``, beside the device's work) and the device's own time on them (``device_s``,
    CUDA events). Against the wall time they say whether the device or its feeding is the bound."""

    windows: int = 0
    images: int = 0
    wait_s: float = 0.0
    stage_s: float = 0.0
    device_s: float = 0.0
    # a stream over several executors (``autohet.pool.lanes``): each one's images and busy seconds
    executors: dict[str, dict[str, float]] = field(default_factory=dict)


class Pool(ABC):
    """Executors started for one model and workload; strategies use them through dispatchers."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.started_for: tuple[ModelSpec, int] | None = None
        self.stream_stats = StreamStats()

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.spec.executors]

    @property
    def simulated(self) -> bool:
        return self.spec.simulated

    on_ray = False  # in-process strategies then run their engine in a Ray actor

    def __len__(self) -> int:
        return len(self.spec.executors)

    @abstractmethod
    def start(self, model: ModelSpec, workload: Workload) -> float:
        """Builds the model on every executor and places the workload once; returns compile seconds."""

    @abstractmethod
    def dispatcher(self) -> Dispatcher: ...

    @abstractmethod
    def set_workload(self, workload: Workload) -> list[int]:
        """Gives the started executors new images (a served call's), models kept; returns the
        executors that could not take them (dead)."""

    def overlaps_windows(self) -> bool:
        """Whether ``stream_windows`` can run a stream (one executor that queues units asynchronously)."""
        return False

    def stream_windows(self, windows: Iterable[list[np.ndarray]], lock: Any) -> Iterator[np.ndarray]:
        """Each window's outputs, the next window's units queued before the current one's are collected
        (only where ``overlaps_windows``)."""
        raise NotImplementedError(f"{type(self).__name__} does not overlap a stream's windows")

    def accept_pixels(self, scale: PixelScale) -> bool:
        """Whether every executor takes uint8 pixels and scales them itself (then they do, by ``scale``);
        else calls keep float32 inputs. Executors behind Ray take float32."""
        return False

    def lanes(self, speeds: list[float | None], alive: list[bool]) -> Lanes | None:
        """A stream over every executor, each on a lane of its own (``autohet.pool.lanes``), where this
        pool's executors can run staged pieces; else None (its streams go window by window)."""
        return None

    def stage(self, parts: list[np.ndarray]) -> Any:
        """A stream's next call made ready while the current one runs (``use_staged`` then gives it to the
        executors): by default the parts joined, to be placed with ``set_workload``."""
        from autohet.executors.base import join_parts

        return join_parts(parts)

    def use_staged(self, staged: Any) -> list[int]:
        """Gives the executors the staged call's images; returns those that could not take them."""
        return self.set_workload(Workload(staged, len(staged)))

    @abstractmethod
    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        """Each executor's throughput running alone, measured one after another (only ``indices``,
        in that order, when given)."""

    def configure(self, by_kind: dict[str, dict[str, Any]]) -> float:
        """Applies per-kind executor params (batch, precision, backend...) for the next run; returns
        the seconds executors spent compiling for them."""
        self.spec = self.spec.with_executor_params(by_kind)
        return sum(d.get("compile_s", 0.0) for d in self._apply_config())

    def _apply_config(self) -> list[dict[str, Any]]:
        """Optional hook: push the new executor params to live executors; their descriptions."""
        return []

    def shutdown(self) -> None:  # noqa: B027
        """Optional hook: stop executors."""


class LocalPool(Pool):
    """Executors in this process, each on its own long-lived thread: no Ray, for tests and
    in-process baselines. Every executor call runs on its thread (never the caller's)."""

    executors: list[Executor]
    workers: list[Worker]

    def start(self, model: ModelSpec, workload: Workload) -> float:
        if getattr(self, "executors", None) and self.started_for == (model, workload.images):
            return 0.0
        self.shutdown()
        self.executors = [make_executor(s, model) for s in self.spec.executors]
        for members in self.spec.partition_groups():  # partitions of one GPU: disjoint SMs of this process
            from autohet.executors.green import sm_partitions

            specs = [self.spec.executors[i] for i in members]
            for i, part in zip(members, sm_partitions(specs[0].gpu or 0, [e.sms for e in specs]), strict=True):
                self.executors[i].stream_override = part.stream
        self.workers = [Worker(s.name) for s in self.spec.executors]
        # GPU executors load (and capture their CUDA graphs) before the others convert their models: on
        # the H200 box a GPU's graph capture beside an ONNX Runtime group's export (torch.export, on
        # another thread of this process) failed with cuDNN's FIND inside the capture, twice. An executor
        # that compiles (inductor) loads alone: dynamo's tracing patches nn.Module.__call__ for the whole
        # process, and two GPUs compiling at once on the 2-GPU H200 box failed ("Detected that you are
        # using FX to symbolically trace a dynamo-optimized function")
        for gpu_phase in (True, False):
            phase = [(w, ex) for w, ex, s in zip(self.workers, self.executors, self.spec.executors, strict=True)
                     if s.uses_gpu == gpu_phase]
            for w, ex in phase:
                if ex.spec.compiles:
                    w.call(lambda ex=ex: ex.load(workload))
            loads = [w.submit(lambda ex=ex: ex.load(workload)) for w, ex in phase if not ex.spec.compiles]
            for future in loads:
                future.result()
        self.started_for = (model, workload.images)
        return sum(ex.describe().get("compile_s", 0.0) for ex in self.executors)

    def dispatcher(self) -> Dispatcher:
        return LocalDispatcher(self.executors, self.workers)

    def overlaps_windows(self) -> bool:
        return len(getattr(self, "executors", [])) == 1 and self.executors[0].launches_async

    def stream_windows(self, windows: Iterable[list[np.ndarray]], lock: Any) -> Iterator[np.ndarray]:
        """One asynchronous executor's stream: window k+1 staged (into the other of the GPU's two pinned
        buffers) while window k runs, and its units queued before window k's outputs are collected, so
        the device never waits for the host at a window's end. Window k+2 is staged only once window
        k is collected (it reuses k's buffer). ``lock`` is held while a window is handed over and
        queued: calls from other threads run between windows. On the H200 box the in-process executor
        ran resnet18 at 71-74k img/s with each next unit queued ahead and 65k without
        (``bench/gpu_launch_probe.py``); a windowed stream without this ran 61-64k (BENCHMARKS 18)."""
        from concurrent.futures import ThreadPoolExecutor, wait

        ex, worker = self.executors[0], self.workers[0]
        source = iter(windows)
        stats = self.stream_stats

        def next_staged() -> tuple[Any, int] | None:
            asked = time.perf_counter()
            parts = next(source, None)
            if parts is None:
                return None
            got = time.perf_counter()
            staged = ex.stage(parts)
            stats.wait_s += got - asked
            stats.stage_s += time.perf_counter() - got
            return staged, sum(len(p) for p in parts)

        def queue(staged: Any, images: int) -> Any:
            ex.use_staged(staged)
            return ex.launch(0, images)

        launched: deque[Any] = deque()

        def collected() -> np.ndarray:
            unit = worker.call(lambda h=launched.popleft(): ex.collect(h))
            stats.windows += 1
            stats.images += len(unit.outputs)
            stats.device_s += unit.compute_s
            return unit.outputs

        with ThreadPoolExecutor(1, thread_name_prefix="autohet-stage") as stager:
            try:
                ahead = stager.submit(next_staged)
                while True:
                    # the next window is not here yet: a window the device has finished is handed back
                    # meanwhile (a producer may wait for its outputs before sending more); one still
                    # running is left queued, so a source that keeps up keeps the device busy
                    while launched and not ahead.done():
                        if ex.ready(launched[0]):
                            yield collected()
                        else:
                            wait([ahead], timeout=0.001)
                    if (current := ahead.result()) is None:
                        break
                    with lock:
                        launched.append(worker.call(lambda c=current: queue(*c)))
                    if len(launched) == 2:  # window k-1 collected: its buffer is free for window k+1
                        yield collected()
                    ahead = stager.submit(next_staged)
                while launched:
                    yield collected()
            finally:  # a stream ended early (an error, a close): its windows' copies done before their
                for handle in launched:  # memory is let go (a window may be read in place)
                    with contextlib.suppress(Exception):
                        worker.call(lambda h=handle: ex.collect(h))

    def lanes(self, speeds: list[float | None], alive: list[bool]) -> Lanes | None:
        executors = getattr(self, "executors", [])
        if len(executors) < 2 or not all(ex.runs_staged for ex in executors):
            return None
        from autohet.pool.lanes import Lanes

        return Lanes(executors, self.workers, speeds, alive)

    def accept_pixels(self, scale: PixelScale) -> bool:
        if not self.executors or not all(ex.takes_pixels for ex in self.executors):
            return False
        for ex in self.executors:  # read by the executors' units only, set between calls
            ex.pixel_scale = scale
        return True

    def set_workload(self, workload: Workload) -> list[int]:
        for future in [w.submit(lambda ex=ex: ex.set_workload(workload))
                       for w, ex in zip(self.workers, self.executors, strict=True)]:
            future.result()
        return []

    def stage(self, parts: list[np.ndarray]) -> list[Any]:
        """Each executor's staging of the next call, on the calling thread (the executors' own threads
        may be running the current call); executors that stage the default way share one joined copy."""
        joined: Any = None
        out = []
        for ex in self.executors:
            if type(ex).stage is Executor.stage:
                joined = ex.stage(parts) if joined is None else joined
                out.append(joined)
            else:
                out.append(ex.stage(parts))
        return out

    def use_staged(self, staged: Any) -> list[int]:
        for future in [w.submit(lambda ex=ex, s=s: ex.use_staged(s))
                       for w, ex, s in zip(self.workers, self.executors, staged, strict=True)]:
            future.result()
        return []

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        chosen = range(len(self.executors)) if indices is None else indices
        return [self.workers[i].call(lambda i=i: self.executors[i].standalone_ips(min_seconds, max_images))
                for i in chosen]

    def _apply_config(self) -> list[dict[str, Any]]:
        out = []
        for worker, ex, spec in zip(self.workers, self.executors, self.spec.executors, strict=True):
            worker.call(lambda ex=ex, spec=spec: ex.configure(spec.executor_params()))
            out.append(ex.describe())
        return out

    def shutdown(self) -> None:
        for worker in getattr(self, "workers", []):
            worker.close(wait_s=2.0)
        self.workers, self.executors = [], []
        self.started_for = None


class VirtualPool(Pool):
    """Simulated executors on a virtual clock: deterministic figures, always labelled simulated."""

    def __init__(self, spec: PoolSpec, die_at: dict[int, float] | None = None) -> None:
        super().__init__(spec)
        self.die_at = die_at or {}

    def start(self, model: ModelSpec, workload: Workload) -> float:
        self.started_for = (model, workload.images)
        return 0.0

    def set_workload(self, workload: Workload) -> list[int]:
        return []  # simulated units read no images

    def dispatcher(self) -> Dispatcher:
        execs = self.spec.executors
        return VirtualClockDispatcher(self.names, [e.speed_ips for e in execs], [e.overhead_s for e in execs],
                                      self.die_at, [e.needs_gpu for e in execs])

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        out = []
        chosen = range(len(self.spec.executors)) if indices is None else indices
        for e in (self.spec.executors[i] for i in chosen):
            unit = max(1, min(e.batch, max_images or e.batch))
            out.append(unit / (e.overhead_s + unit / e.speed_ips))
        return out


class RayPool(Pool):
    """One Ray actor per executor, created once and reused by every run of the same model."""

    on_ray = True

    def __init__(self, spec: PoolSpec, name_prefix: str | None = None, reserve_cpus: bool = True) -> None:
        super().__init__(spec)
        self.actors: list[Any] = []
        self.name_prefix = name_prefix
        self.reserve_cpus = reserve_cpus
        self.workload_ref: Any = None

    @classmethod
    def attached(cls, spec: PoolSpec, actors: list[Any], started_for: tuple[ModelSpec, int]) -> RayPool:
        """A pool over actors someone else started (the tuner's manager); it does not own them."""
        pool = cls(spec)
        pool.actors = list(actors)
        pool.started_for = started_for
        pool.owned = False
        return pool

    owned = True

    def start(self, model: ModelSpec, workload: Workload, adopt: dict[tuple, Any] | None = None) -> float:
        """Creates and loads the actors; ``adopt`` maps executor identities (``identity``) to live
        actors already loaded with this model and workload, which are used as they are."""
        import ray

        from autohet.pool.ray_pool import check_cluster_resources, user_errors

        if self.actors and (not self.owned or self.started_for == (model, workload.images)):
            return 0.0
        check_cluster_resources(self.spec)
        self.shutdown()
        adopt = adopt or {}
        self.workload_ref = ray.put(workload)
        self.actors = [None] * len(self.spec.executors)
        fresh: list[Any] = []
        fresh_names: list[str] = []
        for members in self.spec.partition_groups():  # partitions of one GPU: one process, adopted as a whole
            handles = [adopt.get(identity(self.spec.executors[i])) for i in members]
            if any(h is None for h in handles) or len({id(getattr(h, "actor", h)) for h in handles}) != 1:
                handles = self._new_group([self.spec.executors[i] for i in members], model)
                fresh += handles
                fresh_names += [self.spec.executors[i].name for i in members]
            for i, handle in zip(members, handles, strict=True):
                self.actors[i] = handle
        for i, spec in enumerate(self.spec.executors):
            if self.actors[i] is None:
                self.actors[i] = adopt.get(identity(spec))
                if self.actors[i] is None:
                    self.actors[i] = self._new_actor(spec, model, "")
                    fresh.append(self.actors[i])
                    fresh_names.append(spec.name)
        refs = [a.load.remote(self.workload_ref) for a in fresh]
        with user_errors():
            pending = wait_interruptibly(refs, ACTOR_START_TIMEOUT_S)
            if pending:
                late = [n for n, r in zip(fresh_names, refs, strict=True) if r in pending]
                raise UserError(f"executors {', '.join(late)} did not start within {ACTOR_START_TIMEOUT_S:.0f} s: "
                                "Ray could not place them (their cores or GPU held by other actors; `ray status` "
                                "shows the pending demand); end other Ray jobs on this machine or use a smaller pool")
            described = ray.get(refs)
        self.adopted = len(self.actors) - len(fresh)
        self.started_for = (model, workload.images)
        return sum(d.get("compile_s", 0.0) for d in described)

    def _new_actor(self, spec: ExecutorSpec, model: ModelSpec, suffix: str) -> Any:
        """An executor actor (named ``<prefix>-<executor><suffix>`` when the pool has a prefix), not loaded."""
        import ray

        from autohet.pool.ray_pool import ExecutorActor, actor_options

        name = f"{self.name_prefix}-{spec.name}{suffix}" if self.name_prefix else None
        opts = actor_options(spec, name, self.reserve_cpus)
        return ray.remote(ExecutorActor).options(**opts).remote(spec, model)

    def _new_group(self, specs: list[ExecutorSpec], model: ModelSpec) -> list[Any]:
        """One actor for the partitions of one GPU; a handle per member."""
        import ray

        from autohet.pool.ray_pool import ExecutorGroupActor, MemberHandle, group_options

        name = f"{self.name_prefix}-{specs[0].name}-group" if self.name_prefix else None
        actor = ray.remote(ExecutorGroupActor).options(**group_options(specs, name, self.reserve_cpus)).remote(
            specs, model)
        return [MemberHandle(actor, k) for k in range(len(specs))]

    def dispatcher(self) -> Dispatcher:
        from autohet.pool.ray_pool import RayDispatcher

        execs = self.spec.executors
        # GPUs (and simulated ones, which exercise the same protocol) and asynchronous CPU groups
        # (OpenVINO) take their next unit early
        return RayDispatcher(self.names, self.actors, [e.max_unit_images for e in execs],
                             lookahead=[runs_ahead(e) for e in execs])

    def set_workload(self, workload: Workload) -> list[int]:
        """The images through the object store once; each actor maps them (read-only, no copy)."""
        import ray
        from ray.exceptions import RayActorError

        self.workload_ref = ray.put(workload)
        refs = [a.set_workload.remote(self.workload_ref) for a in self.actors]
        dead = []
        for i, ref in enumerate(refs):
            try:
                ray.get(ref)
            except RayActorError:
                dead.append(i)
        return dead

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        from ray.exceptions import RayActorError

        out = []
        for actor in (self.actors if indices is None else [self.actors[i] for i in indices]):
            try:
                out.append(float(get_interruptibly(actor.standalone_ips.remote(min_seconds, max_images))))
            except RayActorError:  # a dead executor has no standalone throughput
                out.append(0.0)
        return out

    def _apply_config(self) -> list[dict[str, Any]]:
        from autohet.pool.ray_pool import user_errors

        if not self.actors:
            return []
        with user_errors():
            return get_interruptibly([a.configure.remote(s.executor_params())
                                      for a, s in zip(self.actors, self.spec.executors, strict=True)])

    def replace(self, indices: list[int]) -> None:
        """Kills these executors' actors (e.g. busy with a unit nobody waits for) and starts fresh
        ones with the same spec, workload and params (a partition's whole group)."""
        from autohet.pool.ray_pool import kill_actor

        self.replaced = getattr(self, "replaced", 0) + 1
        groups = {i: g for g in self.spec.partition_groups() for i in g}
        indices = sorted({j for i in indices for j in groups.get(i, [i])})
        for i in indices:
            kill_actor(self.actors[i])
        fresh: dict[int, Any] = {}
        for members in {tuple(groups[i]) for i in indices if i in groups}:
            fresh.update(zip(members, self._new_group([self.spec.executors[i] for i in members],
                                                      self.started_for[0]), strict=True))
        for i in indices:
            if i not in fresh:
                fresh[i] = self._new_actor(self.spec.executors[i], self.started_for[0], f"-r{self.replaced}")
        get_interruptibly([fresh[i].load.remote(self.workload_ref) for i in fresh])
        for i, actor in fresh.items():
            self.actors[i] = actor

    def kill(self, index: int) -> None:
        """Kills one executor's actor (fault tests and operators' drills)."""
        from autohet.pool.ray_pool import kill_actor

        kill_actor(self.actors[index])

    def shutdown(self) -> None:
        from autohet.pool.ray_pool import kill_actor

        if not self.owned:
            return
        for actor in self.actors:
            kill_actor(actor)
        self.actors = []
        self.started_for = None
