"""Starting, draining and stopping the service (the driver's side of ``autohet serve``).

``Service.start`` checks everything it can before Ray starts (the config, the port), starts or joins
Ray, starts Serve without its HTTP proxy and deploys the application: ingress processes that each
listen on ``host:port`` themselves (``listener``); it returns once every replica has loaded, been
checked and warmed. ``drain`` refuses new requests (503 with Retry-After) and waits for the admitted
ones; ``close`` stops Serve (and the Ray it started). Serve's own shutdown does not drain (it drops
requests in flight), hence ``drain``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autohet.config import RunConfig
from autohet.core.errors import UserError
from autohet.service.http_messages import bind_shared
from autohet.service.oip import DATATYPES

if TYPE_CHECKING:
    from autohet.service.plan import ReplicaSpec

__all__ = ["APP_NAME", "Service", "ServiceOptions"]

APP_NAME = "autohet"
MAX_INGRESS = 16
_QUIET = {"log_level": "WARNING", "enable_access_log": False}


@dataclass(frozen=True)
class ServiceOptions:
    """What ``autohet serve`` takes; ``check`` refuses bad values in one line each."""

    config: str
    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    batch_wait_ms: float = 2.0
    max_queue: int = 128
    max_body_mb: float = 32.0
    drain_s: float = 10.0
    request_timeout_s: float = 60.0
    metrics_port: int | None = None
    ingress_procs: int | None = None  # None: by the cores the config leaves free (``ingress_count``)
    grpc_port: int | None = None  # the Open Inference Protocol's gRPC service (None: not served)
    name: str | None = None  # the model's name in the protocol (None: the config's model)
    input_datatype: str = "FP32"  # the input's datatype in the protocol's metadata (both are taken)

    def check(self) -> None:
        ports = (("--port", self.port), ("--metrics-port", self.metrics_port), ("--grpc-port", self.grpc_port))
        for flag, port in ports:
            if port is not None and not 1 <= port <= 65535:
                raise UserError(f"{flag} must be a TCP port between 1 and 65535, got {port}")
        if self.grpc_port is not None and self.grpc_port in (self.port, self.metrics_port):
            raise UserError(f"--grpc-port {self.grpc_port} is another flag's port too; give it a port of its own")
        if self.input_datatype not in DATATYPES:
            raise UserError(f"--input-datatype {self.input_datatype!r}: give one of {', '.join(DATATYPES)}")
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name):
            raise UserError(f"--name {self.name!r}: use letters, digits, '_', '.' and '-' (it is a URL path part)")
        if self.batch_wait_ms < 0:
            raise UserError(f"--batch-wait-ms must be 0 or more milliseconds, got {self.batch_wait_ms:g}")
        if self.max_queue < 1:
            raise UserError(f"--max-queue must be at least 1 request, got {self.max_queue}")
        for flag, value in (("--max-body-mb", self.max_body_mb), ("--request-timeout-s", self.request_timeout_s)):
            if value <= 0:
                raise UserError(f"{flag} must be positive, got {value:g}")
        if self.drain_s < 0:
            raise UserError(f"--drain-s must be 0 or more seconds, got {self.drain_s:g}")
        if self.ingress_procs is not None and not 1 <= self.ingress_procs <= MAX_INGRESS:
            raise UserError(f"--ingress-procs must be between 1 and {MAX_INGRESS}, got {self.ingress_procs}")

    @property
    def max_body(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)


def ingress_count(free_cores: int, asked: int | None) -> int:
    """Ingress processes: ``asked``, or one per two cores the config's devices leave free on the driver's
    node, 1 to 8 (each reads and parses its requests' bodies; the decoders and the clients of a
    benchmark on the same machine want cores too)."""
    return asked if asked is not None else max(1, min(8, free_cores // 2))


def check_port_free(host: str, port: int, flag: str) -> None:
    """One line when ``host:port`` cannot be listened on (in use, or not an address of this machine)."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy binds it
        try:
            probe.bind(where)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"{host}:{port} is in use by another server; stop it or pass another {flag}") from None
            raise UserError(f"{host}:{port} cannot be listened on ({exc.strerror}); pass an address of this "
                            "machine (--host) and a free port") from None


class Service:
    """The config behind HTTP: ``start``, then ``drain`` and ``close`` (``close`` is always safe)."""

    def __init__(self, options: ServiceOptions) -> None:
        options.check()
        self.options = options
        self.config: RunConfig | None = None
        self.ingress: Any = None
        self.replicas: list[dict[str, Any]] = []
        self.ingresses = 0
        self.queue_share = 0
        self.metrics_url: str | None = None
        self._owns_ray = False
        self._serve_started = False
        self._reserved: list[socket.socket] = []
        # names the ingresses' shared-memory bodies (``shm``): this driver's, unlike any other's on the machine
        self.service_tag = f"s{os.getpid()}x{secrets.token_hex(4)}"

    @property
    def url(self) -> str:
        host = self.options.host if ":" not in self.options.host else f"[{self.options.host}]"
        return f"http://{host}:{self.options.port}"

    def start(self) -> None:
        from autohet.config import load_config
        from autohet.core.models import input_shape
        from autohet.runtime.images import preprocessing_for
        from autohet.service.plan import plan_replicas

        opts = self.options
        where = opts.config
        config = self.config = load_config(Path(opts.config))
        shape = tuple(input_shape(config.model.name))
        prep = preprocessing_for(shape, config.preprocess, where)
        specs = plan_replicas(config, where)
        check_port_free(opts.host, opts.port, "--port")
        if opts.grpc_port is not None:
            check_port_free(opts.host, opts.grpc_port, "--grpc-port")
        # held until close: the kernel gives no explicitly bound port to an outgoing connection, so none of
        # Ray's processes' connections can take it before the ingresses bind it, after the replicas have
        # loaded (without this a service once failed to start on EADDRINUSE: docs/why.md, service/server.py)
        self._reserved = [bind_shared(opts.host, port) for port in (opts.port, opts.grpc_port) if port is not None]
        if opts.metrics_port is not None and not opts.address:
            check_port_free("0.0.0.0", opts.metrics_port, "--metrics-port")
        import ray

        from autohet.platform.ray_cluster import init_ray

        self._owns_ray = not ray.is_initialized()
        init_ray(opts.address, metrics_port=None if opts.address else opts.metrics_port)
        from ray import serve

        # after its import, which sets it; the driver's handle only warns of slow answers while the box is busy
        logging.getLogger("ray.serve").setLevel(logging.ERROR)

        check_resources(specs, where)
        status = serve.status()
        if status.proxies or status.applications:
            raise UserError("Ray Serve already runs on this Ray cluster (its own host, port and applications); "
                            "autohet serve starts and stops its own: use a cluster without Serve, or no --address")
        self._serve_started = True
        serve.start(proxy_location="Disabled", logging_config=_QUIET)  # the ingresses listen themselves
        from autohet.service.app import IngressSettings, build_app

        driver_node = ray.get_runtime_context().get_node_id()
        busy = frozenset(c for spec in specs for i in spec.executors if config.pool.executors[i].node is None
                         for c in config.pool.executors[i].cores)
        free = len(set(range(_driver_cpus(driver_node))) - busy)
        self.ingresses = ingress_count(free, opts.ingress_procs)
        self.queue_share = max(1, opts.max_queue // self.ingresses)
        settings = IngressSettings(opts.host, opts.port, config.model.name, shape, prep, self.queue_share,
                                   opts.max_body, busy, max(1, free // self.ingresses), opts.request_timeout_s,
                                   self.service_tag, opts.name or config.model.name, opts.grpc_port,
                                   opts.input_datatype)
        app = build_app(config, specs, settings, self.ingresses, opts.batch_wait_ms / 1000.0, driver_node)
        try:
            self.ingress = serve.run(app, name=APP_NAME, route_prefix=None, logging_config=_QUIET)
        except RuntimeError as exc:
            raise UserError(f"{where} cannot be served: {_deploy_failure(exc)}") from None
        self.replicas = self.ingress.replicas.remote().result(timeout_s=120)
        self.metrics_url = _metrics_url(driver_node)

    def drain(self) -> tuple[int, int, float]:
        """New requests refused from now on; waits up to ``drain_s`` for the admitted ones. Returns
        (requests in flight at the start, still in flight at the end, seconds)."""
        start = time.perf_counter()
        if self.ingress is None:
            return 0, 0, 0.0
        self.ingress.begin_drain.remote().result(timeout_s=10)
        first = left = self.ingress.requests_in_flight.remote().result(timeout_s=10)
        while left and time.perf_counter() - start < self.options.drain_s:
            time.sleep(0.1)
            left = self.ingress.requests_in_flight.remote().result(timeout_s=10)
        return first, left, time.perf_counter() - start

    def close(self) -> None:
        """Stops Serve (its proxy, ingress and replicas) and the Ray this service started."""
        import contextlib
        import io
        import sys

        while self._reserved:
            self._reserved.pop().close()
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return
        if self.ingress is not None:  # the ingresses' decoding processes, before Ray kills the ingresses
            with contextlib.suppress(Exception):
                self.ingress.release.remote().result(timeout_s=5)
        # the driver's handles log their calls cut off by the shutdown (after it, from Ray's threads)
        logging.getLogger("ray.serve").setLevel(logging.CRITICAL)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            local = self._owns_ray and not self.options.address
            if self._serve_started and not local:  # a local Ray's shutdown ends every Serve actor with it
                from ray import serve

                serve.shutdown()
            if self._owns_ray:
                ray.shutdown()
        from autohet.service.shm import remove_service

        remove_service(self.service_tag)  # the ingresses' shared-memory bodies (the ingresses are gone)
        self.ingress = None

    def describe(self) -> list[str]:
        """The lines ``autohet serve`` prints once ready."""
        assert self.config is not None
        opts, cfg = self.options, self.config
        n, each = self.ingresses, self.queue_share
        share = "" if n == 1 else f" (each of {n} ingress processes at most {each})"
        name = opts.name or cfg.model.name
        grpc = f", gRPC at {self.options.host}:{opts.grpc_port}" if opts.grpc_port is not None else ""
        lines = [f"autohet: serving {opts.config} ({cfg.model.name}, {cfg.strategy}, {cfg.objective}) at {self.url}: "
                 f"POST /v1/predict, GET /healthz; Open Inference Protocol v2 as model {name!r} "
                 f"(POST /v2/models/{name}/infer{grpc}); at most {n * each} requests in flight"
                 f"{share} (503 past them), bodies up to {opts.max_body_mb:g} MB"]
        parts = []
        for r in self.replicas:
            served = r["served"]
            names = served.get("executors") or served.get("devices") or [served.get("device") or "its devices"]
            devices = ", ".join(map(str, names))
            speed = (f", {r['speed_ips']:.0f} img/s ({'exported' if r['speed_from'] == 'config' else 'warm-up'})"
                     if r["speed_ips"] else "")
            batching = f"batches up to {r['batch']}" if r["batching"] else "batch-1 path"
            parts.append(f"{r['name']} on {devices} ({batching}{speed})")
        lines.append(f"autohet: {len(parts)} replica{'s' if len(parts) > 1 else ''}: {'; '.join(parts)}"
                     + (f"; Prometheus metrics at {self.metrics_url}" if self.metrics_url else ""))
        return lines


def check_resources(specs: list[ReplicaSpec], where: str) -> None:
    """One line when the Ray cluster cannot hold a replica (Serve would wait for it forever)."""
    import ray

    from autohet.runtime.hosting import ray_node_id

    nodes = [n for n in ray.nodes() if n["Alive"]]
    for spec in specs:
        node = None if spec.node is None else ray_node_id(spec.node)
        fits = [n for n in nodes if node in (None, n["NodeID"]) and n["Resources"].get("CPU", 0) >= spec.cores
                and n["Resources"].get("GPU", 0) >= spec.gpus]
        if not fits:
            on = f"node {spec.node}" if spec.node is not None else "any one node"
            raise UserError(f"{where}: replica {spec.name} needs {spec.cores} CPUs and {spec.gpus} GPUs on {on}; the "
                            f"Ray cluster's nodes have {_capacities(nodes)}: serve the config where it was tuned")
    total = ray.cluster_resources()
    for kind, need in (("CPU", sum(s.cores for s in specs)), ("GPU", sum(s.gpus for s in specs))):
        if need > total.get(kind, 0):
            raise UserError(f"{where}: its replicas need {need} {kind}s together and the Ray cluster has "
                            f"{int(total.get(kind, 0))}: serve the config where it was tuned")


def _driver_cpus(node_id: str) -> int:
    """CPUs of the driver's node as Ray counts them (the ingresses and decoders run there)."""
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return int(node["Resources"].get("CPU", 0))
    return 0


def _capacities(nodes: list[dict[str, Any]]) -> str:
    return ", ".join(f"{int(n['Resources'].get('CPU', 0))} CPUs + {int(n['Resources'].get('GPU', 0))} GPUs"
                     for n in nodes)


def _metrics_url(node_id: str) -> str | None:
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id and node.get("MetricsExportPort"):
            return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    return None


def _deploy_failure(exc: BaseException) -> str:
    """The replica's own error behind a failed deployment: its UserError line where there is one."""
    from ray import serve

    texts = [str(exc)]
    try:
        app = serve.status().applications.get(APP_NAME)
        if app is not None:
            texts += [d.message for d in app.deployments.values() if d.message]
    except Exception:  # the status is a convenience here; the exception itself still says something
        pass
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "UserError:" in line:
            return line.split("UserError:", 1)[1].strip()
    errors = [line for line in lines if "Error:" in line]
    return (errors[-1] if errors else lines[0] if lines else type(exc).__name__)[:400]
