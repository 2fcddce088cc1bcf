"""``autohet serve`` under a real HTTP load over loopback, next to the same config offline (issue 28).

One run, one command:

1. offline: the config through ``autohet.load`` in this process: img/s of a stream of batches of
   its tuned size (``runner.map``; a latency config: the p50 of batch-1 calls), and the expected
   outputs of every request body the clients will send;
2. the service: ``autohet serve`` started as a subprocess (devices released by step 1 first),
   ready once it prints its replicas;
3. the load: ``--clients`` concurrent clients (threads with a keep-alive connection each, one request in flight) for
   ``--seconds``, each sending an ``--npy-batch N`` .npy of float32 inputs or, with ``--pixels``, of
   uint8 pixels (the offline stream then runs pixels too), answered as .npy with ``--accept npy`` or
   JSON; or one synthetic JPEG (``--jpeg``, answered with its logits); a 503 is retried after its
   Retry-After (at most ``--retry-cap-s``); every answer is checked against the offline outputs of
   the same body (the config precision's tolerance). A request is lost when it never gets a correct
   answer: an error status other than 503, a broken connection, a timeout or a wrong answer;
   With ``--protocol v2-http`` or ``v2-grpc`` the clients speak the Open Inference Protocol v2 with
   binary tensors (the same float32 inputs or ``--pixels``, FP32 logits back): over HTTP each request
   encoded and each answer decoded by ``tritonclient.http`` and sent on the same threads; over gRPC
   encoded and decoded by ``tritonclient.grpc`` and sent on grpcio channels, one per thread. 503 /
   UNAVAILABLE retried alike; the service is started with
   ``--grpc-port`` for gRPC. The phases below come only with ``v1`` (``Server-Timing``);
4. the fault (``--kill-replica-after S``): after S seconds one replica's process (``--kill-replica
   NAME``, default the fastest) is killed with SIGKILL, and the time until ``/healthz`` is 200 again
   is measured;
5. SIGTERM to the service: its exit code (143) and how long it took.

Prints req/s, img/s, request bodies' MB/s, p50/p90/p99 latency of the answered requests, 503s, lost
requests, the images each replica ran, served / offline img/s, and the clients' own CPU time in cores
(near ``--client-procs``: the clients bound the figures, not the service), and the processes that
used the most CPU during the load with their busiest threads (``bench._procs``: one near a whole
core is what bounds the service), and each replica's images per device call during the load (its
runner's calls from ``/healthz``: far below the tuned batch, the device runs part-empty calls).

Where a request's time went: the median and mean of each phase of the service's ``Server-Timing``
answers (the body's read, its parse, the replica's queue, stream and return, Ray and Serve between
ingress and replica, the encoding), and ``outside``: the client's round trip less those (sending
the head, writing and reading the answer, the clients' own loop). And where a streaming replica's
time went during the load (``/healthz``'s ``stream``): the fraction of the wall time its device
computed (CUDA events), its stream waited for requests, and the staging per window.

    python -m bench.serve_load --config runs/resnet18/best.yaml --clients 64 --npy-batch 32 --seconds 30
    python -m bench.serve_load --config runs/resnet18/best.yaml --clients 64 --npy-batch 64 --pixels --seconds 30
    python -m bench.serve_load --config runs/resnet18/best.yaml --clients 64 --client-procs 4 --npy-batch 64 \
        --pixels --ingress-procs 6 --seconds 30
    python -m bench.serve_load --config runs/resnet18-latency/best.yaml --clients 1 --jpeg --seconds 20
    python -m bench.serve_load --config runs/resnet18/best.yaml --clients 64 --npy-batch 32 --seconds 40 \\
        --kill-replica-after 15
    python -m bench.serve_load --config runs/resnet18/best.yaml --clients 64 --client-procs 4 --npy-batch 64 \
        --pixels --protocol v2-grpc --seconds 30      # tritonclient.grpc, binary tensors
    python -m bench.serve_load --smoke     # lenet fast_split on actors/cpu2.yaml: seconds of load, a kill
    python -m bench.serve_load --smoke --protocol v2-http
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import emit
from bench._procs import Snapshot, busiest

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Bodies:
    """The distinct request bodies the clients cycle through and each one's expected outputs."""

    kind: str  # content type
    data: list[bytes]
    expected: list[np.ndarray]
    images: int  # per request
    query: str = ""
    accept: str = "application/json"
    arrays: list[np.ndarray] = field(default_factory=list)  # the bodies' inputs (the v2 protocol's tensors)
    model: str = ""  # the served model's name (v2)


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    answered: int = 0
    rejected: int = 0  # 503 answers (each retried)
    lost: list[str] = field(default_factory=list)
    wrong: int = 0
    phases: dict[str, list[float]] = field(default_factory=dict)  # Server-Timing, ms, of answered requests

    def add(self, other: Tally) -> None:
        self.latencies += other.latencies
        self.answered += other.answered
        self.rejected += other.rejected
        self.lost += other.lost
        self.wrong += other.wrong
        for name, values in other.phases.items():
            self.phases.setdefault(name, []).extend(values)

    def timed(self, header: str | None, latency_s: float) -> None:
        """An answer's ``Server-Timing`` phases, and ``outside``: its round trip less them."""
        if not header:
            return
        inside = 0.0
        for entry in header.split(","):
            name, _, dur = entry.strip().partition(";dur=")
            self.phases.setdefault(name, []).append(float(dur))
            inside += float(dur)
        self.phases.setdefault("outside", []).append(1000 * latency_s - inside)

    def phase_summary(self) -> dict[str, dict[str, float]]:
        return {name: {"p50_ms": round(float(np.median(v)), 3), "mean_ms": round(float(np.mean(v)), 3)}
                for name, v in self.phases.items() if v}


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def jpeg(seed: int, width: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : width * 3 // 4, 0:width]
    pixels = (np.stack([x, y, x + y], axis=-1) * (255.0 / (2 * width)) + rng.integers(0, 40, 3)).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def offline(path: str, args: argparse.Namespace) -> tuple[Bodies, dict[str, Any]]:
    """The config through ``autohet.load``: the request bodies with their expected outputs, and the
    offline figure (stream img/s, or batch-1 p50 for a latency config)."""
    import autohet
    from autohet.context import TOLERANCE
    from autohet.core.objectives import RunMode
    from autohet.runtime.images import preprocessing_for
    from autohet.service.requests import decode_image
    from bench.runtime_load import stream_ips

    with autohet.load(path) as runner:
        shape, distinct = runner.input_shape, args.distinct
        if args.jpeg:
            prep = preprocessing_for(shape, runner.config.preprocess, path)
            data = [jpeg(k, args.jpeg_width) for k in range(distinct)]
            inputs = np.concatenate([decode_image(d, prep) for d in data])
            bodies = Bodies("image/jpeg", data, list(runner(inputs)[:, None]), 1, query="?logits=1")
        else:
            rng, count = np.random.default_rng(7), distinct * args.npy_batch
            inputs = rng.integers(0, 256, (count, *shape), dtype=np.uint8) if args.pixels else \
                rng.standard_normal((count, *shape), dtype=np.float32)
            out = runner(inputs)
            split = list(range(0, len(inputs), args.npy_batch))
            bodies = Bodies("application/x-npy", [npy(inputs[s : s + args.npy_batch]) for s in split],
                            [out[s : s + args.npy_batch] for s in split], args.npy_batch,
                            accept="application/x-npy" if args.accept == "npy" else "application/json",
                            arrays=[inputs[s : s + args.npy_batch] for s in split], model=runner.model.name)
        figures: dict[str, Any] = {"tolerance": TOLERANCE[runner.served.precision], "batch": runner.batch}
        if RunMode(runner.mode).per_request:
            one = np.ascontiguousarray(inputs[:1])
            times = []
            for _ in range(args.latency_calls):
                start = time.perf_counter()
                runner(one)
                times.append(time.perf_counter() - start)
            figures["offline_p50_ms"] = 1000 * float(np.percentile(times, 50))
        else:
            # the offline stream in the requests' form: float32 inputs, or uint8 pixels (JPEGs decode to pixels)
            pixels = args.pixels or args.jpeg
            figures["offline_ips"] = stream_ips(runner, args.offline_images, max(1, runner.batch), pixels=pixels)[0]
        figures["objective"], figures["strategy"], figures["model"] = runner.mode, runner.config.strategy, \
            runner.model.name
    return bodies, figures


def correct(body: bytes, accept: str, expected: np.ndarray, tolerance: float) -> bool:
    """The answer's outputs (an .npy, ``outputs`` or an image's ``logits``) against the offline ones."""
    try:
        if accept == "application/x-npy":
            got = np.load(io.BytesIO(body))
        else:
            answer = json.loads(body)
            got = np.asarray(answer["outputs"] if "outputs" in answer else [answer["logits"]], np.float32)
    except (ValueError, KeyError, OSError):
        return False
    return within(got, expected, tolerance)


def within(got: np.ndarray, expected: np.ndarray, tolerance: float) -> bool:
    return got.shape == expected.shape and \
        float(np.abs(got - expected).max()) <= tolerance * max(float(np.abs(expected).max()), 1e-6)


@dataclass
class GrpcCall:
    """What a gRPC client sends (request ``k % len(wires)``, ModelInfer's wire bytes) and how it checks an
    answer's bytes."""

    wires: list[bytes]
    correct: Callable[[bytes, int], bool]  # (answer's bytes, k): the answer holds request k's outputs


def grpc_call(bodies: Bodies, args: argparse.Namespace, tolerance: float) -> GrpcCall:
    """The v2 ModelInfer requests with binary tensors as Triton's gRPC client builds them (its own
    ``_get_inference_request``, serialised once per body, as perf_analyzer prepares its inputs once), and
    each answer decoded by it (``InferResult``); only the transport is grpcio's own (``grpc_client``)."""
    import tritonclient.grpc as tc
    from tritonclient.grpc import service_pb2

    try:
        from tritonclient.grpc._utils import _get_inference_request
    except ImportError as exc:  # a tritonclient whose private encoder moved
        raise SystemExit(f"tritonclient {getattr(tc, '__version__', '?')} has no _get_inference_request "
                         f"({exc}); install tritonclient[grpc]==2.73.0") from None
    wires = []
    for x in bodies.arrays:
        tensor = tc.InferInput("input", list(x.shape), "UINT8" if args.pixels else "FP32")
        tensor.set_data_from_numpy(x)
        request = _get_inference_request(model_name=bodies.model, inputs=[tensor], model_version="", request_id="",
                                         outputs=[tc.InferRequestedOutput("logits")], sequence_id=0,
                                         sequence_start=False, sequence_end=False, priority=0, timeout=None,
                                         parameters=None)
        wires.append(request.SerializeToString())

    def answer_ok(answer: bytes, k: int) -> bool:
        try:
            result = tc.InferResult(service_pb2.ModelInferResponse.FromString(answer))
            return within(result.as_numpy("logits"), bodies.expected[k % len(wires)], tolerance)
        except Exception:  # an answer Triton's client cannot read: wrong
            return False

    return GrpcCall(wires, answer_ok)


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
# how grpc core words an UNAVAILABLE of its own (the connection failed or broke): lost, as HTTP's OSError; the
# service's UNAVAILABLE (draining, a full queue, no replica answered) is a 503 to retry
_TRANSPORT = ("failed to connect", "socket closed", "connection reset", "connection refused", "broken pipe",
              "recvmsg", "sendmsg", "endpoint closing")


def broken_transport(details: str | None) -> bool:
    """Whether an UNAVAILABLE's details are grpc core's own for a connection that failed or broke."""
    return (details or "").strip().lower().startswith(_TRANSPORT)


def grpc_client(c: int, url: str, call: GrpcCall, args: argparse.Namespace, deadline: float, tally: Tally,
                lock: Any) -> None:
    """One closed-loop gRPC client on a thread of its own, with its own channel and connection (a local
    subchannel pool: the ingress processes' SO_REUSEPORT shares connections, not requests). Triton's
    asyncio client rebuilt and copied each 9.6 MB request: 9.4-12.2 ms of client CPU a request on the
    2-core box against 3.6-4.5 ms this way (BENCHMARKS.md 35)."""
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{args.grpc_port}", options=[
        ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
        ("grpc.use_local_subchannel_pool", 1)])
    infer = channel.unary_unary(GRPC_INFER, request_serializer=None, response_deserializer=None)
    mine, k = Tally(), c
    while time.perf_counter() < deadline:
        n = k % len(call.wires)
        while True:  # one request until it is answered (UNAVAILABLE retried) or lost
            sent = time.perf_counter()
            try:
                answer = infer(call.wires[n], timeout=args.request_timeout_s)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE and not broken_transport(exc.details()):
                    mine.rejected += 1
                    time.sleep(args.retry_cap_s)
                    continue
                mine.lost.append(f"{exc.code()}: {exc.details()}"[:200])
                break
            if not call.correct(answer, n):
                mine.wrong += 1
                mine.lost.append("a wrong answer")
            else:
                mine.answered += 1
                mine.latencies.append(time.perf_counter() - sent)
            break
        k += args.clients
    channel.close()
    with lock:
        tally.add(mine)


def get_json(url: str, timeout_s: float = 10.0) -> tuple[int, Any]:
    """A GET's status and JSON body (None where it has none)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def kill_replica(url: str, args: argparse.Namespace, start: float, fault: dict[str, Any]) -> None:
    """At ``kill_replica_after`` s: SIGKILL to a replica's process, then the seconds until ``/healthz`` is 200."""
    time.sleep(max(0.0, start + args.kill_replica_after - time.perf_counter()))
    replicas = get_json(url + "/healthz")[1]["replicas"]
    victim = next((r for r in replicas if r["name"] == args.kill_replica), None) if args.kill_replica else \
        max(replicas, key=lambda r: r["speed_ips"] or 0)
    if victim is None:  # on a thread: the load reports it once its clients are done
        fault["error"] = (f"--kill-replica {args.kill_replica}: no such replica "
                          f"({', '.join(r['name'] for r in replicas)})")
        return
    os.kill(victim["pid"], signal.SIGKILL)
    killed = time.perf_counter()
    fault.update(killed=victim["name"], killed_at_s=killed - start)
    while True:  # until every replica answers again
        time.sleep(0.5)
        try:
            if get_json(url + "/healthz")[0] == 200:
                fault["recovered_s"] = time.perf_counter() - killed
                return
        except OSError:
            continue


def healthz_replicas(url: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """``/healthz``'s replicas, none where it does not answer 200 (or at all)."""
    try:
        status, health = get_json(url + "/healthz", timeout_s)
    except (OSError, ValueError):
        return []
    return (health or {}).get("replicas", []) if status == 200 else []


def routed(url: str) -> dict[str, int]:
    """The images the ingress routed to each replica."""
    return {r["name"]: r["images_routed"] for r in healthz_replicas(url)}


def load(url: str, bodies: Bodies, args: argparse.Namespace, tolerance: float) -> tuple[Tally, float, dict]:
    """``clients`` closed-loop clients on threads for ``seconds``, and the fault at ``kill_replica_after``."""
    import threading

    tally, fault, lock = Tally(), {}, threading.Lock()
    if args.protocol == "v2-grpc":
        client, call = grpc_client, grpc_call(bodies, args, tolerance)
    else:
        client, call = http_client, http_call(bodies, args, tolerance)
    start = time.perf_counter()
    deadline = start + args.seconds
    clients = [threading.Thread(target=client, args=(c, url, call, args, deadline, tally, lock))
               for c in range(args.clients)]
    if args.kill_replica_after is not None:
        clients.append(threading.Thread(target=kill_replica, args=(url, args, start, fault)))
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    wall = time.perf_counter() - start
    if "error" in fault:
        raise SystemExit(fault["error"])
    fault["images_routed"] = routed(url)
    return tally, wall, fault


@dataclass
class HttpCall:
    """What an HTTP client sends (body ``k % len(bodies)`` to ``path``) and how it checks an answer."""

    path: str
    bodies: list[bytes]
    headers: list[dict[str, str]]
    correct: Callable[[Any, bytes, int], bool]  # (response, body, k): the answer holds body k's outputs


def http_call(bodies: Bodies, args: argparse.Namespace, tolerance: float) -> HttpCall:
    """``/v1/predict`` with the bodies as they are, or the v2 protocol's infer with binary tensors, each
    request encoded by Triton's own client (``generate_request_body``) and each answer decoded by it
    (``parse_response_body``); only the transport is ``http.client``'s (``http_client``)."""
    n = len(bodies.data)
    if args.protocol == "v1":
        headers = {"Content-Type": bodies.kind, "Accept": bodies.accept}
        return HttpCall("/v1/predict" + bodies.query, bodies.data, [headers] * n,
                        lambda response, body, k: correct(body, bodies.accept, bodies.expected[k % n], tolerance))
    import tritonclient.http as tc

    encoded, headers = [], []
    for x in bodies.arrays:
        tensor = tc.InferInput("input", list(x.shape), "UINT8" if args.pixels else "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        body, json_size = tc.InferenceServerClient.generate_request_body(
            [tensor], outputs=[tc.InferRequestedOutput("logits", binary_data=True)])
        encoded.append(body)
        headers.append({"Content-Type": "application/octet-stream",
                        **({"Inference-Header-Content-Length": str(json_size)} if json_size is not None else {})})

    def answer_ok(response: Any, body: bytes, k: int) -> bool:
        length = response.getheader("Inference-Header-Content-Length")
        try:
            result = tc.InferenceServerClient.parse_response_body(
                body, header_length=int(length) if length is not None else None)
            return within(result.as_numpy("logits"), bodies.expected[k % n], tolerance)
        except Exception:  # an answer Triton's client cannot read: wrong
            return False

    return HttpCall(f"/v2/models/{bodies.model}/infer", encoded, headers, answer_ok)


def http_client(c: int, url: str, call: HttpCall, args: argparse.Namespace, deadline: float, tally: Tally,
                lock: Any) -> None:
    """One closed-loop client on a thread of its own, with its own keep-alive connection (``http.client``:
    a body goes out in one ``sendall``). aiohttp's client (and Triton's asyncio one, built on it) joined
    each 9.6 MB body with its head and buffered what the socket did not take at once: 10 ms of CPU a
    request against 2.9 ms here on the 2-core box, and on the H200x2 box its 16 processes took 13.5 of
    the 32 cores (BENCHMARKS.md 33, 34)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=args.request_timeout_s)
    mine, k = Tally(), c
    while time.perf_counter() < deadline:
        n = k % len(call.bodies)
        while True:  # one request until it is answered (a 503 retried after its Retry-After) or lost
            sent = time.perf_counter()
            try:
                conn.request("POST", call.path, body=call.bodies[n], headers=call.headers[n])
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                mine.lost.append(f"{type(exc).__name__}: {exc}"[:200])
                conn.close()  # the next request opens a fresh connection
                break
            status, retry = response.status, response.getheader("Retry-After")
            if status == 503:
                mine.rejected += 1
                time.sleep(min(float(retry or 1), args.retry_cap_s))
                continue
            if status != 200:
                mine.lost.append(f"HTTP {status}: {body[:160]!r}")
            elif not call.correct(response, body, n):
                mine.wrong += 1
                mine.lost.append("a wrong answer")
            else:
                mine.answered += 1
                mine.latencies.append(latency := time.perf_counter() - sent)
                mine.timed(response.getheader("Server-Timing"), latency)
            break
        k += args.clients
    conn.close()
    with lock:
        tally.add(mine)


def _timed_load(url: str, bodies: Bodies, args: argparse.Namespace,
                tolerance: float) -> tuple[Tally, float, dict, float]:
    """``load`` in this process, with the CPU seconds it took (its answers' blocks kept in the heap, as
    the ingress keeps its requests')."""
    from autohet.platform.memory import keep_large_blocks

    keep_large_blocks(32 << 20)
    cpu = time.process_time()
    tally, wall, fault = load(url, bodies, args, tolerance)
    return tally, wall, fault, time.process_time() - cpu


def _load_child(conn: Any, url: str, bodies: Bodies, args: argparse.Namespace, tolerance: float) -> None:
    conn.send(_timed_load(url, bodies, args, tolerance))
    conn.close()


def load_everywhere(url: str, bodies: Bodies, args: argparse.Namespace,
                    tolerance: float) -> tuple[Tally, float, dict, float]:
    """``load`` in ``--client-procs`` processes (forked: they share the bodies), the clients shared
    between them, the fault in the first: (tally, wall seconds, fault, the clients' CPU seconds)."""
    import multiprocessing

    if args.client_procs == 1:
        return _timed_load(url, bodies, args, tolerance)
    context = multiprocessing.get_context("fork")  # the children run numpy and the clients only, no CUDA
    # The offline step's CUDA objects are collected here, where CUDA is valid, and what still lives is
    # frozen out of the children's collector: a forked child that frees a CUDA tensor aborts ("CUDA
    # error: initialization error", seen with tritonclient's clients on the H200 box).
    gc.collect()
    gc.freeze()
    children = []
    for p in range(args.client_procs):
        share = args.clients // args.client_procs + (p < args.clients % args.client_procs)
        child_args = argparse.Namespace(**{**vars(args), "clients": share,
                                           "kill_replica_after": args.kill_replica_after if p == 0 else None})
        parent, child = context.Pipe(duplex=False)
        proc = context.Process(target=_load_child, args=(child, url, bodies, child_args, tolerance), daemon=True)
        proc.start()
        children.append((proc, parent))
    gc.unfreeze()
    tally, walls, fault, cpu = Tally(), [], {}, 0.0
    for p, (proc, conn) in enumerate(children):
        try:
            part, wall, part_fault, part_cpu = conn.recv()
        except EOFError:  # it ended without its figures (its error went to stderr)
            proc.join()
            raise SystemExit(f"load process {p} ended with exit code {proc.exitcode} and no figures; "
                             "its error is above") from None
        proc.join()
        tally.add(part)
        walls.append(wall)
        cpu += part_cpu
        if p == 0:
            fault = part_fault
    return tally, max(walls), fault, cpu


def perf_analyzer_load(binary: str, model: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Triton's own load generator (C++) as the clients: ``--clients`` requests in flight of
    ``--npy-batch`` images each, over the protocol's gRPC or REST, random inputs of the datatype the
    model's metadata states (``--pixels``: the service says UINT8). Its last stable measurement window:
    img/s (perf_analyzer counts every image of a batch as an inference), req/s, latency percentiles and
    its own CPU in cores. perf_analyzer ends non-zero on any failed request, which counts as lost."""
    import resource

    grpc = args.protocol == "v2-grpc"
    table = folder / "perf_analyzer.csv"
    command = [binary, "-m", model, "-i", "grpc" if grpc else "http",
               "-u", f"127.0.0.1:{args.grpc_port if grpc else args.port}", "-b", str(args.npy_batch),
               "--concurrency-range", str(args.clients), "--measurement-interval", str(int(1000 * args.seconds)),
               "--stability-percentage", "25", "--max-trials", "6", "-f", str(table)]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=20 * args.seconds + 120)
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - start
    print(done.stdout[-3000:], file=sys.stderr)
    if done.returncode != 0 or not table.exists():
        raise SystemExit(f"perf_analyzer ended with {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    import csv

    last = list(csv.DictReader(table.read_text().splitlines()))[-1]
    ips = float(last["Inferences/Second"])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"img_s": ips, "req_s": ips / args.npy_batch, "p50_ms": float(last["p50 latency"]) / 1e3,
            "p90_ms": float(last["p90 latency"]) / 1e3, "p99_ms": float(last["p99 latency"]) / 1e3,
            "client_cores": cpu / wall, "lost": 0, "answered": None, "body_mb_s": None, "client": "perf_analyzer"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(path: str, port: int, args: argparse.Namespace, body_bytes: int) -> tuple[subprocess.Popen, list]:
    """``autohet serve`` as a subprocess of this checkout, once it has printed its replicas."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, "-m", "autohet.cli", "serve", "--config", path, "--port", str(port),
               "--max-queue", str(args.max_queue or max(16, 2 * args.clients)),
               "--max-body-mb", str(max(32.0, 2 * body_bytes / 2**20)), "--batch-wait-ms", str(args.batch_wait_ms),
               "--request-timeout-s", str(args.request_timeout_s)]
    if args.ingress_procs:
        command += ["--ingress-procs", str(args.ingress_procs)]
    if args.protocol == "v2-grpc":
        command += ["--grpc-port", str(args.grpc_port)]
    if args.perf_analyzer and args.pixels:  # its random inputs take the datatype the metadata states
        command += ["--input-datatype", "UINT8"]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines = []
    started = time.perf_counter()
    while len(lines) < 2:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"autohet serve ended with {proc.wait()} before it was ready: "
                             f"{proc.stderr.read()[-3000:]}")
        lines.append(line.rstrip())
        if time.perf_counter() - started > args.start_timeout_s:
            proc.kill()
            raise SystemExit(f"autohet serve was not ready after {args.start_timeout_s:.0f} s")
    return proc, lines


def stop_service(proc: subprocess.Popen) -> tuple[int, float, str]:
    """SIGTERM: (exit code, seconds until it exited, its last stderr line)."""
    start = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    err = [line for line in proc.stderr.read().splitlines() if line.strip()]
    return code, time.perf_counter() - start, err[-1] if err else ""


def replica_state(url: str) -> dict[str, dict[str, Any]]:
    """Each replica's counters so far (``/healthz``; {} if it is not 200): device calls, the images they
    ran, and its stream's (``StreamStats``)."""
    return {r["name"]: {"calls": int(r.get("executions", 0)), "images": int(r.get("inferences", 0)),
                        **{f"stream_{k}": v for k, v in (r.get("stream") or {}).items()}}
            for r in healthz_replicas(url, timeout_s=30.0)}


def call_fill(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Images per device call of each replica during the load (a replica restarted meanwhile: None)."""
    fills: dict[str, float | None] = {}
    for name, now in after.items():
        calls = now["calls"] - before.get(name, {}).get("calls", 0)
        images = now["images"] - before.get(name, {}).get("images", 0)
        fills[name] = round(images / calls, 1) if calls > 0 and images >= 0 else None
    return fills


def stream_use(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
               wall_s: float) -> dict[str, dict[str, float]]:
    """Where each streaming replica's time went during the load: the fractions of the wall time its
    device computed (``device_busy``) and its stream waited for requests (``waiting``), its windows'
    images and staging milliseconds (a replica without a stream, or restarted meanwhile: left out)."""
    use = {}
    for name, now in after.items():
        was = before.get(name, {})
        windows = now.get("stream_windows", 0) - was.get("stream_windows", 0)
        if windows <= 0:
            continue

        def delta(key: str, now=now, was=was) -> float:
            return float(now.get(key, 0.0)) - float(was.get(key, 0.0))

        use[name] = {"windows": windows, "images_per_window": round(delta("stream_images") / windows, 1),
                     "device_busy": round(delta("stream_device_s") / wall_s, 3),
                     "waiting": round(delta("stream_wait_s") / wall_s, 3),
                     "stage_ms_per_window": round(1000 * delta("stream_stage_s") / windows, 2)}
    return use


def smoke_config(folder: Path) -> str:
    from autohet.config import RunConfig, write_config
    from autohet.core.models import ModelSpec
    from autohet.pool import load_pool

    config = RunConfig(ModelSpec("lenet"), load_pool(str(REPO / "actors/cpu2.yaml")), "fast_split",
                       {"w_s": 2, "threshold": 2}, images=2000)
    return str(write_config(config, folder / "smoke.yaml"))


def percentile_ms(values: list[float], q: float) -> float | None:
    return 1000 * float(np.percentile(values, q)) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="an exported config (runs/<experiment>/best.yaml)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients, one request in flight each")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="processes the clients are shared between (each process's clients share its GIL)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the clients send")
    parser.add_argument("--npy-batch", type=int, default=1, help="images per .npy request (default 1)")
    parser.add_argument("--pixels", action="store_true",
                        help=".npy requests of uint8 pixels (a quarter of float32's bytes; the service scales them)")
    parser.add_argument("--jpeg", action="store_true", help="send one synthetic JPEG per request instead of .npy")
    parser.add_argument("--jpeg-width", type=int, default=500, help="JPEG width in pixels (height 3/4 of it)")
    parser.add_argument("--accept", choices=("npy", "json"), default="npy",
                        help=".npy requests: the answer as .npy (default) or JSON {outputs}")
    parser.add_argument("--distinct", type=int, default=8, help="distinct request bodies the clients cycle through")
    parser.add_argument("--kill-replica-after", type=float, help="kill one replica's process after this many seconds")
    parser.add_argument("--kill-replica", help="the replica to kill (default: the fastest)")
    parser.add_argument("--offline-images", type=int, default=20000, help="images of the offline stream")
    parser.add_argument("--latency-calls", type=int, default=200, help="batch-1 calls of the offline p50 (latency)")
    parser.add_argument("--batch-wait-ms", type=float, default=2.0, help="autohet serve --batch-wait-ms")
    parser.add_argument("--max-queue", type=int, help="autohet serve --max-queue (default: 2 x clients, >= 16)")
    parser.add_argument("--ingress-procs", type=int, help="autohet serve --ingress-procs (default: the service's)")
    parser.add_argument("--retry-cap-s", type=float, default=0.2, help="longest wait before retrying a 503")
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument("--start-timeout-s", type=float, default=900.0, help="longest wait for the service")
    parser.add_argument("--port", type=int, help="the service's port (default: a free one)")
    parser.add_argument("--protocol", choices=("v1", "v2-http", "v2-grpc"), default="v1",
                        help="the clients' protocol: POST /v1/predict, or the Open Inference Protocol v2 with binary "
                             "tensors (HTTP: encoded and decoded by tritonclient.http, sent on http.client threads; "
                             "gRPC: encoded and decoded by tritonclient.grpc, sent on grpcio channels)")
    parser.add_argument("--grpc-port", type=int, help="v2-grpc: the service's gRPC port (default: a free one)")
    parser.add_argument("--smoke", action="store_true",
                        help="lenet fast_split on actors/cpu2.yaml: 4 clients, 16-image requests, 4 s, a kill at 1 s")
    parser.add_argument("--cpu-top", type=int, default=12,
                        help="processes listed by the CPU they used during the load (busiest_processes)")
    parser.add_argument("--perf-analyzer", metavar="BINARY",
                        help="v2 protocols: Triton's perf_analyzer at this path sends the load instead of this "
                             "script's clients (random inputs, answers not checked; --clients in flight)")
    parser.add_argument("--out", help="write the row as JSON")
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.client_procs, args.seconds, args.npy_batch, args.offline_images = 4, 2, 4.0, 16, 2000
        if args.kill_replica_after is None and not args.perf_analyzer:
            args.kill_replica_after = 1.0
    for name in ("clients", "client_procs", "npy_batch", "distinct"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.client_procs > args.clients:
        parser.error(f"--client-procs {args.client_procs} is more than --clients {args.clients}")
    if args.perf_analyzer and (args.protocol == "v1" or args.kill_replica_after is not None):
        parser.error("--perf-analyzer speaks the v2 protocols (--protocol v2-http or v2-grpc), without a fault")
    if args.protocol != "v1" and args.jpeg:
        parser.error("--jpeg is /v1/predict's: the v2 protocol sends tensors (--npy-batch, --pixels)")
    with tempfile.TemporaryDirectory() as tmp:
        path = smoke_config(Path(tmp)) if args.smoke else args.config
        if not path:
            parser.error("give --config FILE or --smoke")
        path = str(Path(path).resolve())
        bodies, figures = offline(path, args)
        port = args.port = args.port or free_port()
        args.grpc_port = args.grpc_port or free_port()
        proc, ready = start_service(path, port, args, max(len(d) for d in bodies.data))
        try:
            # cpu near 1 core a client process: the clients bound the figures, not the service
            url = f"http://127.0.0.1:{port}"
            counts = replica_state(url)
            before, started = Snapshot.take(), time.perf_counter()
            if args.perf_analyzer:
                measured = perf_analyzer_load(args.perf_analyzer, figures["model"], args, Path(tmp))
                tally, wall, fault, cpu = Tally(), time.perf_counter() - started, {}, 0.0
            else:
                measured = {}
                tally, wall, fault, cpu = load_everywhere(url, bodies, args, figures["tolerance"])
            processes = busiest(before, Snapshot.take(), time.perf_counter() - started, top=args.cpu_top)
            after = replica_state(url)
            fills, streams = call_fill(counts, after), stream_use(counts, after, time.perf_counter() - started)
        finally:
            code, stop_s, last = stop_service(proc) if proc.poll() is None else (proc.returncode, 0.0, "")
    images = tally.answered * bodies.images
    row: dict[str, Any] = {
        "model": figures["model"], "strategy": figures["strategy"], "objective": figures["objective"],
        "request": "jpeg" if args.jpeg else f"npy{args.npy_batch}{'-uint8' if args.pixels else ''}",
        "protocol": args.protocol,
        "clients": args.clients,
        "seconds": round(wall, 2), "answered": tally.answered, "req_s": tally.answered / wall, "img_s": images / wall,
        "body_mb_s": tally.answered * float(np.mean([len(d) for d in bodies.data])) / wall / 1e6,
        "client_cores": cpu / wall, "client_procs": args.client_procs,
        "p50_ms": percentile_ms(tally.latencies, 50), "p90_ms": percentile_ms(tally.latencies, 90),
        "p99_ms": percentile_ms(tally.latencies, 99), "rejected_503": tally.rejected, "lost": len(tally.lost),
        "wrong": tally.wrong, "lost_examples": tally.lost[:5], **fault, "exit_code": code, "exit_s": round(stop_s, 2),
        "exit_line": last, "service": ready, "tuned_batch": figures["batch"], "busiest_processes": processes,
        "images_per_call": fills, "stream_during_load": streams, "phases": tally.phase_summary(),
    }
    row.update(measured)  # perf_analyzer's own figures in place of the tally's
    if "offline_ips" in figures:
        row.update(offline_ips=figures["offline_ips"], served_over_offline=row["img_s"] / figures["offline_ips"])
    else:
        row.update(offline_p50_ms=figures["offline_p50_ms"])
    columns = ["model", "strategy", "protocol", "request", "clients", "req_s", "img_s", "body_mb_s", "client_cores",
               "offline_ips", "served_over_offline",
               "offline_p50_ms", "p50_ms", "p90_ms", "p99_ms", "rejected_503", "lost", "killed", "recovered_s",
               "exit_code"]
    emit("serve_load", [row], [c for c in columns if c in row], args.out)
    print(f"images per device call during the load, by replica: {fills} (tuned batch {figures['batch']})",
          file=sys.stderr)
    for name, use in streams.items():
        print(f"stream of {name} during the load: {use}", file=sys.stderr)
    if row["phases"]:
        print("where a request's time went (ms, p50 / mean): " + ", ".join(
            f"{k} {v['p50_ms']:.1f} / {v['mean_ms']:.1f}" for k, v in row["phases"].items()), file=sys.stderr)
    for p in processes[:6]:
        threads = ", ".join(f"{c} {u:.2f}" for c, _, u in p.get("threads", [])[:3])
        print(f"cpu: {p['cores']:.2f} cores  {p['title'][:60]}" + (f"  (threads: {threads})" if threads else ""),
              file=sys.stderr)
    if tally.lost:
        print(f"lost {len(tally.lost)} requests, e.g. {tally.lost[0]}", file=sys.stderr)


if __name__ == "__main__":
    main()
