"""The Open Inference Protocol's REST endpoints on an ingress (``/v2``...), and what its gRPC service
(``oip_grpc``) asks of the ingress: the model's description, readiness, and images run like any
request (admitted against ``max_queue``, a body in shared memory for the replicas of this node, shared
between the replicas by speed). A mixin of ``ingress.Ingress``, whose admission, routing and replicas it
uses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.core.errors import last_line
from autohet.service import oip
from autohet.service.admission import NoReplica, busy, json_reply, nothing
from autohet.service.http_messages import Admitted, Head, Reply
from autohet.service.requests import BadRequest

if TYPE_CHECKING:
    from autohet.service.admission import Slot

__all__ = ["INFO_TIMEOUT_S", "OipEndpoints"]

log = logging.getLogger("autohet.service")

INFO_TIMEOUT_S = 5.0


class OipEndpoints:
    """``begin_v2(head)`` for the REST endpoints; ``model_info``, ``ready`` and ``infer`` for both."""

    # the ingress's (``ingress.Ingress``)
    settings: Any
    draining: bool
    classes: int
    batches: list[int]
    admit: Callable[[Callable[[memoryview, Slot], Awaitable[Reply]], bool], Reply | Admitted]
    learn: Callable[[], Awaitable[None]]
    replicas: Callable[[], Awaitable[list[dict[str, Any]]]]
    _run: Callable[..., Awaitable[np.ndarray]]
    _timed: Callable[[Awaitable[Reply]], Awaitable[Reply]]

    def begin_v2(self, head: Head) -> Reply | Admitted:
        """A v2 request on its head: refused (route, method, encoding, size, a full queue) or admitted."""
        try:
            where = oip.route(head.method, head.path)
            if head.headers.get("content-encoding", "identity").lower() != "identity":
                raise BadRequest(415, f"content-encoding {head.headers['content-encoding']!r} is not served; send "
                                      "the request uncompressed")
            from autohet.service.requests import check_declared_length

            check_declared_length(head.headers.get("content-length"), self.settings.max_body)
        except BadRequest as exc:
            return json_reply({"error": exc.reason}, exc.status, exc.headers)
        if where.kind == "live":
            return Reply(200, b"")
        if where.kind != "infer":
            return Admitted(lambda body: self._timed(self._describe(where)), nothing)
        header_length = head.headers.get(oip.HEADER_LENGTH)
        return self.admit(lambda body, slot: self._infer_rest(where, header_length, body, slot),
                          header_length is not None)

    async def model_info(self) -> oip.ModelInfo:
        await self.learn()
        return oip.ModelInfo(self.settings.name or self.settings.model, tuple(self.settings.input_shape),
                             int(self.classes), max(self.batches), datatype=self.settings.input_datatype)

    async def ready(self) -> str | None:
        """None once every replica answers (within ``INFO_TIMEOUT_S``), else why not."""
        if self.draining:
            return "the service is shutting down"
        try:
            await asyncio.wait_for(self.replicas(), INFO_TIMEOUT_S)
        except Exception as exc:  # a replica still starting (or restarting) does not answer in time
            return f"not ready: a replica did not answer within {INFO_TIMEOUT_S:g} s ({type(exc).__name__})"
        return None

    async def infer(self, images: np.ndarray, slot: Slot) -> np.ndarray:
        """The images' logits from the replicas (``slot``'s body: where they lie in shared memory)."""
        return await self._run(images, slot.shared, slot.timing)

    async def _describe(self, where: oip.Route) -> Reply:
        """Server metadata, readiness, a model's metadata, readiness or configuration."""
        if where.kind in ("ready", "model_ready"):
            not_ready = await self.ready()
            if not_ready is not None:
                return busy(not_ready)
        if where.kind == "server":
            from autohet import __version__

            return json_reply((await self.model_info()).server_metadata(__version__), 200)
        if where.kind == "ready":
            return Reply(200, b"")
        info = await self.model_info()
        try:
            info.check(str(where.model), where.version)
        except BadRequest as exc:
            return json_reply({"error": exc.reason}, exc.status)
        if where.kind == "model_ready":
            return Reply(200, b"")
        return json_reply(info.metadata() if where.kind == "model" else info.config(), 200)

    async def _infer_rest(self, where: oip.Route, header_length: str | None, body: memoryview, slot: Slot) -> Reply:
        timing = slot.timing
        try:
            info = await self.model_info()
            info.check(str(where.model), where.version)
            request = oip.parse_infer(body, header_length, info)
        except BadRequest as exc:
            return json_reply({"error": exc.reason}, exc.status, exc.headers)
        timing.lap("parse")
        try:
            outputs = await self.infer(request.images, slot)
        except NoReplica as exc:
            return busy(str(exc))
        except Exception as exc:  # the runner refused or failed: this request fails, the service stays up
            log.exception("autohet serve: a request failed")
            return json_reply({"error": f"inference failed: {last_line(exc)}"}, 500)
        data, content_type, headers = oip.infer_answer(request, outputs, info)
        timing.lap("encode")
        return Reply(200, data, content_type, headers)
