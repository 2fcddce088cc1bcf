"""The Ray Serve application of ``autohet serve``: ingress processes, one deployment per replica, and a
control deployment for the driver.

- ``Replica`` (``replica``): one runner (``autohet.load`` of what ``plan.replica_load`` says), loaded, checked
  against the fp32 reference and warmed in its constructor (Serve routes to it only after that);
  requests run as one stream (``stream.RequestStream``: the next window staged while the devices run
  this one; those that come through Serve first gathered by image count up to the runner's batch,
  ``@serve.batch``), or on the batch-1 path for a latency config. Chunks from the ingresses of its
  node come over its own channel (``channel``: a Unix socket, past Ray and Serve), others through
  Serve. Pinned where its executors are: their cores (``num_cpus``), GPUs (``num_gpus``, the pool
  file's GPU index used as given) and node (a label selector).
- ``Ingress`` (``ingress``): HTTP in, answers out. Each ingress process listens on the service's port itself
  (``listener``: its own HTTP server on SO_REUSEPORT, the kernel shares connections between the
  processes; bodies read straight into one array each), so that bodies are read by as many processes
  as the config leaves cores for, not through Serve's one HTTP proxy. A request is refused on its head
  (``Ingress.begin``: route, content type, declared size, past ``max_queue`` requests in flight 503
  with Retry-After) or admitted, its body then read and parsed (an ``.npy`` body into shared memory
  that the replicas of this node map: ``shm``). Decoding on the cores the config
  leaves free (``runtime.images.Decoders``), images shared between replicas by speed
  (``routing.share``), each chunk sent over the replica's channel where it is on this node, else
  through Serve. A chunk whose replica dies mid-request is sent again to another replica (or,
  through Serve, to the one Serve starts in its place): an admitted request is answered or refused,
  never lost. Each answer says where its time went (``Server-Timing``).
- ``Control``: the application's root, with no route: the driver's one handle on every ingress
  (drain, requests in flight, replicas).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve

from autohet.config import RunConfig
from autohet.runtime.hosting import ray_node_id
from autohet.service.ingress import Ingress, IngressSettings, ListeningIngress
from autohet.service.plan import ReplicaSpec
from autohet.service.replica import Replica

__all__ = ["Control", "Ingress", "IngressSettings", "Replica", "build_app"]  # the parts re-exported

NOSET_CUDA = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}  # the pool's GPU index, as tuned
# our code never blocks an event loop (runners run on threads): Serve's extra loop threads only add hops
ONE_LOOP = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


class Control:
    """The application's root (no HTTP route): the driver's one handle on every ingress process."""

    def __init__(self, *ingresses: Any) -> None:
        self.ingresses = ingresses

    async def begin_drain(self) -> None:
        await asyncio.gather(*(i.begin_drain.remote() for i in self.ingresses))

    async def requests_in_flight(self) -> int:
        return sum(await asyncio.gather(*(i.requests_in_flight.remote() for i in self.ingresses)))

    async def release(self) -> None:
        await asyncio.gather(*(i.release.remote() for i in self.ingresses))

    async def replicas(self) -> list[dict[str, Any]]:
        """Every replica's ``info``, with the images every ingress routed to it."""
        seen = await asyncio.gather(*(i.replicas.remote() for i in self.ingresses))
        return [{**infos[0], "images_routed": sum(i["images_routed"] for i in infos)}
                for infos in zip(*seen, strict=True)]


def build_app(config: RunConfig, specs: list[ReplicaSpec], settings: IngressSettings, ingresses: int,
              batch_wait_s: float, driver_node: str) -> Any:
    """The application to ``serve.run``: ``ingresses`` ingress processes on the driver's node, each bound
    to every replica, under one ``Control``."""
    replica = serve.deployment(Replica)
    bound = {}
    for spec in specs:
        options: dict[str, Any] = {"num_cpus": spec.cores, "num_gpus": spec.gpus,
                                   "runtime_env": {"env_vars": {**ONE_LOOP, **(NOSET_CUDA if spec.gpus else {})}}}
        if spec.node is not None:
            options["label_selector"] = {"ray.io/node-id": ray_node_id(spec.node)}
        bound[spec.name] = replica.options(
            name=spec.name, num_replicas=1, ray_actor_options=options,
            # admission is the ingresses': this only has to hold a batch being gathered beside one running
            max_ongoing_requests=max(64, 4 * settings.max_queue * ingresses), max_constructor_retry_count=1,
            health_check_timeout_s=30.0, graceful_shutdown_timeout_s=5.0,
        ).bind(spec, config, batch_wait_s, 1.0)
    on_driver = {"num_cpus": 0, "label_selector": {"ray.io/node-id": driver_node},
                 "runtime_env": {"env_vars": ONE_LOOP}}
    ingress = serve.deployment(ListeningIngress)
    fronts = [ingress.options(name=f"ingress-{k}", num_replicas=1, max_ongoing_requests=64,
                              ray_actor_options=on_driver, graceful_shutdown_timeout_s=5.0).bind(settings, **bound)
              for k in range(ingresses)]
    return serve.deployment(Control).options(name="control", num_replicas=1, ray_actor_options=on_driver).bind(*fronts)
