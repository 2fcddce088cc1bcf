"""In-process strategies' work as jobs: an engine over the pool's devices, in this process or in
one Ray actor (the only Ray code of the in-process families).

A job is a plain picklable object with ``run(engine) -> EngineResult``. Under Ray it runs in an engine
actor that sees every GPU without claiming one (the pool's executor actors hold the devices and
sit idle meanwhile: trials never overlap); the actor and its engine are kept for later jobs over
the same devices, so compiled graphs and green contexts are made once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autohet.core.errors import RunTimeout, UserError
from autohet.engine.devices import CpuDevice, Device, GpuDevice
from autohet.engine.program import Engine
from autohet.executors.base import ExecutorSpec

__all__ = ["EngineActor", "EngineJob", "EngineResult", "build_engine", "device_for", "run_job"]


@dataclass
class EngineResult:
    """What an engine job measured, for its family's ``measurement``: the outputs in input order; a
    throughput run's ``wall_s`` or a latency run's request ``times_s``; each device's ``busy_s`` where the
    job counted it, and ``frame_ms`` where it timed each device's part of a frame; the work units'
    ``timeline`` where it kept one; each device alone (``alone_ips``, ``alone_p50_ms``); ``bound_ips``, a
    family's own measured bound (the pipeline's slowest stage); ``ran``: the plan the run took where the
    params left it open (what an exported config names: ``params`` updated with it); ``devices_used``, the
    devices that computed a part; ``batch`` and ``frames``; the run's ``temperature`` record; and
    ``report``, the family's plan, tables and baselines as they are reported (``Measurement.extra``)."""

    outputs: np.ndarray
    wall_s: float | None = None
    times_s: list[float] | None = None
    busy_s: dict[str, float] = field(default_factory=dict)
    frame_ms: dict[str, float] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    alone_ips: dict[str, float] = field(default_factory=dict)
    alone_p50_ms: dict[str, float] = field(default_factory=dict)
    bound_ips: float | None = None
    ran: dict[str, Any] = field(default_factory=dict)
    devices_used: list[str] = field(default_factory=list)
    batch: int = 1
    frames: int = 0
    temperature: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


class EngineJob(ABC):
    """The work of one in-process strategy run."""

    @abstractmethod
    def run(self, engine: Engine) -> EngineResult:
        """Runs on an engine whose devices are the job's executors (named as in the pool)."""


def _partition_streams(specs: Sequence[ExecutorSpec]) -> dict[str, Any]:
    """Executor name -> stream factory for GPU executors with ``sms`` (one disjoint split per GPU)."""
    from autohet.executors.green import sm_partitions
    from autohet.pool.spec import PoolSpec

    out = {}
    for members in PoolSpec("engine", list(specs)).partition_groups():
        group = [specs[i] for i in members]
        for member, part in zip(group, sm_partitions(group[0].gpu or 0, [m.sms for m in group]), strict=True):
            out[member.name] = (lambda p=part: p.stream)
    return out


def device_for(spec: ExecutorSpec, stream_factory: Any = None) -> Device:
    """The engine device of a pool executor: its cores or GPU (partition), precision and layout."""
    if spec.simulated:
        raise UserError(f"executor {spec.name} is {spec.kind}: in-process strategies run real devices; "
                        "use a pool of cpu and gpu executors")
    if spec.is_gpu:  # not ``uses_gpu``: a cpu entry with needs_gpu still runs on its cores
        return GpuDevice(spec.name, spec.gpu or 0, spec.precision, spec.channels_last, stream_factory, spec.sms)
    return CpuDevice(spec.name, spec.cores, spec.precision, spec.channels_last)


def build_engine(specs: Sequence[ExecutorSpec]) -> Engine:
    streams = _partition_streams(specs)
    return Engine([device_for(s, streams.get(s.name)) for s in specs])


class EngineActor:
    """Plain class (``ray.remote`` at use): keeps one engine per device set and runs jobs on it."""

    def __init__(self) -> None:
        self.engines: dict[tuple[ExecutorSpec, ...], Engine] = {}

    def run(self, job: EngineJob, specs: list[ExecutorSpec]) -> EngineResult:
        key = tuple(specs)
        if key not in self.engines:
            for engine in self.engines.values():  # one device set at a time: threads pin cores
                engine.close()
            self.engines = {key: build_engine(specs)}
        return job.run(self.engines[key])


_ACTOR: Any = None
_ACTOR_NODE: str | None = None  # the driver's node when the actor was made: a new ray.init is a new node


def _run_here(job: EngineJob, specs: Sequence[ExecutorSpec], deadline_s: float | None, what: str) -> EngineResult:
    """In this process; with a deadline, on a thread that is abandoned past it (in-process work cannot
    be cancelled: the thread finishes, then closes its engine; the command's exit does not wait)."""
    import threading

    engine = build_engine(specs)
    if deadline_s is None:
        try:
            return job.run(engine)
        finally:
            engine.close()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = job.run(engine)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc
        finally:
            engine.close()

    thread = threading.Thread(target=work, name="autohet-engine-job", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise RunTimeout(f"{what} did not finish within {deadline_s:.0f} s", [])
    if "error" in box:
        raise box["error"]
    return box["out"]


def run_job(job: EngineJob, specs: Sequence[ExecutorSpec], on_ray: bool, deadline_s: float | None = None,
            what: str = "the job") -> EngineResult:
    """Runs the job in this process, or in the engine actor when the pool is on Ray. Past
    ``deadline_s`` it raises RunTimeout; under Ray the engine actor is killed (its job cannot be
    cancelled and would hold the devices) and the next job starts a fresh one."""
    if not on_ray:
        return _run_here(job, specs, deadline_s, what)
    import ray

    global _ACTOR, _ACTOR_NODE
    node = ray.get_runtime_context().get_node_id()
    if _ACTOR is None or node != _ACTOR_NODE:  # none yet, or one of an earlier Ray instance of this process
        env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
        _ACTOR = ray.remote(EngineActor).options(num_cpus=0, num_gpus=0, runtime_env=env,
                                                 max_restarts=0).remote()
        _ACTOR_NODE = node
    try:
        return ray.get(_ACTOR.run.remote(job, list(specs)), timeout=deadline_s)
    except ray.exceptions.GetTimeoutError:
        ray.kill(_ACTOR, no_restart=True)
        _ACTOR = None
        raise RunTimeout(f"{what} did not finish within {deadline_s:.0f} s (its engine was stopped)", []) from None
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, UserError):
            raise UserError(str(exc.cause)) from None  # the one-line message, not Ray's wrapper
        raise
    except ray.exceptions.RayActorError:
        _ACTOR = None  # died (e.g. out of memory): the next job starts a fresh one
        raise
