"""A replica of the service: one runner (``autohet.load`` of what ``plan.replica_load`` says), loaded, checked
against the fp32 reference and warmed in its constructor (Serve routes to it only after that). Requests run
as one stream (``stream.RequestStream``: the next window staged while the devices run this one; those that
come through Serve first gathered by image count up to the runner's batch, ``@serve.batch``), or on the
batch-1 path for a latency config. Chunks from the ingresses of its node come over its own channel
(``channel``: a Unix socket, past Ray and Serve), others through Serve."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
from ray import serve

from autohet.config import RunConfig
from autohet.runtime.hosting import host_registrar
from autohet.service.channel import Answer, ChannelServer
from autohet.service.plan import ReplicaSpec, replica_load
from autohet.service.shm import ShmImages, pin_mappings
from autohet.service.stream import RequestStream

__all__ = ["Replica"]


def _images_in(parts: list[np.ndarray]) -> int:
    return sum(len(p) for p in parts)


class Replica:
    """One runner behind the ingress; ``infer(images)`` -> outputs, ``info()`` -> what it is."""

    def __init__(self, spec: ReplicaSpec, config: RunConfig, batch_wait_s: float, measure_s: float) -> None:
        import autohet
        from autohet.core.workload import workload_for

        self.spec = spec
        loaded, kwargs = replica_load(config, spec)
        self.runner = autohet.load(loaded, **kwargs)
        batch = max(1, self.runner.batch)
        checked = max(batch, 8)
        sample = np.ascontiguousarray(workload_for(config.model.name, checked, config.workload_seed).rows(0, checked))
        self.runner(sample)  # the first call, checked against the fp32 reference: paid here, not by a request
        self.speed_ips, self.speed_from = spec.speed_ips, "config"
        if spec.measure:
            self.speed_ips, self.speed_from = _speed(self.runner, sample[:batch], measure_s), "warm-up"
        self.stream = RequestStream(self.runner) if spec.batching else None
        if spec.batching:
            self._batched.set_max_batch_size(batch)
            self._batched.set_batch_wait_timeout_s(batch_wait_s)
        gpus = [config.pool.executors[i].gpu for i in spec.executors if config.pool.executors[i].gpu is not None]
        if gpus and spec.batching:  # the GPU copies bodies from where the ingresses read them
            pin_mappings(*host_registrar(gpus[0]))
        # the ingresses of this node send their chunks here, past Ray and Serve (``channel``)
        self.channel = ChannelServer(lambda images: self._answer(images, gathered=False))

    async def infer(self, images: np.ndarray | ShmImages) -> Answer:
        """A chunk through Serve (from another node's ingress, or one waiting for this replica)."""
        return await self._answer(images, gathered=self.spec.batching)

    async def _answer(self, images: np.ndarray | ShmImages, gathered: bool) -> Answer:
        """The chunk's outputs: into the stream (through ``@serve.batch`` where ``gathered``), or on the
        batch-1 path of a latency config."""
        entered = time.perf_counter()
        if isinstance(images, ShmImages):  # a body an ingress of this node holds in shared memory
            images = images.open()
        if self.stream is not None:
            outputs, taken, ready = await (self._batched(images) if gathered else self.stream(images))
        else:
            taken = time.perf_counter()
            outputs = await asyncio.to_thread(self.runner, images)
            ready = time.perf_counter()
        returned = time.perf_counter()
        return Answer(outputs, {"queue": taken - entered, "stream": ready - taken, "back": returned - ready},
                      (entered, returned))

    # batches gathered while others are in the stream: it always has a next window to stage while one runs
    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0, max_concurrent_batches=16, batch_size_fn=_images_in)
    async def _batched(self, parts: list[np.ndarray]) -> list[tuple[np.ndarray, float, float]]:
        assert self.stream is not None
        return list(await asyncio.gather(*(self.stream(p) for p in parts)))  # pixels and inputs may mix

    def info(self) -> dict[str, Any]:
        import ray

        return {"name": self.spec.name, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "batch": max(1, self.runner.batch), "classes": self.runner.classes or 0,
                "batching": self.spec.batching, "speed_ips": self.speed_ips, "channel": self.channel.address,
                "speed_from": self.speed_from, "checked": self.runner.checked, "check": self.runner.check_result,
                **{k: v for k, v in self.runner.describe().items()
                   if k in ("served", "executions", "inferences", "stream")}}

    def __del__(self) -> None:
        channel = getattr(self, "channel", None)
        if channel is not None:
            channel.close()
        stream = getattr(self, "stream", None)
        if stream is not None:
            stream.close()
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.close()


def _speed(runner: Any, sample: np.ndarray, seconds: float) -> float:
    """img/s of the runner on back-to-back calls of ``sample`` for at least ``seconds``."""
    done, start = 0, time.perf_counter()
    while True:
        runner(sample)
        done += len(sample)
        wall = time.perf_counter() - start
        if wall >= seconds:
            return done / wall
