"""One Ray actor per executor (``autohet.pool.actors``), created once and reused by every run of the
same model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.settings import ACTOR_START_TIMEOUT_S
from autohet.core.workload import Workload
from autohet.executors import ExecutorSpec, runs_ahead
from autohet.platform.ray_cluster import get_interruptibly, wait_interruptibly
from autohet.pool.base import Pool, identity
from autohet.pool.dispatch import Dispatcher
from autohet.pool.spec import PoolSpec

if TYPE_CHECKING:
    pass

__all__ = ["ACTOR_START_TIMEOUT_S", "RayPool"]



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

        from autohet.pool.actors import check_cluster_resources, user_errors

        if self.actors and (not self.owned or self.started_for == (model, workload.images)):
            return 0.0
        check_cluster_resources(self.spec)
        self.shutdown()
        loads = self.launch(model, workload, adopt)
        refs = list(loads.values())
        with user_errors():
            pending = wait_interruptibly(refs, ACTOR_START_TIMEOUT_S)
            if pending:
                late = [self.spec.executors[i].name for i, r in loads.items() if r in pending]
                raise UserError(f"executors {', '.join(late)} did not start within {ACTOR_START_TIMEOUT_S:.0f} s: "
                                "Ray could not place them (their cores or GPU held by other actors; `ray status` "
                                "shows the pending demand); end other Ray jobs on this machine or use a smaller pool")
            described = ray.get(refs)
        self.adopted = len(self.actors) - len(loads)
        self.started_for = (model, workload.images)
        return sum(d.get("compile_s", 0.0) for d in described)

    def launch(self, model: ModelSpec, workload: Workload, adopt: dict[tuple, Any] | None = None) -> dict[int, Any]:
        """Creates the actors ``adopt`` does not hold and sends each its load, without waiting: returns
        {executor index: its load call}. ``start`` waits for them; the tune's manager starts a coming
        topology's new actors this way while a trial runs elsewhere (``autohet.tuning.manager``)."""
        import ray

        adopt = adopt or {}
        self.workload_ref = ray.put(workload)
        self.actors = [None] * len(self.spec.executors)
        fresh: list[int] = []
        for members in self.spec.partition_groups():  # partitions of one GPU: one process, adopted as a whole
            handles = [adopt.get(identity(self.spec.executors[i])) for i in members]
            if any(h is None for h in handles) or len({id(getattr(h, "actor", h)) for h in handles}) != 1:
                handles = self._new_group([self.spec.executors[i] for i in members], model)
                fresh += members
            for i, handle in zip(members, handles, strict=True):
                self.actors[i] = handle
        for i, spec in enumerate(self.spec.executors):
            if self.actors[i] is None:
                self.actors[i] = adopt.get(identity(spec))
                if self.actors[i] is None:
                    self.actors[i] = self._new_actor(spec, model, "")
                    fresh.append(i)
        return {i: self.actors[i].load.remote(self.workload_ref) for i in fresh}

    def _new_actor(self, spec: ExecutorSpec, model: ModelSpec, suffix: str) -> Any:
        """An executor actor (named ``<prefix>-<executor><suffix>`` when the pool has a prefix), not loaded."""
        import ray

        from autohet.pool.actors import ASIDE_GROUP, ExecutorActor, actor_options

        name = f"{self.name_prefix}-{spec.name}{suffix}" if self.name_prefix else None
        opts = actor_options(spec, name, self.reserve_cpus)
        remote = ray.remote(concurrency_groups={ASIDE_GROUP: 1})(ExecutorActor)  # not an ``options`` setting
        return remote.options(**opts).remote(spec, model)

    def _new_group(self, specs: list[ExecutorSpec], model: ModelSpec) -> list[Any]:
        """One actor for the partitions of one GPU; a handle per member."""
        import ray

        from autohet.pool.actors import ExecutorGroupActor, MemberHandle, group_options

        name = f"{self.name_prefix}-{specs[0].name}-group" if self.name_prefix else None
        actor = ray.remote(ExecutorGroupActor).options(**group_options(specs, name, self.reserve_cpus)).remote(
            specs, model)
        return [MemberHandle(actor, k) for k in range(len(specs))]

    def dispatcher(self) -> Dispatcher:
        from autohet.pool.ray_dispatch import RayDispatcher

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

    def _apply_config(self, indices: list[int]) -> list[dict[str, Any]]:
        from autohet.pool.actors import user_errors

        if not self.actors:
            return []
        with user_errors():
            return get_interruptibly([self.actors[i].configure.remote(self.spec.executors[i].executor_params())
                                      for i in indices])

    def replace(self, indices: list[int]) -> None:
        """Kills these executors' actors (e.g. busy with a unit nobody waits for) and starts fresh
        ones with the same spec, workload and params (a partition's whole group)."""
        from autohet.pool.actors import kill_actor

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
        from autohet.pool.actors import kill_actor

        kill_actor(self.actors[index])

    def shutdown(self) -> None:
        from autohet.pool.actors import kill_actor

        if not self.owned:
            return
        for actor in self.actors:
            kill_actor(actor)
        self.actors = []
        self.started_for = None
