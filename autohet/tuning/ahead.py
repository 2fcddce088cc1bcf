"""Compiling the tune's coming GPU settings ahead, on a GPU no trial is using.

On a pool of several GPUs the tune's first points run one GPU alone (``tuning/initial.py``) while the
others idle, and a setting whose backend compiles (inductor) costs 12-54 s to set up cold, 2.4-8 s from a
warm compile cache (BENCHMARKS.md 40). So the settings the first points will compile (``FirstPoints.ahead``)
are set up meanwhile on an idle GPU's own executor, its compiles on the cores no GPU feeds, into the cache
every executor shares: the trial that needs one on its own GPU finds it warm, and the idle GPU holds it
for when the GPUs run together. Each idle GPU sets up every planned setting it does not hold, a setting no
executor holds yet first (the cold compile is the long one), and never one another job is compiling (it
would compile the same program cold beside it). One process compiles one program at a time, so a second
cold setting is compiled in a child of the idle GPU's actor, beside the first (``executors/aside.py``): on
two GPUs both cold compiles run at once from when the plan is given (``PoolManager.plan_ahead``: on the
topology the calibration left live, while Ray Tune starts its trial process); on four, on two GPUs' actors.
Two at once cost about what one alone does (BENCHMARKS.md 43). The first points
put the compiled single on the GPU that compiles ahead (``tuning/initial.py``): it waits for its own
compiles and sets nothing up, while the first GPU sets up from the cache what the walk (run there next) and
the GPUs together will need.

An idle GPU with nothing left to compile cold is not left idle while another job compiles a planned setting
cold: it is given that setting to set up from the cache once that job ends (``after``), queued on its actor.
On efficientnet_b0 the first GPU sat idle for 28 s while the second's child compiled the walk's b512 cold, then
set it up from the cache only once the next trial began (BENCHMARKS.md 46). A child compiling aside is one its
actor keeps on standby from the calibration on (``executors/aside.py``), its imports made.

A trial measured meanwhile keeps its GPU and feeding core to itself. One that needs what ahead work holds
(its executor or GPU, a setting it compiles cold, the cores of a CPU group, or another topology's start) first
waits for that work to end (``conflicts``), and the wait is counted as acquiring; work still running
``AHEAD_GIVE_UP_S`` after its start is given up, its executor ended. The plan's topologies
(``pool`` entries: the CPU group the singles run on) have their new CPU executors started ahead the same way,
by the manager (``PoolManager``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from autohet.core.settings import AHEAD_GIVE_UP_S
from autohet.executors import ExecutorSpec
from autohet.executors.backends import backend
from autohet.pool import Identity, PoolSpec, identity

__all__ = ["AheadRunner", "CompileAhead", "RayAhead", "Ready", "Setting", "ahead_cores", "setting"]

_log = logging.getLogger(__name__)


class Setting(NamedTuple):
    """What a compiled program depends on: executors of one kind at one setting share it through the cache."""

    kind: str
    backend: str
    batch: int
    precision: str
    channels_last: bool
    inductor_mode: str


class Ready(NamedTuple):
    """What ahead work reports when it ends: the seconds it compiled, and when it ended (``time.time``, where
    known: how long after its start a setting was ready is the figure a trial waiting for it pays); ``held``:
    False where a set-up queued after a cold compile found that compile failed and set nothing up."""

    compile_s: float
    ended_at: float | None = None
    held: bool = True


def setting(spec: ExecutorSpec) -> Setting:
    return Setting(spec.kind, spec.backend, spec.batch, spec.precision, spec.channels_last, spec.inductor_mode)


def ahead_cores(base: PoolSpec, available: Collection[int] | None = None) -> frozenset[int]:
    """The cores ahead compiles run on: this machine's (``available``, default the process's) less every
    core the pool gives a GPU to feed it. While a GPU trial runs, the CPU groups there are idle; a trial
    that needs them waits for the ahead work first (``CompileAhead.conflicts``)."""
    if available is None:
        available = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    feeders = {c for e in base.executors if e.uses_gpu and e.node is None for c in e.cores}
    return frozenset(available) - feeders


class AheadRunner(Protocol):
    """Starts ahead work on an executor's actor and waits for it (Ray's in a tune, a fake in tests)."""

    def start(self, actor: Any, params: dict[str, Any], cores: frozenset[int], after: Any = None) -> Any:
        """Sets ``params`` up on the actor, once ``after`` (another job's handle, where given) has ended."""
        ...

    def start_aside(self, actor: Any, params: dict[str, Any], cores: frozenset[int]) -> Any:
        """Sets ``params`` up in a child of the actor's process, beside the actor's own work (it holds
        nothing after: the setting is in the compile cache)."""
        ...

    def standby(self, actor: Any, cores: frozenset[int]) -> None:
        """Has the actor keep a child on standby for its next ``start_aside``, its imports made on ``cores``."""
        ...

    def wait(self, handle: Any, timeout: float | None = None) -> Ready | None:
        """Blocks until the work ends, or ``timeout`` seconds pass; what it reports, or None where it failed or
        did not end in time (a compile's setting is then set up by the trial that needs it, which meets the
        failure, if any, as its own; an actor started ahead is ended, and the topology that needs it starts
        its own)."""
        ...


class _AsideCall(NamedTuple):
    actor: Any
    started: Any


class RayAhead:
    """Ahead work as an executor actor's ``prepare_ahead`` call, or its ``compile_aside`` child."""

    def start(self, actor: Any, params: dict[str, Any], cores: frozenset[int], after: Any = None) -> Any:
        from autohet.pool.actors import ASIDE_GROUP

        if isinstance(after, _AsideCall):  # the child's end, whatever it reports
            after = after.actor.aside_ended.options(concurrency_group=ASIDE_GROUP).remote()
        return actor.prepare_ahead.remote(params, sorted(cores), None if after is None else [after])

    def start_aside(self, actor: Any, params: dict[str, Any], cores: frozenset[int]) -> Any:
        from autohet.pool.actors import ASIDE_GROUP

        started = actor.compile_aside.options(concurrency_group=ASIDE_GROUP).remote(params, sorted(cores))
        return _AsideCall(actor, started)

    def standby(self, actor: Any, cores: frozenset[int]) -> None:
        from autohet.pool.actors import ASIDE_GROUP

        actor.standby_aside.options(concurrency_group=ASIDE_GROUP).remote(sorted(cores))

    def wait(self, handle: Any, timeout: float | None = None) -> Ready | None:
        import ray

        from autohet.pool.actors import ASIDE_GROUP

        end = None if timeout is None else time.monotonic() + timeout
        try:
            if isinstance(handle, _AsideCall):
                ray.get(handle.started, timeout=_left(end))
                report = ray.get(handle.actor.wait_aside.options(concurrency_group=ASIDE_GROUP).remote(),
                                 timeout=_left(end))
            else:
                report = ray.get(handle, timeout=_left(end))
            return Ready(float(report.get("compile_s", 0.0)), report.get("ended_at"), "skipped" not in report)
        except ray.exceptions.GetTimeoutError:
            _log.info("work ahead given up: still running after %.0f s more", timeout)
            return None
        except Exception as exc:  # its actor ended (evicted, replaced) or the setting failed
            cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()
            _log.info("work ahead failed: %s", cause[-1] if cause else type(exc).__name__)
            return None


def _left(end: float | None) -> float | None:
    return None if end is None else max(0.0, end - time.monotonic())


@dataclass(eq=False)  # a job is itself: two of one setting on one executor are two jobs
class _Job:
    executor: Identity
    gpu: tuple[str | None, int | None]
    setting: Setting
    handle: Any
    aside: bool = False  # in a child of the executor's process: the executor holds nothing after
    cold: bool = True  # no executor held it and no compile had cached it when the job started
    after: bool = False  # queued after another job's cold compile of the setting (``CompileAhead.start``)
    started_at: float = field(default_factory=time.time)

    def line(self, done: Ready | None, hung: bool = False) -> str:
        """The job in a few words: where, what, and how long after its start it was ready (a tune's summary;
        ahead work runs on this node's GPUs, on the manager's clock)."""
        where = f"{self.executor.name}{' (child)' if self.aside else ''}"
        what = f"{self.setting.backend} b{self.setting.batch} {'cold' if self.cold else 'warm'}"
        what += " after another's cold compile" if self.after else ""
        if done is None:
            return f"{where} {what}: " + (f"given up after {AHEAD_GIVE_UP_S:.0f} s" if hung else "failed")
        if not done.held:
            return f"{where} {what}: set nothing up (the compile it waited for failed)"
        ready = f"ready after {done.ended_at - self.started_at:.0f} s, " if done.ended_at is not None else ""
        return f"{where} {what}: {ready}{done.compile_s:.0f} s compiling"


class CompileAhead:
    """The manager's ahead work: the plan (``plan``: by-kind executor params, in the order the tune will
    need them), the jobs running, what each executor holds set up, and what the work cost. An executor
    never sets up ahead a setting it holds (a trial set it up, or a job did)."""

    def __init__(self, runner: AheadRunner, cores: frozenset[int]) -> None:
        self.runner = runner
        self.cores = cores
        self.plan: list[dict[str, dict[str, Any]]] = []
        self.jobs: list[_Job] = []
        self.held: dict[Identity, set[Setting]] = {}  # executor -> the settings its actor holds set up
        self.cached: set[Setting] = set()  # set up aside: in the compile cache, held by no executor
        self.started = 0
        self.compile_s = 0.0  # what the ahead work compiled
        self.waited_s = 0.0  # what trials waited for it
        self.ended: list[str] = []  # each job a trial waited for, in a few words (``_Job.line``)

    def set_plan(self, plan: list[dict[str, dict[str, Any]]]) -> None:
        """The plan's executor settings (its ``pool`` entries, topologies, are the manager's)."""
        self.plan = [dict(entry) for entry in plan if "pool" not in entry]

    def note_set_up(self, spec: PoolSpec, indices: Collection[int]) -> None:
        """The settings a trial's executors were just set up at: held, not worth setting up ahead there."""
        for i in indices:
            self.held.setdefault(identity(spec.executors[i]), set()).add(setting(spec.executors[i]))

    def known(self, ahead: Setting) -> bool:
        """Whether ``ahead`` is in the compile cache: an executor's actor holds it, or a child set it up aside."""
        return ahead in self.cached or any(ahead in held for held in self.held.values())

    def compiled_after(self, spec: PoolSpec, indices: Collection[int]) -> list[int]:
        """Those of ``indices`` (``spec`` at a trial's settings) to set up only once another GPU of their node
        has compiled their setting, from the cache: a data-parallel trial drawn at a setting no executor held
        had each GPU compile it cold at once (resnet18's two GPUs at a sampled tf32 setting: 16.4 s of
        compiling in 9.0 s of acquiring, BENCHMARKS.md 48). CPU groups compile on cores of their own and stay
        side by side."""
        first: set[tuple[str | None, Setting]] = set()
        later = []
        for i in sorted(indices):
            e = spec.executors[i]
            ahead = setting(e)
            if not e.uses_gpu or not backend(ahead.backend).compiles or self.known(ahead):
                continue
            if (e.node, ahead) in first:
                later.append(i)
            else:
                first.add((e.node, ahead))
        return later

    def forget(self, executor: Identity) -> None:
        """``executor``'s actor ended: it holds nothing, and its jobs will not end well (a fresh actor of the
        same identity must not be ended for them, nor wait on them)."""
        self.held.pop(executor, None)
        self.jobs = [job for job in self.jobs if job.executor != executor]

    def holds(self, executor: ExecutorSpec) -> bool:
        """Whether ``executor``'s actor holds its setting set up (a trial there compiles nothing)."""
        return setting(executor) in self.held.get(identity(executor), ())

    def conflicts(self, spec: PoolSpec, used: list[int] | None, new_topology: bool) -> list[_Job]:
        """The running jobs a trial on ``spec`` (its executors at the trial's settings) must wait for before
        it is set up: all of them for another topology (its new actors load on the cores), for a trial on
        every executor (``used`` None, or ``[]``: an engine family runs on the devices themselves) or on the
        jobs' cores (a CPU group's); else those on its executors or GPUs, or compiling cold a setting one of
        its executors does not hold (its own compile would run the same one cold, beside it)."""
        if not self.jobs:
            return []
        if new_topology or not used or self.on_our_cores(spec, used):
            return list(self.jobs)
        mine = [spec.executors[i] for i in used]
        names = {identity(e) for e in mine}
        gpus = {(e.node, e.gpu) for e in mine}
        needed = {setting(e) for e in mine if not self.holds(e)}
        return [j for j in self.jobs if j.executor in names or j.gpu in gpus or (j.cold and j.setting in needed)]

    def settle(self, jobs: list[_Job]) -> list[Identity]:
        """Waits for ``jobs``, each until ``AHEAD_GIVE_UP_S`` after its start; returns the executors whose job
        failed or was given up (its actor may have died, hold a setting it could not set up, or still be
        compiling: the manager ends it, a child compiling aside with it, and a fresh one starts when next
        needed)."""
        start = time.perf_counter()
        failed = []
        for job in jobs:
            if job not in self.jobs:  # forgotten meanwhile: its executor failed an earlier job and is ending
                continue
            give_up = job.started_at + AHEAD_GIVE_UP_S
            done = self.runner.wait(job.handle, max(0.0, give_up - time.time()))
            compiled = None if done is None else done.compile_s
            hung = done is None and time.time() >= give_up
            self.ended.append(job.line(done, hung))
            if job.aside and not hung:  # failed or not, its executor is as it was
                self.cached.update([job.setting] if compiled is not None else [])
            elif compiled is None:
                failed.append(job.executor)
                self.forget(job.executor)
            elif done is not None and done.held:
                self.held.setdefault(job.executor, set()).add(job.setting)
            self.compile_s += compiled or 0.0
            if job in self.jobs:
                self.jobs.remove(job)
        self.waited_s += time.perf_counter() - start
        return failed

    def start(self, spec: PoolSpec, actors: list[Any], used: list[int] | None) -> list[int]:
        """Gives each idle whole GPU of the topology (on this node, not used by the trial about to run, with no
        job yet) the planned settings whose backend compiles that it lacks (``_candidates``): the first (a cold
        one where there is one) on its actor, the next cold one in a child process beside it (one process
        compiles one program at a time), and the warm ones on its actor after the first; an idle GPU given none
        of those queues the settings another job compiles cold, each set up from the cache once that job ends
        (``_after``); none while the trial runs on the cores they would compile on. Returns the GPUs' indices."""
        idle = self._idle(spec, used)
        busy = {(spec.executors[i].node, spec.executors[i].gpu) for i in used or ()}
        chosen: dict[int, dict[str, Any]] = {}  # idle GPU -> the setting its actor sets up
        for i in idle:
            e = spec.executors[i]
            if (e.node, e.gpu) in busy:
                continue
            params = self._next(e, also={setting(spec.executors[j].with_params(p)) for j, p in chosen.items()})
            if params is not None:
                chosen[i] = params
                busy.add((e.node, e.gpu))
        coming = {setting(spec.executors[j].with_params(p)) for j, p in chosen.items()}
        for i, params in chosen.items():
            e = spec.executors[i]
            cold, warm = self._candidates(e, coming)
            # a cold setting no idle GPU's actor took: in a child beside this one, started first (the actor's own
            # compile blocks its next call); the warm ones after the first, on the actor, one after the other
            beside = None if not cold else self.runner.start_aside(actors[i], cold[0], self.cores)
            for on_actor in [params, *warm]:
                self._add(e, on_actor, self.runner.start(actors[i], on_actor, self.cores))
                coming.add(setting(e.with_params(on_actor)))
            if cold:
                self._add(e, cold[0], beside, aside=True)
        # the GPUs given nothing of their own: a GPU with a job is the next singles' (they would wait for it all)
        return sorted(set(chosen) | set(self._queue(spec, actors, [i for i in idle if i not in chosen])))

    def queue_after(self, spec: PoolSpec, actors: list[Any], used: list[int] | None) -> list[int]:
        """``start``'s second half alone, before a trial waits for the work it needs: each idle GPU sets up the
        settings already in the cache and queues those other jobs compile cold (``_queue``), so that it holds
        them when the GPUs run together, not only once the trial's wait is over (efficientnet_b0's GPUs
        together waited 4.6 s for gpu1's b512, started after the walk's 6.8 s wait: BENCHMARKS.md 47). No
        setting is compiled cold here: the trial may set that one up itself. Returns the GPUs' indices."""
        return self._queue(spec, actors, self._idle(spec, used))

    def _idle(self, spec: PoolSpec, used: list[int] | None) -> list[int]:
        """The whole GPUs of this node the trial leaves idle with no job, where ahead work may run now."""
        if not used or not self.cores or not self.plan or self.on_our_cores(spec, used):
            return []
        busy = {(spec.executors[i].node, spec.executors[i].gpu) for i in used}
        running = {j.executor for j in self.jobs}
        return [i for i, e in enumerate(spec.executors) if e.is_gpu and not e.sms and e.node is None
                and i not in used and (e.node, e.gpu) not in busy and identity(e) not in running]

    def _queue(self, spec: PoolSpec, actors: list[Any], idle: list[int]) -> list[int]:
        """On each of the ``idle`` GPUs' actors, one after the other: the planned settings it lacks that are in
        the cache, then those another job compiles cold, each once that job ends (``_after``)."""
        queued = []
        for i in idle:
            e, before = spec.executors[i], len(self.jobs)
            for params in self._candidates(e)[1]:
                self._add(e, params, self.runner.start(actors[i], params, self.cores))
            for params, job in self._after(e):
                self._add(e, params, self.runner.start(actors[i], params, self.cores, after=job.handle), after=True)
            queued += [i] if len(self.jobs) > before else []
        return queued

    def _add(self, executor: ExecutorSpec, params: dict[str, Any], handle: Any, aside: bool = False,
             after: bool = False) -> None:
        ahead = setting(executor.with_params(params))
        cold = not after and not self.known(ahead)
        self.jobs.append(_Job(identity(executor), (executor.node, executor.gpu), ahead, handle, aside, cold, after))
        self.started += 1

    def _after(self, executor: ExecutorSpec) -> list[tuple[dict[str, Any], _Job]]:
        """The plan's settings ``executor`` lacks that a job on another executor (or its child) compiles cold,
        in the plan's order, each with that job: set up from the cache once it ends, the idle GPU holds the
        setting when the GPUs run together, where it would otherwise have started on it only at the next
        trial."""
        mine = self.held.get(identity(executor), set()) | {
            job.setting for job in self.jobs if job.executor == identity(executor)}
        compiling = {job.setting: job for job in self.jobs if job.cold and job.executor != identity(executor)}
        out = []
        for entry in self.plan:
            params = entry.get(executor.kind)
            ahead = None if params is None else setting(executor.with_params(params))
            if ahead is not None and ahead in compiling and ahead not in mine:
                out.append((params, compiling[ahead]))
                mine.add(ahead)
        return out

    def standby(self, spec: PoolSpec, actors: list[Any]) -> None:
        """Has each whole GPU of this node keep a child on standby for the compiles aside to come, where there
        are two GPUs or more (one has no idle GPU to compile on) and cores to compile on."""
        gpus = [i for i, e in enumerate(spec.executors) if e.is_gpu and not e.sms and e.node is None]
        if len(gpus) >= 2 and self.cores:
            for i in gpus:
                self.runner.standby(actors[i], self.cores)

    def on_our_cores(self, spec: PoolSpec, used: list[int]) -> bool:
        """Whether the trial runs on cores ahead work may use: any executor but a GPU (a CPU group's cores,
        whatever ``cores`` holds), or a GPU fed from one of ``cores``."""
        return any(not spec.executors[i].uses_gpu or set(spec.executors[i].pinned_cores) & self.cores for i in used)

    def _next(self, executor: ExecutorSpec, also: Collection[Setting] = ()) -> dict[str, Any] | None:
        """The params of the setting ``executor`` sets up next: a cold one first (``_candidates``)."""
        cold, warm = self._candidates(executor, also)
        return (cold + warm or [None])[0]

    def _candidates(self, executor: ExecutorSpec, also: Collection[Setting] = ()
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The params of the plan's settings ``executor`` does not hold and no job compiles cold (nor ``also``
        names, about to start), whose backend compiles, in the plan's order: the cold ones (no executor holds
        it and no compile aside cached it: the long compile), and the warm ones (set up from the cache, beside
        any other executor's set-up of the same)."""
        mine = self.held.get(identity(executor), set())
        compiling = {job.setting for job in self.jobs if job.cold} | set(also)  # warm: set up side by side
        cold, warm = [], []
        for entry in self.plan:
            params = entry.get(executor.kind)
            if params is None:
                continue
            ahead = setting(executor.with_params(params))
            if not backend(ahead.backend).compiles or ahead in mine or ahead in compiling:
                continue
            (warm if self.known(ahead) else cold).append(params)
        return cold, warm

    def abandon(self) -> None:
        """Forgets the running jobs (their actors are being ended)."""
        self.jobs.clear()
