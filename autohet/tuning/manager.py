"""The executors of a tune: created once per pool topology, reused by every trial that needs it.

Trials run in Ray Tune's worker processes; they ask the manager (a Ray actor holding no
devices) for the actor handles of the topology a trial wants, with that trial's executor
parameters applied. Only one topology runs at a time: devices are never shared by two runs.
Executors present in two topologies (a GPU with its feeding core) keep one actor, and the
actors of a topology the tuner left stay alive for when it comes back; short of memory, their CPU
executors drop what they built first (``RELEASE_IDLE_BELOW``).

Standalone throughputs (the limit) are measured once per executor class and configuration
(``autohet.pool.standalone``) and reused by every later trial and topology. While a trial runs on some of
the GPUs, an idle one compiles the tune's coming settings ahead (``autohet.tuning.ahead``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from autohet.core.models import ModelSpec
from autohet.core.settings import AHEAD_GIVE_UP_S, RELEASE_IDLE_BELOW
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec
from autohet.executors.backends import engine_backends
from autohet.pool import Identity, PoolSpec, RayPool, StandaloneCache, identity, load_pool
from autohet.pool.spec import POOL_DIMS
from autohet.tuning.ahead import AheadRunner, CompileAhead, RayAhead, ahead_cores

__all__ = ["RELEASE_IDLE_BELOW", "STATUS_GROUP", "PoolManager", "ask_now", "regroup", "remote_manager"]

# The manager actor's concurrency group of its own thread for ``PoolManager.now``: answered while a trial's
# acquire still blocks the actor's main thread (a trial the search's time budget stopped in it).
STATUS_GROUP = "status"

_log = logging.getLogger(__name__)


def regroup(base: PoolSpec, pool_params: dict[str, Any]) -> PoolSpec:
    """The auto pool re-detected with the trial's pool dims (cpu_group_size, max_cpu_groups, gpu_partitions);
    explicit pools stay as they are."""
    overrides = {k: v if v == "all" else int(v) for k, v in pool_params.items() if k in POOL_DIMS
                 and v is not None}
    if not base.auto or not overrides or base.source.startswith("auto on"):
        return base
    source = None if base.source == "auto" else base.source
    return load_pool(source, auto_overrides=overrides)


class PoolManager:
    """Plain class (wrapped by ray.remote in the tuner): the tune's executors, across topologies.

    Actors are kept by executor identity: a topology that comes back (the tuner revisits a
    cpu_group_size) finds its actors alive and loaded. Idle topologies claim no Ray CPUs (only
    one topology runs at a time); at most ``max_live_actors`` are kept, least recently used
    ended first.
    """

    def __init__(self, base: PoolSpec, model: ModelSpec, workload: WorkloadSpec | Workload, prefix: str,
                 pool_factory: Callable[[PoolSpec, str], Any] | None = None,
                 kill: Callable[[Any], None] | None = None, max_live_actors: int | None = None,
                 release: Callable[[list[Any]], None] | None = None,
                 memory_share: Callable[[], float] | None = None, ahead: AheadRunner | None = None,
                 cores: frozenset[int] | None = None) -> None:
        # built here from the (small) spec: a restarted manager needs nothing from the object store
        self.workload = Workload.from_spec(workload) if isinstance(workload, WorkloadSpec) else workload
        self.base = base
        self.model = model
        self.prefix = prefix
        self.pool_factory = pool_factory or (lambda spec, name: RayPool(spec, name, reserve_cpus=False))
        self.kill = kill or _kill_actor
        self.release = release or _release_actors
        self.memory_share = memory_share or _memory_available_share
        self.max_live_actors = max_live_actors or 4 * (os.cpu_count() or 1)
        self.pool: Any = None
        self.key: tuple | None = None
        self.live: dict[tuple, Any] = {}  # executor identity -> loaded actor
        self.last_used: dict[tuple, int] = {}
        self.acquires = 0
        self.topologies_started = 0
        self.actors_adopted = 0
        self.actors_replaced = 0
        self.actors_released = 0
        self.best_ips: float | None = None
        self.engine_ips: dict[frozenset[Identity], float] = {}  # devices -> the best engine trial on them
        # a data-parallel strategy beside GPUs -> its best figure with CPU groups taking work, and without
        self.cpu_beside: dict[str, dict[bool, float]] = {}
        self.standalone_cache = StandaloneCache()
        self.ahead = CompileAhead(ahead or RayAhead(), ahead_cores(base, cores))
        self.topologies_ahead: list[dict[str, Any]] = []  # the plan's topologies not yet started
        self.loading: dict[Identity, Any] = {}  # actors started ahead -> their load call
        self.actors_ahead = 0
        self.doing: tuple[str, float] | None = None  # the step of a trial's call under way, since when (``now``)
        self.returned: tuple[str, float] | None = None  # the last such call to return, and when

    def plan_ahead(self, plan: list[dict[str, dict[str, Any]]],
                   first: tuple[dict[str, Any], list[int] | None] | None = None) -> None:
        """What the tune will need, in order (``FirstPoints.ahead``): executor settings, compiled ahead on
        idle GPUs, and topologies (``pool`` entries), whose new CPU executors start ahead on idle cores
        (``autohet.tuning.ahead``). ``first``: the first trial's pool params and the executors it uses; where
        it runs on the live topology (the calibration's), the GPUs it leaves idle start on the plan now, while
        Ray Tune starts its trial process (9 s of efficientnet_b0's two-GPU tune, BENCHMARKS.md 43)."""
        self.ahead.set_plan(plan)
        self.topologies_ahead = [dict(entry["pool"]) for entry in plan if "pool" in entry]
        if first is None or self.pool is None or self.loading:
            return
        pool_params, used = first
        try:  # only a head start: what fails here, the first trial meets as its own
            if tuple(identity(e) for e in regroup(self.base, pool_params).executors) == self.key:
                count = len(self.pool.spec.executors)
                self.ahead.start(self.pool.spec, self.pool.actors,
                                 None if used is None else [i for i in used if 0 <= i < count])
        except Exception as exc:
            _log.info("no work ahead before the first trial: %s",
                      (str(exc).strip().splitlines() or [type(exc).__name__])[-1])

    def now(self) -> dict[str, Any]:
        """What the manager does for the trials at this moment (called in ``STATUS_GROUP``): ``doing`` and
        ``for_s`` while a call is under way, else ``after`` (the last call to return) and ``idle_s``; empty
        before any. A trial the search's time budget stopped is logged with it (``study.stopped_trials``)."""
        at = time.monotonic()
        if self.doing is not None:
            return {"doing": self.doing[0], "for_s": at - self.doing[1]}
        if self.returned is not None:
            return {"after": self.returned[0], "idle_s": at - self.returned[1]}
        return {}

    def _step(self, what: str) -> None:
        self.doing = (what, time.monotonic())

    def _returned(self, call: str) -> None:
        self.doing, self.returned = None, (call, time.monotonic())

    def acquire(self, pool_params: dict[str, Any], exec_params: dict[str, dict[str, Any]],
                only: list[int] | None = None) -> tuple[PoolSpec, list[Any], float]:
        """The topology's spec and actors with the trial's executor params applied (to the executors
        ``only`` names, where given: those the trial uses), and the seconds the executors spent
        compiling for it (0 when their compiled artefacts were already there)."""
        try:
            return self._acquire(pool_params, exec_params, only)
        finally:
            self._returned("acquire")

    def _acquire(self, pool_params: dict[str, Any], exec_params: dict[str, dict[str, Any]],
                 only: list[int] | None) -> tuple[PoolSpec, list[Any], float]:
        self._step("acquiring executors: waiting for the compiles ahead they need")
        spec = regroup(self.base, pool_params)
        key = tuple(identity(e) for e in spec.executors)
        self.acquires += 1
        compile_s = 0.0
        # an index past this topology's executors (a single drawn for a larger one) is the strategy's to refuse
        used = None if only is None else [i for i in only if 0 <= i < len(spec.executors)]
        if key == self.key and self.pool is not None and not self.loading:  # idle GPUs queue first, then the wait
            self.ahead.queue_after(self.pool.spec, self.pool.actors, used)
        self._end_failed(self.ahead.settle(self.ahead.conflicts(spec.with_executor_params(exec_params), used,
                                                                key != self.key or self.pool is None)))
        fresh = key != self.key or self.pool is None
        if self._meets_loading(spec, used, fresh):
            self._step(f"acquiring executors: waiting for {_names(self.loading)} started ahead to load")
            self._settle_loading()
        if fresh:
            adopt = {i: self.live[i] for i in key if i in self.live}
            self._step(f"acquiring executors: starting the topology {_names(key)} ({len(key) - len(adopt)} new)")
            self._free_gpus(set(key) - set(adopt))
            self._release_idle(set(key))
            self.pool = self.pool_factory(spec, f"{self.prefix}-t{self.topologies_started}")
            compile_s += self.pool.start(self.model, self.workload, adopt=adopt) or 0.0
            self.pool.owned = False  # its actors are the manager's to end
            self.live.update(zip(key, self.pool.actors, strict=True))
            self.key = key
            self.topologies_started += 1
            self.actors_adopted += len(adopt)
        self.last_used.update(dict.fromkeys(key, self.acquires))
        self._evict(set(key))
        targets = list(range(len(key))) if only is None else used
        later = self.ahead.compiled_after(self.pool.spec.with_executor_params(exec_params), targets)
        first = [i for i in targets if i not in later]
        self._step(f"acquiring executors: setting up {_names([key[i] for i in first])} with the trial's executor "
                   "params")
        compile_s += self.pool.configure(exec_params, first) or 0.0
        if later:  # from the cache the first of their GPUs' setting filled
            self._step(f"acquiring executors: setting up {_names([key[i] for i in later])} from the compile cache")
            compile_s += self.pool.configure_rest(later) or 0.0
        self.ahead.note_set_up(self.pool.spec, set(range(len(self.pool.spec.executors))) - self.pool.unconfigured)
        if not self.loading:
            self.ahead.start(self.pool.spec, self.pool.actors, used)
        self._start_topology_ahead(used)
        return self.pool.spec, list(self.pool.actors), compile_s

    def _start_topology_ahead(self, used: list[int] | None) -> None:
        """While a trial runs on GPUs alone (one, or all together) and no compile ahead holds the cores, the
        plan's next topology has its new CPU executors created and loading on their idle cores: the tune's first
        CPU single had waited 10-13 s for its group of every core to start (BENCHMARKS.md 34, 39). Their load is
        waited for before anything uses those cores or starts actors of its own (``_meets_loading``)."""
        assert self.pool is not None
        if used is None:  # every executor of the topology: the GPUs together, where it holds only GPUs
            used = list(range(len(self.pool.spec.executors)))
        if not self.topologies_ahead or not used or self.ahead.jobs or self.ahead.on_our_cores(self.pool.spec, used):
            return
        spec = regroup(self.base, self.topologies_ahead.pop(0))
        new = [e for e in spec.executors if identity(e) not in self.live]
        if not new or any(e.uses_gpu or e.node is not None for e in new):
            return  # nothing to start, or a GPU's actor (it would claim the GPU a trial runs on)
        pool = self.pool_factory(spec, f"{self.prefix}-a{self.actors_ahead}")
        loads = pool.launch(self.model, self.workload, adopt={identity(e): self.live[identity(e)]
                                                               for e in spec.executors if identity(e) in self.live})
        for i, load in loads.items():
            ident = identity(spec.executors[i])
            self.live[ident], self.loading[ident] = pool.actors[i], load
            self.last_used[ident] = self.acquires
        self.actors_ahead += len(loads)

    def _end_failed(self, executors: list[Identity]) -> None:
        """Ends the executors whose ahead work failed; the next acquire starts the topology again (fresh ones
        for these, the others adopted)."""
        for ident in executors:
            self._end(ident)
            self.key = None

    def _meets_loading(self, spec: PoolSpec, used: list[int] | None, fresh: bool) -> bool:
        """Whether a trial on ``spec`` must wait for the actors started ahead to load: an engine family's (it
        runs on the devices themselves), one whose executors run on their cores (any CPU executor, or a GPU fed
        from one), or a new topology that starts actors of its own (they would load beside). The GPUs
        together on a topology of live actors are measured while a CPU group loads, as a GPU single is."""
        if not self.loading:
            return False
        if used == []:
            return True
        loading = {c for ident in self.loading for c in ident.cores}
        execs = spec.executors if used is None else [spec.executors[i] for i in used]
        if any(not e.uses_gpu or set(e.pinned_cores) & loading for e in execs):
            return True
        return fresh and any(identity(e) not in self.live for e in spec.executors)

    def _settle_loading(self) -> None:
        """Waits for the actors started ahead to load (counted as acquiring); ends any that failed or still
        loads ``AHEAD_GIVE_UP_S`` later, so that the topology needing it starts its own and meets the
        failure, if any, as its own."""
        for ident, load in list(self.loading.items()):
            if self.ahead.runner.wait(load, AHEAD_GIVE_UP_S) is None:
                self._end(ident)
            del self.loading[ident]

    def _free_gpus(self, fresh: set[Identity]) -> None:
        """Ends the idle actors that hold a GPU a fresh executor needs. An idle CPU group claims no
        Ray CPUs, but a GPU actor claims its GPU while alive: the whole GPU's actor and the actor of
        its partitions cannot both exist, and a new one would wait for the GPU forever."""
        wanted = {(i.node, i.gpu) for i in fresh if i.holds_gpu}
        for ident in [i for i in self.live if i.holds_gpu and (i.node, i.gpu) in wanted and i not in fresh]:
            self._end(ident)

    def _release_idle(self, current: set[Identity]) -> None:
        """Short of memory (``RELEASE_IDLE_BELOW``), the idle CPU executors drop their programs before
        the topology ``current`` builds its own; GPU executors keep theirs (device memory)."""
        idle = [actor for ident, actor in self.live.items() if ident not in current and not ident.holds_gpu]
        if idle and self.memory_share() < RELEASE_IDLE_BELOW:
            self.release(idle)
            self.actors_released += len(idle)

    def _end(self, ident: Identity) -> None:
        """Ends a live executor's actor; a partition's group actor takes its other members with it."""
        actor = self.live.pop(ident, None)
        if actor is None:  # already ended with its group
            return
        self.kill(actor)
        self.ahead.forget(ident)
        group = getattr(actor, "actor", None)
        if group is not None:
            for other in [k for k, a in self.live.items() if getattr(a, "actor", None) is group]:
                self.live.pop(other)
                self.ahead.forget(other)

    def _evict(self, current: set[tuple]) -> None:
        extra = len(self.live) - self.max_live_actors
        idle = sorted((i for i in self.live if i not in current), key=lambda i: self.last_used.get(i, 0))
        for ident in idle[: max(0, extra)]:
            self.kill(self.live.pop(ident))
            self.ahead.forget(ident)

    def replace(self, indices: list[int]) -> None:
        """Ends the executors a cut trial left busy with abandoned work; fresh ones are started
        when a trial next needs them."""
        if self.pool is None or not indices:
            return
        for i in indices:
            self._end(identity(self.pool.spec.executors[i]))
        self.actors_replaced += len(indices)
        self.pool, self.key = None, None

    def record_speed(self, ips: float, engine_devices: list[int] | None = None, strategy: str | None = None,
                     cpu_worked: bool | None = None) -> None:
        """The throughput of a valid trial: the fastest sets the cut and the next trials' size. An engine
        family's trial names the live topology's executors it ran on (``engine_reached``); a data-parallel
        one beside GPUs, its ``strategy`` and whether CPU groups took any of its images (``cpu_gain``)."""
        self.best_ips = ips if self.best_ips is None else max(self.best_ips, ips)
        if engine_devices and self.pool is not None:
            key = frozenset(identity(self.pool.spec.executors[i]) for i in engine_devices)
            self.engine_ips[key] = max(ips, self.engine_ips.get(key, 0.0))
        if strategy is not None and cpu_worked is not None:
            figures = self.cpu_beside.setdefault(strategy, {})
            figures[cpu_worked] = max(ips, figures.get(cpu_worked, 0.0))

    def cpu_gain(self) -> tuple[str, float] | None:
        """What CPU groups working beside the GPUs added to a data-parallel strategy: its best figure with them
        against its best over the GPUs alone, less one, for the strategy where they added most; None where no
        strategy was measured both ways."""
        gains = [(name, figures[True] / figures[False] - 1.0) for name, figures in self.cpu_beside.items()
                 if figures.get(True) and figures.get(False)]
        return max(gains, key=lambda gain: gain[1], default=None)

    def engine_reached(self, indices: list[int]) -> float | None:
        """The best an engine trial ran on the live topology's executors ``indices`` or on some of them
        (None where none did): what those devices are known to reach together."""
        assert self.pool is not None, "acquire() first"
        devices = {identity(self.pool.spec.executors[i]) for i in indices if 0 <= i < len(self.pool.spec.executors)}
        return max((ips for key, ips in self.engine_ips.items() if key <= devices), default=None)

    def best_speed(self) -> float | None:
        return self.best_ips

    def standalone(self, seconds: float, max_images: int | None, used: list[int] | None = None) -> list[float]:
        """Standalone throughputs of the live topology's executors (of ``used``, where given; 0 for the
        others): one measurement per executor class and configuration (on its first executor), cached for
        the whole tune. Only the executors measured get the trial's params first: a single's other GPU,
        compiling ahead meanwhile, is left to it (``autohet.tuning.ahead``)."""
        assert self.pool is not None, "acquire() first"
        self._step("measuring standalone figures")
        try:
            due = self.standalone_cache.due(self.pool, max_images, used)
            if due:
                self._end_failed(self.ahead.settle(self.ahead.conflicts(self.pool.spec, due, new_topology=False)))
            self.pool.configure_rest(due)
            return self.standalone_cache.measure(self.pool, seconds, max_images, used=used)
        finally:
            self._returned("standalone measurement")

    def known_standalone(self, index: int) -> float | None:
        """A cached standalone throughput of the live topology's executor ``index`` (any unit
        cap), or None: lets a trial see in advance that it cannot finish in time."""
        assert self.pool is not None, "acquire() first"
        if not 0 <= index < len(self.pool.spec.executors):
            return None  # the strategy's own check reports the bad index
        return self.standalone_cache.known(self.pool.spec.executors[index])

    def standalone_of(self, index: int, seconds: float) -> float | None:
        """The live topology's executor ``index`` alone (cached like ``standalone``): a single trial's
        executor, measured before the trial is sized."""
        assert self.pool is not None, "acquire() first"
        if not 0 <= index < len(self.pool.spec.executors):
            return None  # the strategy's own check reports the bad index
        self.pool.configure_rest([index])
        return self.standalone_cache.measure_one(self.pool, index, seconds)

    def device_figures(self, indices: list[int]) -> list[float | None]:
        """For executors of the live topology, the best standalone figure known for each one's device run as
        the engine families run it (``engine_backends``: eager PyTorch on a CPU group, a CUDA graph on a GPU),
        any precision, layout or batch. A GPU not measured so takes another whole GPU's of this host that was:
        the tune measures each GPU backend on one of them and takes it for all (``tuning/initial.py``). Where
        neither is known, the device's best at any backend (inductor's on a GPU, ONNX Runtime's or OpenVINO's on
        a CPU group: a looser bound); None where it was never measured. Inductor's figure is no engine's: on two
        H200s resnet18's 78k img/s a GPU (48k as a CUDA graph) let every engine trial run until the trial
        timeout cut it (BENCHMARKS.md 43, 44)."""
        assert self.pool is not None, "acquire() first"
        execs = self.pool.spec.executors
        known = self.standalone_cache.known_any

        def as_engine(e: ExecutorSpec) -> float | None:
            return known(e, engine_backends(e.kind))

        def like(e: ExecutorSpec) -> float | None:
            if not e.is_gpu:
                return None
            alike = [as_engine(o) for o in execs if o.is_gpu and (o.node, o.sms) == (e.node, e.sms)]
            return max((f for f in alike if f is not None), default=None)

        figures = []
        for i in indices:
            e = execs[i] if 0 <= i < len(execs) else None
            figure = None if e is None else as_engine(e) or like(e) or known(e)
            figures.append(figure)
        return figures

    def cpu_regroup(self, pool_params: dict[str, Any]) -> tuple[int, float, float] | None:
        """For a trial on a topology that would start new executors, all of them CPU groups (its GPUs' actors
        live): how many it would start; what every CPU core of that topology could run together at the best
        figure a core reached in a CPU group measured so far (``best_per_core``: an estimate, as a group smaller
        than any measured may run its cores somewhat faster); and its GPUs' figures together, each GPU at the
        best known for any whole GPU of the host (the tune measures each backend on one of them). None where the
        topology is live, a new executor is no CPU group, or no CPU group or no GPU like one of them was
        measured."""
        if self.pool is None:
            return None
        spec = regroup(self.base, pool_params)
        if tuple(identity(e) for e in spec.executors) == self.key:
            return None
        new = [e for e in spec.executors if identity(e) not in self.live]
        per_core = self.standalone_cache.best_per_core()
        if not new or not all(e.is_cpu for e in new) or per_core is None:
            return None
        known = self.standalone_cache.known_any
        gpus = [e for e in spec.executors if e.uses_gpu]  # simulated ones too (tests, planning)
        figures = [max((known(o) or 0.0 for o in gpus if (o.node, o.sms) == (e.node, e.sms)), default=0.0)
                   for e in gpus]
        if not all(figures):
            return None
        return len(new), per_core * sum(len(e.cores) for e in spec.executors if e.is_cpu), float(sum(figures))

    def partition_gain(self, pool_params: dict[str, Any]) -> float | None:
        """For a trial on a topology that would start GPU partitions (executors on a share of a GPU's SMs): the
        most a whole GPU's figure rose from doubling its batch (``StandaloneCache.batch_doubling_gain``). None
        where the topology starts no partition, or no such pair was measured."""
        if self.pool is None:
            return None
        spec = regroup(self.base, pool_params)
        if not any(e.uses_gpu and e.sms is not None and identity(e) not in self.live for e in spec.executors):
            return None
        return self.standalone_cache.batch_doubling_gain()

    def stats(self) -> dict[str, Any]:
        """What the manager did: counts and seconds, and each compile ahead a trial waited for (``ahead_jobs``)."""
        return {"ahead_jobs": list(self.ahead.ended),
                "topologies_started": self.topologies_started, "actors_adopted": self.actors_adopted,
                "actors_replaced": self.actors_replaced, "actors_released": self.actors_released,
                "standalone_measured": len(self.standalone_cache), "compiled_ahead": self.ahead.started,
                "actors_started_ahead": self.actors_ahead,
                "compiled_ahead_s": round(self.ahead.compile_s), "ahead_waited_s": round(self.ahead.waited_s)}

    def calibrate(self, seconds: float) -> float:
        """Sum of standalone throughputs of the base topology at its own params (images/s). Its GPUs' children
        for compiles aside start on standby after it (``CompileAhead.standby``): their imports overlap the
        tune's own start, not a measurement."""
        self.acquire({}, {})
        figure = float(sum(self.standalone(seconds, None)))
        try:  # only a head start: a compile aside starts its own child where there is none
            self.ahead.standby(self.pool.spec, list(self.pool.actors))
        except Exception as exc:
            _log.info("no child on standby: %s", (str(exc).strip().splitlines() or [type(exc).__name__])[-1])
        return figure

    def shutdown(self) -> None:
        self.ahead.abandon()
        self.loading.clear()
        for ident, actor in self.live.items():
            self.kill(actor)
            self.ahead.forget(ident)
        self.live.clear()
        self.pool, self.key = None, None


def remote_manager(name: str) -> Any:
    """The manager's Ray actor class as a tune starts it: named, restartable (a crashed worker is rebuilt and the
    next trial re-creates the executors), holding no CPU; ``now`` answers from a thread of its own
    (``STATUS_GROUP``), every other call goes one at a time."""
    import ray

    return ray.remote(concurrency_groups={STATUS_GROUP: 1})(PoolManager).options(
        name=name, namespace="autohet", num_cpus=0, max_restarts=3)


def ask_now(manager: Any, timeout_s: float) -> dict[str, Any] | None:
    """The manager actor's ``now``, from its own thread even while a call blocks the others (None where it did
    not answer within ``timeout_s``)."""
    import ray

    try:
        return ray.get(manager.now.options(concurrency_group=STATUS_GROUP).remote(), timeout=timeout_s)
    except Exception:  # gone, or not answering: the caller says so
        return None


def _names(idents: Iterable[Identity]) -> str:
    """Executors by name, the first few: a step of ``PoolManager.now``."""
    names = [i.name for i in idents]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _release_actors(actors: list[Any]) -> None:
    import ray

    ray.get([actor.release.remote() for actor in actors])


def _memory_available_share() -> float:
    from autohet.executors.cpu import memory_available_share

    return memory_available_share()


def _kill_actor(actor: Any) -> None:
    from autohet.pool.actors import kill_actor

    kill_actor(actor)
