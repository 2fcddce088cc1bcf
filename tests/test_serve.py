"""``autohet serve``: request parsing, routing and the replica plan without Ray; then the command
started as a real process on a lenet config of actors/cpu2.yaml, answering real HTTP requests (good
images, an .npy batch, every kind of bad request), refusing past a queue of 1 with 503 and
Retry-After, and ending on SIGTERM with exit 143."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest

from autohet.config import RunConfig, write_config
from autohet.context import TOLERANCE
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, build_model
from autohet.executors import ExecutorSpec
from autohet.pool import PoolSpec, load_pool
from autohet.runtime.images import decode, preprocessing_for
from autohet.service.plan import PARTITIONS, plan_replicas, replica_load
from autohet.service.requests import (
    BadRequest,
    check_declared_length,
    check_route,
    decode_image,
    media_type,
    parse_npy,
    parse_query,
    predict_body,
)
from autohet.service.routing import share
from autohet.service.server import ServiceOptions, check_port_free, ingress_count

REPO = Path(__file__).resolve().parents[1]
LENET = (1, 28, 28)


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def image_bytes(fmt: str, seed: int = 0, size: tuple[int, int] = (80, 60)) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def refused(status: int, fn, *args) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        fn(*args)
    assert info.value.status == status and len(str(info.value).splitlines()) == 1
    return info.value


# --- requests, without Ray ----------------------------------------------------------------------------


def test_routes_content_types_lengths_and_query():
    assert check_route("POST", "/v1/predict") == "predict" and check_route("GET", "/healthz/") == "healthz"
    assert "use POST /v1/predict" in refused(404, check_route, "GET", "/v2/predict").reason
    assert refused(405, check_route, "GET", "/v1/predict").headers == {"Allow": "POST"}
    refused(405, check_route, "POST", "/healthz")
    assert media_type("Image/JPEG; q=1") == "image/jpeg" and media_type("application/x-npy") == "application/x-npy"
    for bad in ("text/plain", None, "image/gif"):
        assert "image/jpeg or image/png" in refused(415, media_type, bad).reason
    check_declared_length("100", 100)
    check_declared_length(None, 100)
    assert "--max-body-mb" in refused(413, check_declared_length, "101", 100).reason
    refused(400, check_declared_length, "lots", 100)
    assert parse_query({}) is False and parse_query({"logits": "1"}) is True
    refused(400, parse_query, {"logits": "maybe"})
    assert "'top'" in refused(400, parse_query, {"top": "3"}).reason


def test_npy_bodies_become_the_batch_or_a_400_naming_the_fix():
    x = np.random.default_rng(0).standard_normal((3, *LENET), dtype=np.float32)
    got = parse_npy(npy(x), LENET, "lenet")
    # exact: bytes moved, no arithmetic
    assert got.dtype == np.float32 and np.array_equal(got, x) and not got.flags.owndata  # a view of the body
    # exact: a byte swap
    assert np.array_equal(parse_npy(npy(x.astype(">f4")), LENET, "lenet"), x)  # big-endian converted
    assert np.array_equal(parse_npy(npy(np.asfortranarray(x)), LENET, "lenet"), x)  # exact: bytes moved, no arithmetic
    assert parse_npy(npy(x[:0]), LENET, "lenet").shape == (0, *LENET)
    pixels = np.random.default_rng(1).integers(0, 256, (2, *LENET), dtype=np.uint8)
    got = parse_npy(npy(pixels), LENET, "lenet")  # pixels: the replica's runner scales them
    # exact: bytes moved, no arithmetic
    assert got.dtype == np.uint8 and np.array_equal(got, pixels) and not got.flags.owndata
    cases = [(b"", "empty"), (b"not an npy at all", "not an .npy file"),
             (npy(x.astype(np.float64)), "astype(numpy.float32)"), (npy(x.astype(np.int32)), "astype(numpy.float32)"),
             (npy(x[0]), "resize and crop"), (npy(np.zeros((2, 3, 28, 28), np.float32)), "(N, 1, 28, 28) float32"),
             (npy(x)[:-7], "truncated"), (npy(x) + b"\0", "extra bytes")]
    for body, fix in cases:
        assert fix in refused(400, parse_npy, body, LENET, "lenet").reason


def test_image_bodies_are_preprocessed_as_run_input_does(tmp_path):
    prep = preprocessing_for((3, 224, 224), None, "test")
    jpeg = image_bytes("JPEG")
    (tmp_path / "a.jpg").write_bytes(jpeg)
    got = decode_image(jpeg, prep)  # uint8 pixels, scaled where the replica runs them
    assert got.shape == (1, 3, 224, 224) and got.dtype == np.uint8
    # exact: the same scale.apply on the same pixels
    assert np.array_equal(prep.scale.apply(got)[0], decode(tmp_path / "a.jpg", prep))
    assert decode_image(image_bytes("PNG"), preprocessing_for(LENET, None, "test")).shape == (1, *LENET)
    for body, fix in [(b"", "empty"), (b"GIF89a? no", "not a readable image"), (jpeg[: len(jpeg) // 2], "truncated")]:
        reason = refused(400, decode_image, body, prep).reason
        assert fix in reason and "BytesIO" not in reason


def test_an_answer_is_the_top_five_with_softmax_scores():
    logits = np.array([0.0, 3.0, 1.0, 3.0, -1.0, 2.0, 0.5], np.float32)
    body = predict_body(logits, with_logits=False)
    assert [t["index"] for t in body["top"]] == [1, 3, 5, 2, 6] and "logits" not in body
    softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert [t["score"] for t in body["top"]] == pytest.approx(softmax[[1, 3, 5, 2, 6]], abs=1e-6)
    assert predict_body(logits, with_logits=True)["logits"] == pytest.approx(logits.tolist())


# --- routing and the replica plan, without Ray ---------------------------------------------------------


def test_requests_are_shared_by_speed_in_chunks_of_each_replica_batch():
    assert share(10, [0, 0], [100.0, 100.0], [64, 64]) == [(0, 10)]  # alone: the first that answers soonest
    assert share(10, [10, 0], [100.0, 100.0], [64, 64]) == [(1, 10)]
    assert share(150, [0, 0], [100.0, 100.0], [64, 64]) == [(0, 64), (1, 64), (0, 22)]
    # a GPU at 30x a CPU group: one request of 1 image at a time goes to the GPU until its queue is 30x longer
    pending, counts = [0.0, 0.0], [0, 0]
    for _ in range(3100):
        (replica, n), = share(1, pending, [3000.0, 100.0], [256, 16])
        pending[replica] += n
        counts[replica] += n
    assert counts[1] / counts[0] == pytest.approx(100 / 3000, rel=0.05)
    assert share(5, [0, 0], [100.0, 1.0], [8, 8], skip={0}) == [(1, 5)]
    assert share(5, [0], [100.0], [8], skip={0}) == [(0, 5)]  # the only one left, even when it failed
    with pytest.raises(ValueError):
        share(1, [0], [1.0, 1.0], [1, 1])


def config_of(tmp_path: Path, pool: PoolSpec, strategy: str, params: dict, objective: str = "throughput",
              name: str = "c.yaml", measured: dict | None = None) -> Path:
    return write_config(RunConfig(ModelSpec("lenet"), pool, strategy, params, images=64, objective=objective,
                                  measured=measured or {}), tmp_path / name)


def test_the_plan_puts_each_executor_of_a_throughput_config_in_its_replica(tmp_path):
    from autohet.config import load_config

    cpu2 = load_pool("actors/cpu2.yaml")
    specs = plan_replicas(load_config(config_of(tmp_path, cpu2, "fast_split", {})), "c")
    assert [(s.name, s.executors, s.cores, s.gpus, s.batching, s.measure) for s in specs] == [
        ("exec-cpu0", (0,), 1, 0, True, True), ("exec-cpu1", (1,), 1, 0, True, True)]
    exported = load_config(config_of(tmp_path, cpu2, "fifo", {}, measured={"executor_ips": {"cpu0": 30.0,
                                                                                          "cpu1": 10.0}}))
    # exact: Python float arithmetic on the test's own figures
    assert [(s.speed_ips, s.measure) for s in plan_replicas(exported, "c")] == [(30.0, False), (10.0, False)]
    assert replica_load(exported, plan_replicas(exported, "c")[1]) == (exported, {"executor": 1})
    single = plan_replicas(load_config(config_of(tmp_path, cpu2, "single", {"executor": 1})), "c")
    assert [(s.name, s.executors, s.measure) for s in single] == [("exec-cpu1", (1,), False)]
    latency = load_config(config_of(tmp_path, cpu2, "single", {"executor": 1}, "latency"))
    (whole,) = plan_replicas(latency, "c")
    assert (whole.executors, whole.batching, whole.cores) == ((0, 1), False, 2)
    assert replica_load(latency, whole) == (latency, {})
    (split,) = plan_replicas(load_config(config_of(tmp_path, cpu2, "split", {"batch": 2})), "c")
    assert split.batching and split.executors == (0, 1)


def test_the_plan_keeps_gpu_partitions_together_and_refuses_what_it_cannot_place(tmp_path):
    from autohet.config import load_config

    parts = PoolSpec("parts", [ExecutorSpec("g0", "gpu", (0,), 0, batch=32, sms=16),
                               ExecutorSpec("g1", "gpu", (1,), 0, batch=32, sms=16),
                               ExecutorSpec("c", "cpu", (2, 3), batch=8, node="1")])
    config = load_config(config_of(tmp_path, parts, "fifo", {}))
    gpu, cpu = plan_replicas(config, "c")
    assert (gpu.name, gpu.how, gpu.executors, gpu.gpus, gpu.cores) == ("exec-g0+g1", PARTITIONS, (0, 1), 1, 2)
    assert (cpu.executors, cpu.node, cpu.gpus) == ((2,), "1", 0)
    loaded, kwargs = replica_load(config, gpu)
    assert kwargs == {} and loaded.strategy == "fifo" and [e.name for e in loaded.pool.executors] == ["g0", "g1"]
    two_nodes = PoolSpec("two", [ExecutorSpec("a", "cpu", (0,), node="0"), ExecutorSpec("b", "cpu", (1,), node="1")])
    with pytest.raises(UserError, match="several Ray nodes"):
        plan_replicas(load_config(config_of(tmp_path, two_nodes, "split", {"batch": 2}, name="s.yaml")), "s")
    with pytest.raises(UserError, match="does not serve latency configs"):
        plan_replicas(load_config(config_of(tmp_path, load_pool("actors/cpu2.yaml"), "fifo", {}, "latency",
                                            name="l.yaml")), "l")


def test_bad_options_and_a_port_in_use_are_one_line():
    for kwargs, flag in [({"port": 0}, "--port"), ({"max_queue": 0}, "--max-queue"), ({"batch_wait_ms": -1},
                         "--batch-wait-ms"), ({"max_body_mb": 0}, "--max-body-mb"), ({"drain_s": -2}, "--drain-s"),
                         ({"metrics_port": 70000}, "--metrics-port"), ({"ingress_procs": 0}, "--ingress-procs"),
                         ({"ingress_procs": 17}, "--ingress-procs"), ({"input_datatype": "INT8"}, "--input-datatype")]:
        with pytest.raises(UserError, match=re.escape(flag)):
            ServiceOptions("c.yaml", **kwargs).check()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"127.0.0.1:{port} is in use by another server"):
            check_port_free("127.0.0.1", port, "--port")
    with pytest.raises(UserError, match="an address of this machine"):
        check_port_free("203.0.113.7", 8000, "--port")  # TEST-NET-3: no machine's own address
    # ingress processes: one per two free cores, 1 to 8, unless asked
    assert [ingress_count(free, None) for free in (0, 1, 3, 15, 40)] == [1, 1, 1, 7, 8]
    assert ingress_count(15, 2) == 2


# --- the command, over real HTTP ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: bytes | None = None, content_type: str | None = None, method: str | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers by lower-case name, body)."""
    request = urllib.request.Request(url, data=body, method=method, headers={
        **({"Content-Type": content_type} if content_type else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def oversized_body_is_read_before_its_413(port: int) -> bool:
    """A body declared over the limit (1.5 MB against 1 MB) is read before the 413, so a client still
    sending gets the answer, not a broken pipe: no answer while half the body is unsent, the 413 once
    it is all sent."""
    body = b"\0" * (3 << 19)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[: len(body) // 2])
        conn.settimeout(2.0)
        try:
            early = conn.recv(1)
        except TimeoutError:
            early = b""
        assert early == b"", "answered before the body was read: a client still sending gets a broken pipe"
        conn.settimeout(60)
        conn.sendall(body[len(body) // 2:])
        answer = b""
        while b"\r\n" not in answer:
            answer += conn.recv(4096)
    return answer.startswith(b"HTTP/1.1 413")


def reference(x: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return build_model(ModelSpec("lenet"))(torch.from_numpy(x)).numpy()


def close_to(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.shape == ref.shape
    assert float(np.abs(out - ref).max()) <= TOLERANCE["fp32"] * float(np.abs(ref).max())


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), RAY_TMPDIR="/tmp")


def serve_command(config: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autohet.cli", "serve", "--config", str(config), "--port", str(port), *extra]


@pytest.mark.ray
@pytest.mark.slow
def test_serve_answers_http_refuses_bad_requests_and_overload_and_drains_on_sigterm(tmp_path):
    import autohet

    config = config_of(tmp_path, load_pool("actors/cpu2.yaml"), "fast_split", {"w_s": 2, "threshold": 2})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = serve_command(config, port, "--max-queue", "1", "--max-body-mb", "1", "--ingress-procs", "2")
    proc = subprocess.Popen(command, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        # bounded: a service that never says it is ready is killed, its pipe closes and the assertion says so
        watchdog = threading.Timer(300, os.killpg, (proc.pid, signal.SIGKILL))
        watchdog.start()
        try:
            ready = [proc.stdout.readline() for _ in range(2)]
        finally:
            watchdog.cancel()
        assert "2 replicas: exec-cpu0 on cpu[0]" in ready[1], \
            ["not ready within 300 s (killed)" if proc.poll() is not None else "", *ready, proc.stderr.read()[-3000:]]
        assert f"at http://127.0.0.1:{port}: POST /v1/predict" in ready[0]
        assert "at most 2 requests in flight (each of 2 ingress processes at most 1)" in ready[0]
        status, _, body = http(url + "/healthz")
        health = json.loads(body)
        assert status == 200 and health["ready"] and all(r["checked"] for r in health["replicas"])
        # both ingress processes listen on the port themselves (no proxy in front); the kernel shares the
        # connections (each urllib call is a new one): 24 all on one of two processes is a 2**-23 chance
        pids = {json.loads(http(url + "/healthz")[2])["ingress"]["pid"] for _ in range(24)}
        assert len(pids) == 2, pids
        for pid in pids:
            listening = [c for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
            assert port in [c.laddr.port for c in listening], listening

        # good requests: an image's top 5 as the reference model's, an .npy batch as autohet.load's
        prep = preprocessing_for(LENET, None, "test")
        jpeg, png = image_bytes("JPEG", 1), image_bytes("PNG", 2)
        for data, kind in ((jpeg, "image/jpeg"), (png, "image/png")):
            status, _, body = http(url + "/v1/predict?logits=1", data, kind)
            answer = json.loads(body)
            expected = reference(prep.scale.apply(decode_image(data, prep)))[0]
            assert status == 200 and len(answer["top"]) == 5, answer
            assert [t["index"] for t in answer["top"]] == [t["index"] for t in predict_body(expected, False)["top"]]
            close_to(np.array(answer["logits"], np.float32), expected)
        x = np.random.default_rng(3).standard_normal((150, *LENET), dtype=np.float32)  # > 2 batches of 64
        with autohet.load(config) as runner:
            offline = runner(x)
        status, _, body = http(url + "/v1/predict", npy(x), "application/x-npy")
        assert status == 200
        close_to(np.array(json.loads(body)["outputs"], np.float32), offline)
        pixels = np.random.default_rng(4).integers(0, 256, (70, *LENET), dtype=np.uint8)  # a quarter of the bytes
        status, _, body = http(url + "/v1/predict", npy(pixels), "application/x-npy")
        assert status == 200
        close_to(np.array(json.loads(body)["outputs"], np.float32), reference(prep.scale.apply(pixels)))
        status, headers, body = http(url + "/v1/predict", npy(x[:5]), "application/x-npy",
                                     headers={"Accept": "application/x-npy"})
        assert status == 200 and headers["content-type"] == "application/x-npy"
        close_to(np.load(io.BytesIO(body)), offline[:5])
        phases = [entry.split(";")[0] for entry in headers["server-timing"].split(", ")]
        assert phases == ["body", "parse", "queue", "stream", "back", "to_replica", "from_replica", "encode"], phases
        # the three .npy bodies went to the replicas (this node's) through shared memory, gone once answered
        shared = {}
        for _ in range(24):
            ingress = json.loads(http(url + "/healthz")[2])["ingress"]
            shared[ingress["pid"]] = ingress["shm_bodies"]
        assert Path("/dev/shm").is_dir() <= (sum(shared.values()) == 3), shared
        kept = [f for pid in pids for f in Path("/dev/shm").glob(f"autohet-body-{pid}-*")]
        assert len(kept) <= 2, kept  # each ingress keeps its bodies for the next requests (its share: 1)

        # bad requests: each its 4xx and a one-line reason; the service still answers after them
        bad = [("/v1/predict", b"not an image", "image/jpeg", None, 400, "not a readable image"),
               ("/v1/predict", jpeg[: len(jpeg) // 2], "image/jpeg", None, 400, "truncated"),
               ("/v1/predict", npy(x[:2, :, :20]), "application/x-npy", None, 400, "(N, 1, 28, 28) float32"),
               ("/v1/predict", npy(x[:2].astype(np.float64)), "application/x-npy", None, 400, "float32"),
               ("/v1/predict", npy(np.zeros((400, *LENET), np.float32)), "application/x-npy", None, 413,
                "--max-body-mb"),
               ("/v1/predict", b"", "image/png", None, 400, "empty"),
               ("/v1/predict", jpeg, "text/plain", None, 415, "image/jpeg or image/png"),
               ("/v1/predict?top=3", jpeg, "image/jpeg", None, 400, "logits=1"),
               ("/v1/classify", jpeg, "image/jpeg", None, 404, "POST /v1/predict"),
               ("/v1/predict", None, None, "GET", 405, "takes POST")]
        for path, data, kind, method, code, fix in bad:
            status, _, body = http(url + path, data, kind, method)
            reason = json.loads(body)["error"]
            assert (status, fix in reason, len(reason.splitlines())) == (code, True, 1), (path, status, reason)
        assert http(url + "/v1/predict", jpeg, "image/jpeg")[0] == 200
        assert oversized_body_is_read_before_its_413(port)

        # overload: a queue of 1 and 12 clients at once: each request 200 (correct) or 503 with Retry-After
        results: list[tuple[int, dict[str, str], bytes]] = []
        batch = x[:128]

        def client() -> None:
            for _ in range(4):
                results.append(http(url + "/v1/predict", npy(batch), "application/x-npy",
                                     headers={"Accept": "application/x-npy"}))

        threads = [threading.Thread(target=client) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        statuses = [s for s, _, _ in results]
        assert len(results) == 48 and set(statuses) <= {200, 503} and statuses.count(200) >= 1
        assert statuses.count(503) >= 1, "12 clients never overlapped on a queue of 1"
        for status, headers, body in results:
            if status == 200:
                close_to(np.load(io.BytesIO(body)), offline[:128])
            else:
                assert headers["retry-after"] == "1" and "--max-queue" in json.loads(body)["error"]

        # a second service on the same port: one line, exit 2, before starting anything
        second = subprocess.run(serve_command(config, port), cwd=tmp_path, env=env(), capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 2 and second.stderr.count("\n") == 1
        assert f"127.0.0.1:{port} is in use by another server" in second.stderr

        started = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143 and time.perf_counter() - started < 20
        err = proc.stderr.read()
        assert "Traceback" not in err, err[-3000:]
        assert not [f for pid in pids for f in Path("/dev/shm").glob(f"autohet-body-{pid}-*")]  # removed at the end
        assert re.search(r"autohet: terminated: drained \d+ requests? in flight in [\d.]+ s; service stopped", err), err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


@pytest.mark.slow
def test_a_config_that_cannot_load_is_one_line_and_exit_2(tmp_path):
    missing = subprocess.run(serve_command(tmp_path / "none.yaml", free_port()), cwd=tmp_path, env=env(),
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "not found" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(config_of(tmp_path, load_pool("actors/cpu2.yaml"), "fifo", {}).read_text()
                      .replace("name: lenet", "name: vgg17"))
    unknown = subprocess.run(serve_command(broken, free_port()), cwd=tmp_path, env=env(), capture_output=True,
                             text=True, timeout=120)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "vgg17" in unknown.stderr


class FakeReplica:
    """A replica's handle for the ingress, without Ray: answers ``images.sum`` per image, refuses a
    chunk over its batch (as ``@serve.batch`` does) and dies under its first ``dies`` calls."""

    def __init__(self, name: str, batch: int, speed: float, dies: int = 0) -> None:
        self.name, self.batch, self.speed, self.dies, self.calls = name, batch, speed, dies, []

        class Method:
            def __init__(self, fn) -> None:
                self.remote = fn

        self.infer, self.info = Method(self._infer), Method(self._info)

    async def _infer(self, images: np.ndarray):
        from ray.exceptions import ActorDiedError

        from autohet.service.channel import Answer

        self.calls.append(len(images))
        assert len(images) <= self.batch, "Size of item is greater than max_batch_size"
        if self.dies:
            self.dies -= 1
            raise ActorDiedError()
        return Answer(images.reshape(len(images), -1).sum(axis=1, keepdims=True), {"queue": 0.0, "stream": 0.0})

    async def _info(self) -> dict:
        return {"name": self.name, "speed_ips": self.speed, "batch": self.batch, "classes": 1}


def test_a_chunk_whose_replica_dies_is_cut_again_for_the_others_and_nothing_is_lost():
    """The GPU's replica dies under a chunk of its batch: the chunk goes to the CPU group's replica in
    pieces of that one's batch, every output comes back in order, and the GPU is skipped until its
    successor answers."""
    import asyncio

    from autohet.service.app import Ingress, IngressSettings

    gpu, cpu = FakeReplica("exec-gpu", 8, 1000.0, dies=1), FakeReplica("exec-cpu", 2, 10.0)
    settings = IngressSettings("127.0.0.1", 0, "lenet", LENET, preprocessing_for(LENET, None, "t"), 4, 1 << 20,
                               frozenset(), 1, 60.0)
    ingress = Ingress(settings, **{"exec-gpu": gpu, "exec-cpu": cpu})
    x = np.random.default_rng(0).standard_normal((8, *LENET), dtype=np.float32)

    async def run() -> np.ndarray:
        out = await ingress._run(x)
        await asyncio.gather(*ingress.watchers)
        return out

    out = asyncio.run(run())
    assert np.allclose(out[:, 0], x.reshape(8, -1).sum(axis=1))
    assert gpu.calls == [8] and cpu.calls == [2, 2, 2, 2] and ingress.down == set()
    assert ingress.routed == [0, 8] and ingress.pending == [0, 0]
    alone = Ingress(settings, only=FakeReplica("only", 4, 1.0, dies=2))
    assert asyncio.run(alone._run(x)).shape == (8, 1)  # with no other, its successor gets the chunks
    assert alone.handles[0].calls == [4, 4, 4, 4]


def test_the_protocols_metadata_states_the_input_datatype_the_service_was_started_with():
    """``serve --input-datatype UINT8`` reaches every ingress's model description (what REST's and gRPC's
    metadata and model configuration answer from); FP32 is the default."""
    import asyncio
    import dataclasses

    from autohet.service.app import Ingress, IngressSettings

    settings = IngressSettings("127.0.0.1", 0, "lenet", LENET, preprocessing_for(LENET, None, "t"), 4, 1 << 20,
                               frozenset(), 1, 60.0)
    for given, said in ((settings, "FP32"), (dataclasses.replace(settings, input_datatype="UINT8"), "UINT8")):
        info = asyncio.run(Ingress(given, only=FakeReplica("only", 4, 1.0)).model_info())
        assert info.metadata()["inputs"][0]["datatype"] == said and info.config()["input"][0]["data_type"] == \
            f"TYPE_{said}"


def test_a_request_not_answered_within_its_timeout_gets_a_408_and_leaves_the_queue():
    """The ingress's own HTTP path (its listener's application): a request admitted on its head counts
    in flight; a replica that does not answer within ``request_timeout_s`` gives a 408 with a one-line
    reason, and the request no longer counts in flight."""
    import asyncio

    from autohet.service.app import Ingress, IngressSettings
    from autohet.service.listener import Admitted, parse_head

    class Stuck(FakeReplica):
        async def _infer(self, images: np.ndarray) -> np.ndarray:
            await asyncio.sleep(30)
            raise AssertionError("never answered")

    settings = IngressSettings("127.0.0.1", 0, "lenet", LENET, preprocessing_for(LENET, None, "t"), 4, 1 << 20,
                               frozenset(), 1, 0.3)
    ingress = Ingress(settings, only=Stuck("only", 4, 1.0))
    body = npy(np.zeros((2, *LENET), np.float32))
    head = parse_head(b"POST /v1/predict HTTP/1.1\r\ncontent-type: application/x-npy\r\ncontent-length: "
                      + str(len(body)).encode())
    admitted = ingress.begin(head)
    assert isinstance(admitted, Admitted) and ingress.in_flight == 1
    started = time.perf_counter()
    reply = asyncio.run(admitted.run(memoryview(body)))
    assert reply.status == 408 and time.perf_counter() - started < 10
    reason = json.loads(reply.body)["error"]
    assert "--request-timeout-s" in reason and len(reason.splitlines()) == 1
    assert ingress.in_flight == 0
    admitted.release()  # released once only, whoever calls it again
    assert ingress.in_flight == 0


def test_an_answer_says_where_its_time_went_in_server_timing():
    """Each phase of a request in the service (the body's read, its parse, the replica's own phases, Ray
    and Serve between them, the answer's encoding) comes back in ``Server-Timing``, in milliseconds."""
    import asyncio

    from autohet.service.app import Ingress, IngressSettings
    from autohet.service.channel import Answer
    from autohet.service.listener import parse_head

    class Slow(FakeReplica):
        async def _infer(self, images: np.ndarray):
            await asyncio.sleep(0.05)  # 50 ms in the call, 20 of them the replica's own
            return Answer(images.reshape(len(images), -1).sum(axis=1, keepdims=True),
                          {"queue": 0.005, "stream": 0.015})

    settings = IngressSettings("127.0.0.1", 0, "lenet", LENET, preprocessing_for(LENET, None, "t"), 4, 1 << 20,
                               frozenset(), 1, 60.0)
    ingress = Ingress(settings, only=Slow("only", 4, 1.0))
    x = np.random.default_rng(3).standard_normal((2, *LENET), dtype=np.float32)
    body = npy(x)
    head = parse_head(b"POST /v1/predict HTTP/1.1\r\ncontent-type: application/x-npy\r\naccept: application/x-npy\r\n"
                      b"content-length: " + str(len(body)).encode())
    reply = asyncio.run(ingress.begin(head).run(memoryview(body)))
    assert reply.status == 200 and np.allclose(np.load(io.BytesIO(reply.body))[:, 0], x.reshape(2, -1).sum(axis=1))
    phases = {}
    for entry in reply.headers["Server-Timing"].split(", "):
        name, dur = entry.split(";dur=")
        phases[name] = float(dur)
    assert list(phases) == ["body", "parse", "queue", "stream", "transit", "encode"]
    # exact: Python float arithmetic on the test's own figures
    assert phases["queue"] == 5.0 and phases["stream"] == 15.0
    assert 30.0 <= phases["transit"] < 30.0 + 2000.0 and all(v >= 0 for v in phases.values())


def test_the_ingress_refuses_on_the_head_and_a_full_queue_admits_no_more():
    """Refusals need no body: a wrong route, content type, declared size or query, and past
    ``max_queue`` requests in flight a 503 with Retry-After; a released request frees its place."""
    from autohet.service.app import Ingress, IngressSettings
    from autohet.service.listener import Admitted, Reply, parse_head

    settings = IngressSettings("127.0.0.1", 0, "lenet", LENET, preprocessing_for(LENET, None, "t"), 2, 1000,
                               frozenset(), 1, 5.0)
    ingress = Ingress(settings, only=FakeReplica("only", 4, 1.0))

    def begin(line: str, *headers: str) -> Reply | Admitted:
        return ingress.begin(parse_head("\r\n".join((line, *headers)).encode()))

    npy_type = "content-type: application/x-npy"
    for verdict, status in ((begin("GET /v2/predict HTTP/1.1"), 404), (begin("GET /v1/predict HTTP/1.1"), 405),
                            (begin("POST /v1/predict HTTP/1.1", "content-type: text/plain"), 415),
                            (begin("POST /v1/predict HTTP/1.1", npy_type, "content-length: 1001"), 413),
                            (begin("POST /v1/predict?top=3 HTTP/1.1", npy_type), 400)):
        assert isinstance(verdict, Reply) and verdict.status == status, (verdict, status)
        assert len(json.loads(verdict.body)["error"].splitlines()) == 1
    first, second = begin("POST /v1/predict HTTP/1.1", npy_type), begin("POST /v1/predict HTTP/1.1", npy_type)
    full = begin("POST /v1/predict HTTP/1.1", npy_type)
    assert isinstance(first, Admitted) and isinstance(second, Admitted)
    assert isinstance(full, Reply) and full.status == 503 and full.headers["Retry-After"]
    assert "--max-queue" in json.loads(full.body)["error"]
    first.release()
    assert isinstance(begin("POST /v1/predict HTTP/1.1", npy_type), Admitted)


class MapRunner:
    """``runner.map`` without devices: each batch's row sums, in order; a batch holding a NaN fails
    the stream (as a device error would); ``runs`` counts the streams started."""

    def __init__(self) -> None:
        self.runs = 0

    def map(self, batches):
        self.runs += 1
        for b in batches:
            if np.isnan(b).any():
                raise ValueError("a NaN reached the device")
            yield b.reshape(len(b), -1).sum(axis=1, keepdims=True)


def test_a_request_stream_answers_each_request_in_order_and_survives_a_failed_run():
    import asyncio

    from autohet.service.stream import RequestStream

    runner = MapRunner()
    stream = RequestStream(runner)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((n, 3), dtype=np.float32) for n in (1, 7, 64, 3)]
    bad = np.full((2, 3), np.nan, np.float32)

    async def run():
        first = await asyncio.gather(*(stream(x) for x in xs))  # queued together: one stream, in order
        failed = await asyncio.gather(stream(bad), return_exceptions=True)
        after = await stream(xs[1])  # a new run of the stream answers the next request
        return first, failed, after

    try:
        first, failed, after = asyncio.run(run())
    finally:
        stream.close()
    for x, (out, put, ready) in zip(xs, first, strict=True):
        assert np.allclose(out[:, 0], x.sum(axis=1))
        assert put <= ready  # when it went into the stream, when its outputs were ready
    assert isinstance(failed[0], ValueError) and "NaN" in str(failed[0])
    assert np.allclose(after[0][:, 0], xs[1].sum(axis=1)) and runner.runs == 2
    assert not stream.thread.is_alive()


class ReadAheadRunner(MapRunner):
    """``MapRunner`` reading its batches ahead on a thread, as the real runner does: after a failed
    run that thread still waits on the stream's inbox."""

    def map(self, batches):
        from autohet.runtime._inputs import ReadAhead

        reader = ReadAhead(batches, (3,), "t", 1 << 20)
        ended = False

        def read():
            nonlocal ended
            while not ended:
                taken, error, ended = reader.take(1)
                yield from (b.images for b in taken)
                if error is not None:
                    raise error

        try:
            yield from super().map(read())  # its sums, and its failure on a NaN
        finally:
            reader.stop()


def test_requests_after_a_failed_run_are_not_lost_to_its_reader():
    """A failed run's reader thread still waits on the inbox: what it takes next goes to the next run
    (each later request answered, the close still ends the stream), not into the failed run."""
    import asyncio

    from autohet.service.stream import RequestStream

    runner = ReadAheadRunner()
    stream = RequestStream(runner)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    async def run():
        failed = await asyncio.gather(stream(np.full((1, 3), np.nan, np.float32)), return_exceptions=True)
        later = [await asyncio.wait_for(stream(x + k), 20) for k in range(8)]
        return failed[0], later

    try:
        failed, later = asyncio.run(run())
    finally:
        stream.close(timeout_s=20)
    assert isinstance(failed, ValueError)
    for k, (out, _, _) in enumerate(later):
        assert np.allclose(out[:, 0], (x + k).sum(axis=1))
    assert not stream.thread.is_alive()
