"""An ingress's admitted requests: their places among the requests in flight (``Slot``), the shared-memory
body each may hold, where their time went (``Timing``), and the JSON answers every endpoint refuses
with. Shared by the REST endpoints (``/v1``, ``/v2``) and the gRPC service, which admit alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from autohet.service.channel import Answer
from autohet.service.http_messages import Reply
from autohet.service.shm import BodyPool, ShmBody

__all__ = ["RETRY_AFTER_S", "NoReplica", "Slot", "Timing", "busy", "json_reply", "nothing"]

RETRY_AFTER_S = 1


class NoReplica(Exception):
    """No replica answered a chunk after every retry."""


def json_reply(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(body, separators=(",", ":")).encode(), "application/json", dict(headers or {}))


def busy(reason: str) -> Reply:
    """503 with Retry-After: a full queue, a drain, no replica left."""
    return json_reply({"error": reason}, 503, {"Retry-After": str(RETRY_AFTER_S)})


def nothing() -> None:
    """An admitted request with nothing to give back when its body never comes (health, metadata)."""


class Timing:
    """Where one request's time went in the service (seconds by phase, in order), sent back as
    ``Server-Timing`` (milliseconds): ``body`` reading it after its head, ``parse`` (or decoding),
    the replica's own phases (``Answer``; of its slowest chunk), Ray and Serve between the ingress
    and that replica (``to_replica`` and ``from_replica`` for a replica of this node, else both ways
    as ``transit``), ``encode`` the answer."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the last lap, as ``phase``."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.mark
        self.mark = now

    def replica(self, answer: Answer, called: float, back: float, local: bool) -> None:
        """A replica's phases, and the rest of the ingress's call to it (``called`` to ``back``)."""
        self.phases.update(answer.phases)
        if local and answer.span is not None:  # one clock: the way there and the way back apart
            self.phases["to_replica"] = max(0.0, answer.span[0] - called)
            self.phases["from_replica"] = max(0.0, back - answer.span[1])
        else:
            self.phases["transit"] = max(0.0, back - called - sum(answer.phases.values()))
        self.mark = time.perf_counter()

    def header(self) -> str:
        return ", ".join(f"{k};dur={v * 1e3:.3f}" for k, v in self.phases.items())


class Slot:
    """One admitted request's place among the requests in flight and its shared-memory body, both given
    back once (``release``): the body kept for the next request only once answered in full (after a
    failure or a timeout a replica may still be reading it: removed)."""

    def __init__(self, bodies: BodyPool | None, leave: Callable[[], None]) -> None:
        self.bodies, self.leave = bodies, leave
        self.shared: ShmBody | None = None
        self.timing = Timing()
        self.released = False

    def body(self, length: int) -> memoryview | None:
        """``length`` bytes of shared memory for the request's body (replicas of this node map it), or
        None where there is none to have."""
        if self.bodies is None or self.shared is not None or (shared := self.bodies.take(length)) is None:
            return None
        self.shared = shared
        return shared.view

    def release(self, answered: bool = False) -> None:
        if self.released:
            return
        self.released = True
        self.leave()
        if self.shared is not None:
            if answered and self.bodies is not None:
                self.bodies.give_back(self.shared)
            else:
                self.shared.remove()
