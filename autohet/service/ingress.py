"""An ingress of the service: HTTP in, answers out (what it does: ``service.app``'s docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autohet.core.errors import last_line
from autohet.core.settings import RETRIES, RETRY_DELAY_S
from autohet.runtime.hosting import current_node_id
from autohet.runtime.images import Preprocessing
from autohet.service import requests as rq
from autohet.service.admission import NoReplica, Slot, Timing, busy, json_reply, nothing
from autohet.service.channel import Answer, ChannelClient, ChannelClosed
from autohet.service.listener import Admitted, Head, Listener, Reply, bind_shared
from autohet.service.oip_ingress import INFO_TIMEOUT_S, OipEndpoints
from autohet.service.routing import share
from autohet.service.shm import BodyPool, ShmBody, ShmImages

__all__ = ["Ingress", "IngressSettings", "ListeningIngress"]

log = logging.getLogger("autohet.service")


@dataclass(frozen=True)
class IngressSettings:
    """What an ingress process needs besides its replicas: where it listens, the model's input and
    preprocessing, its limits (``max_queue``: this process's share of the service's), the CPU cores
    the config's devices pin on its node (decoding runs on the others, ``decoders`` processes of them)."""

    host: str
    port: int
    model: str
    input_shape: tuple[int, ...]
    prep: Preprocessing
    max_queue: int
    max_body: int
    busy_cores: frozenset[int]
    decoders: int
    request_timeout_s: float
    service: str = ""  # names its shared-memory bodies, for the driver to remove them at the end
    name: str = ""  # the model's name in the Open Inference Protocol (default: the config's model)
    grpc_port: int | None = None  # the protocol's gRPC service listens here too (None: not served)
    input_datatype: str = "FP32"  # what the protocol's metadata says the input is (both are taken)


class Ingress(OipEndpoints):
    """The HTTP endpoints (``requests`` says which); ``begin_drain``, ``requests_in_flight`` and
    ``replicas`` for the driver."""

    def __init__(self, settings: IngressSettings, shm: bool = False, **replicas: Any) -> None:
        from ray.serve.metrics import Counter

        from autohet.runtime.images import Decoders

        self.settings = settings
        self.names = list(replicas)
        self.handles = [replicas[n] for n in self.names]
        self.pending = [0] * len(self.names)  # images sent to each replica and not answered
        self.speeds: list[float] = []
        self.batches: list[int] = []
        self.routed = [0] * len(self.names)
        self.down: set[int] = set()  # replicas whose last call died, until their successor answers
        self.watchers: set[asyncio.Task] = set()
        self.classes = 0
        self.node = current_node_id()
        self.local = [False] * len(self.names)  # replicas on this node (they map shared-memory bodies)
        self.channels: list[ChannelClient | None] = [None] * len(self.names)  # to those, past Ray and Serve
        self.bodies = BodyPool(settings.max_queue, settings.service) if shm else None  # at most max_queue are in flight
        self.shm_bodies = 0
        self.in_flight = 0
        self.draining = False
        self.decoders: Decoders | None = None  # started by the first image: its queues' semaphores are files
        self.learned = asyncio.Lock()
        self.images_metric = Counter("autohet_serve_images", "images answered, by the replica (deployment) that ran "
                                     "them", tag_keys=("target",))

    # --- the driver's calls ----------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """From now on new requests get 503 (Retry-After) and /healthz 503; admitted ones finish."""
        self.draining = True

    def requests_in_flight(self) -> int:
        return self.in_flight

    def release(self) -> None:
        """Its decoding processes stopped, at the service's end: a local Ray's shutdown kills this process
        with them and their resource tracker, which would leave their queues' named semaphores in
        /dev/shm (so they start with the first image, not with a service that may never decode one)."""
        if self.decoders is not None:
            self.decoders.close()
            self.decoders = None

    def _decoding(self) -> Any:
        """The decoding processes' pool, started on first use."""
        from autohet.runtime.images import Decoders

        if self.decoders is None:
            self.decoders = Decoders(self.settings.busy_cores, self.settings.decoders)
        return self.decoders.pool

    async def replicas(self) -> list[dict[str, Any]]:
        """Every replica's ``info`` (waits for replicas still starting), with the images routed to it."""
        infos = await asyncio.gather(*(h.info.remote() for h in self.handles))
        self.speeds = [float(i["speed_ips"] or 1.0) for i in infos]
        for k, info in enumerate(infos):
            self._learn(k, info)
        self.batches = [int(i["batch"]) for i in infos]
        self.classes = int(infos[0]["classes"])
        return [{**i, "images_routed": n} for i, n in zip(infos, self.routed, strict=True)]

    # --- HTTP (the listener's application) -------------------------------------------------------------

    def begin(self, head: Head) -> Reply | Admitted:
        """A request on its head: refused here (route, method, content type, declared size, query, a full
        queue) or admitted, its answer then due within ``request_timeout_s`` (408)."""
        if head.path == "/v2" or head.path.startswith("/v2/"):
            return self.begin_v2(head)
        try:
            if rq.check_route(head.method, head.path) == "healthz":
                return Admitted(lambda body: self._timed(self._health()), nothing)
            if self.draining:
                return busy("the service is shutting down; retry on its successor")
            media = rq.media_type(head.headers.get("content-type"))
            rq.check_declared_length(head.headers.get("content-length"), self.settings.max_body)
            with_logits = rq.parse_query(head.query)
        except rq.BadRequest as exc:
            return json_reply({"error": exc.reason}, exc.status, exc.headers)
        accept = head.headers.get("accept", "")
        return self.admit(lambda body, slot: self._predict(media, with_logits, accept, body, slot),
                          shared=media == rq.NPY_TYPE)

    def enter(self) -> Slot | Reply:
        """A place among the requests in flight, or 503 while draining or past ``max_queue``."""
        if self.draining:
            return busy("the service is shutting down; retry on its successor")
        if self.in_flight >= self.settings.max_queue:
            return busy(f"the queue is full ({self.settings.max_queue} requests in flight, autohet serve --max-queue)")
        self.in_flight += 1
        return Slot(self.bodies, self._leave)

    def _leave(self) -> None:
        self.in_flight -= 1

    def admit(self, answer: Callable[[memoryview, Slot], Awaitable[Reply]], shared: bool) -> Reply | Admitted:
        """An HTTP request let in (or 503): ``answer(body, slot)`` once its body is read, within
        ``request_timeout_s``, its phases in ``Server-Timing``; its body in shared memory where ``shared``."""
        slot = self.enter()
        if isinstance(slot, Reply):
            return slot

        def buffer(length: int) -> memoryview | None:
            view = slot.body(length) if shared else None
            self.shm_bodies += view is not None
            return view

        async def run(body: memoryview) -> Reply:
            reply = None
            slot.timing.lap("body")
            try:
                reply = await self._timed(answer(body, slot))
                reply.headers["Server-Timing"] = slot.timing.header()
                return reply
            finally:
                slot.release(answered=reply is not None and reply.status == 200)

        return Admitted(run, slot.release, buffer)

    def error(self, status: int, reason: str) -> Reply:
        """The listener's own refusals (a malformed request, headers too long, a stalled body)."""
        return json_reply({"error": reason}, status)

    async def _timed(self, answer: Awaitable[Reply]) -> Reply:
        limit = self.settings.request_timeout_s
        try:
            return await asyncio.wait_for(answer, limit)
        except TimeoutError:
            return json_reply({"error": f"not answered within {limit:g} s (autohet serve --request-timeout-s)"}, 408)

    async def _health(self) -> Reply:
        if self.draining:
            return busy("the service is shutting down")
        try:
            infos = await asyncio.wait_for(self.replicas(), INFO_TIMEOUT_S)
        except Exception as exc:  # a replica still starting (or restarting) does not answer in time
            return busy(f"not ready: a replica did not answer within {INFO_TIMEOUT_S:g} s ({type(exc).__name__})")
        return json_reply({"ready": True, "replicas": infos,
                           "ingress": {"pid": os.getpid(), "shm_bodies": self.shm_bodies},
                           "queue": {"in_flight": self.in_flight, "limit": self.settings.max_queue}}, 200)

    async def _predict(self, media: str, with_logits: bool, accept: str, body: memoryview, slot: Slot) -> Reply:
        try:
            if media == rq.NPY_TYPE:
                images = rq.parse_npy(body, self.settings.input_shape, self.settings.model)
            else:
                loop = asyncio.get_running_loop()
                images = await loop.run_in_executor(self._decoding(), rq.decode_image, bytes(body),  # pickled
                                                    self.settings.prep)
        except rq.BadRequest as exc:
            return json_reply({"error": exc.reason}, exc.status, exc.headers)
        timing = slot.timing
        timing.lap("parse")
        try:
            outputs = await self._run(images, slot.shared, timing)
        except NoReplica as exc:
            return busy(str(exc))
        except Exception as exc:  # the runner refused or failed: this request fails, the service stays up
            log.exception("autohet serve: a request failed")
            return json_reply({"error": f"inference failed: {last_line(exc)}"}, 500)
        if media == rq.NPY_TYPE:
            reply = Reply(200, rq.npy_bytes(outputs), rq.NPY_TYPE) if rq.NPY_TYPE in accept else \
                json_reply(rq.outputs_body(outputs), 200)
        else:
            reply = json_reply(rq.predict_body(outputs[0], with_logits), 200)
        timing.lap("encode")
        return reply

    async def learn(self) -> None:
        """The replicas' speeds, batches and classes, asked once (replicas still starting are waited for)."""
        if not self.speeds:
            async with self.learned:
                if not self.speeds:
                    await self.replicas()

    async def _run(self, images: np.ndarray, shared: ShmBody | None = None,
                   timing: Timing | None = None) -> np.ndarray:
        await self.learn()
        if len(images) == 0:
            return np.zeros((0, self.classes), np.float32)
        timed = await self._send(images, set(), 0, shared)
        if timing is not None:
            answer, called, back, replica = max(timed, key=lambda t: t[2] - t[1])  # the slowest chunk's
            timing.replica(answer, called, back, self.local[replica])
        return timed[0][0].outputs if len(timed) == 1 else np.concatenate([t[0].outputs for t in timed])

    async def _send(self, images: np.ndarray, skip: set[int], attempt: int,
                    shared: ShmBody | None = None) -> list[tuple[Answer, float, float, int]]:
        """The images' outputs, shared between the replicas (not ``skip`` nor one that is down, while
        another is left) in chunks of at most each one's batch: each chunk's answer, in order, when its
        call was made and answered, and the replica that answered it."""
        chunks = share(len(images), self.pending, self.speeds, self.batches, skip=self.down | skip)
        starts = np.cumsum([0] + [n for _, n in chunks])
        answers = await asyncio.gather(*(self._chunk(i, images[starts[k] : starts[k + 1]], attempt, shared)
                                         for k, (i, _) in enumerate(chunks)))
        return [t for timed in answers for t in timed]

    async def _chunk(self, replica: int, images: np.ndarray, attempt: int,
                     shared: ShmBody | None = None) -> list[tuple[Answer, float, float, int]]:
        """One chunk's outputs. When its replica dies under it, the chunk is shared again between the
        others (re-cut to their batches) or, with none left, sent to the replica Serve starts in its
        place (a call waits for it)."""
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

        if replica in self.down:
            await asyncio.sleep(RETRY_DELAY_S * attempt / RETRIES)
        self.pending[replica] += len(images)
        channel = self.channels[replica] if replica not in self.down else None  # down: Serve waits for its successor
        try:
            called = time.perf_counter()
            payload = self._payload(replica, images, shared)
            call = channel.call(payload) if channel is not None else self.handles[replica].infer.remote(payload)
            answer = await call
            self.routed[replica] += len(images)
            self.images_metric.inc(len(images), tags={"target": self.names[replica]})
            return [(answer, called, time.perf_counter(), replica)]
        except (RayActorError, BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError,
                ChannelClosed) as exc:
            failure = f"{self.names[replica]}: {type(exc).__name__}"
            log.warning("autohet serve: replica %s failed a chunk (%s: %s); sending it again", self.names[replica],
                        type(exc).__name__, last_line(exc))
            if isinstance(exc, ChannelClosed) and self.channels[replica] is not None:
                self.channels[replica].close()  # through Serve (it waits for a successor) until one is learned
                self.channels[replica] = None
            self._mark_down(replica)
        finally:
            self.pending[replica] -= len(images)
        if attempt + 1 >= RETRIES:
            raise NoReplica(f"no replica answered after {RETRIES} attempts (last: {failure}); retry")
        return await self._send(images, {replica}, attempt + 1, shared)

    def _learn(self, replica: int, info: dict[str, Any]) -> None:
        """Whether ``replica`` is on this node, and its channel there (kept while its address is the same)."""
        self.local[replica] = self.node is not None and info.get("node") == self.node
        address = info.get("channel") if self.local[replica] else None
        channel = self.channels[replica]
        if channel is not None and channel.address != address:
            channel.close()
            channel = None
        self.channels[replica] = channel or (ChannelClient(address) if address else None)

    def _payload(self, replica: int, images: np.ndarray, shared: ShmBody | None) -> np.ndarray | ShmImages:
        """Where the images lie in shared memory, for a replica of this node; else the images themselves."""
        if shared is not None and self.local[replica]:
            with contextlib.suppress(ValueError):  # not a view of the body (an .npy that was converted)
                return shared.locate(images)
        return images

    def _mark_down(self, replica: int) -> None:
        """No new chunks for ``replica`` (unless no other is left) until its successor answers."""
        if replica in self.down:
            return
        self.down.add(replica)

        async def back() -> None:
            with contextlib.suppress(Exception):  # died again: its next failed chunk marks it down again
                info = await self.handles[replica].info.remote()  # waits for the replica Serve starts
                self.speeds[replica] = float(info["speed_ips"] or 1.0)
                self._learn(replica, info)  # it may have moved, its channel has a new address
            self.down.discard(replica)

        self.watchers.add(task := asyncio.get_running_loop().create_task(back()))
        task.add_done_callback(self.watchers.discard)


class ListeningIngress(Ingress):
    """The deployed ingress: an ``Ingress`` that listens on the service's port from its constructor (a
    process Serve starts again after a crash listens again)."""

    def __init__(self, settings: IngressSettings, **replicas: Any) -> None:
        from autohet.platform.memory import keep_large_blocks

        keep_large_blocks(settings.max_body)  # each gRPC request arrives as a new bytes of its size
        super().__init__(settings, shm=True, **replicas)
        self.listener = Listener(self, bind_shared(settings.host, settings.port), settings.max_body,
                                 body_timeout_s=settings.request_timeout_s)
        self.grpc = None
        if settings.grpc_port is not None:  # the Open Inference Protocol's gRPC service, on the same loop
            from autohet.service.oip_grpc import serve_grpc

            self.grpc = serve_grpc(self, settings.host, settings.grpc_port, settings.max_body)

    def __del__(self) -> None:
        listener = getattr(self, "listener", None)
        if listener is not None:
            listener.stop()
        if getattr(self, "bodies", None) is not None:
            self.bodies.close()
