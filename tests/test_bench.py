"""The benchmarks' --smoke mode on CPU: the scripts measured on the GPU machine keep running."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from autohet.strategies._driver import RAISE_MARGIN

REPO = Path(__file__).resolve().parents[1]


RAY_SLOW = [pytest.mark.ray, pytest.mark.slow]  # they start Ray in their subprocess and take 30-180 s; all are slow


@pytest.mark.parametrize("bench", [pytest.param("actor_path", marks=RAY_SLOW),
                                   pytest.param("data_parallel", marks=RAY_SLOW),
                                   pytest.param("tune_speed", marks=RAY_SLOW),
                                   pytest.param("cpu_peers", marks=RAY_SLOW),
                                   pytest.param("serve_load", marks=RAY_SLOW),
                                   pytest.param("runtime_load", marks=pytest.mark.slow),  # no Ray, ~8 s
                                   pytest.param("http_ceiling", marks=pytest.mark.slow),  # no Ray, ~5 s
                                   pytest.param("multi_gpu", marks=pytest.mark.slow),  # no Ray, ~15 s
                                   pytest.param("lane_trace", marks=pytest.mark.slow)])  # no Ray, ~5 s
def test_bench_smoke_prints_its_table_and_writes_json(bench: str, tmp_path: Path) -> None:
    out = tmp_path / f"{bench}.json"
    proc = subprocess.run([sys.executable, "-m", f"bench.{bench}", "--smoke", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows, "no rows"
    if bench == "data_parallel":
        assert all(r["output_ok"] for r in rows)
        assert all(0 < r["efficiency"] <= RAISE_MARGIN for r in rows if r["efficiency"] is not None)
    if bench == "tune_speed":
        assert rows[0]["tuned_over_grid"] > 0 and rows[0]["grid_runs"] == 2
    if bench == "multi_gpu":  # 1-core CPU groups stand in for GPUs: one, then two, then the stream over both
        row = rows[0]
        assert row["autohet_1"] > 0 and row["autohet_n"] > 0 and row["efficiency_n"] <= RAISE_MARGIN
        assert row["stream_over_run"] > 0 and set(row["stream_detail"]["executors"]) == {"cpu0", "cpu1"}
    if bench == "runtime_load":
        assert rows[0]["load_ips"] > 0 and rows[0]["run_ips"] > 0 and rows[0]["files"] == 40
        executors = rows[0]["executors"]  # the stream's lanes: where each executor's time went
        assert set(executors) == {"cpu0", "cpu1"}
        assert all(e["images"] > 0 and e["busy_s"] > 0 for e in executors.values())
    if bench == "cpu_peers":  # every peer measured (bf16 ones skipped with why on a CPU without it), then autohet
        row = rows[0]
        assert row["eager_fp32_nchw_ips"] > 0 and row["onnxruntime_fp32_ips"] > 0
        assert row["openvino_f32_throughput_ips"] > 0 and row["openvino_f32_latency_ips"] > 0
        assert row["best_peer_ips"] == max(v for k, v in row.items() if k.endswith("_ips") and k != "autohet_ips"
                                           and k != "best_peer_ips")
        assert row["autohet_ips"] > 0 and row["autohet_over_best_peer"] == row["autohet_ips"] / row["best_peer_ips"]
        assert len(row["ab_ratios"]) == 1 and row["ab_ratio_median"] == row["ab_autohet"][0] / row["ab_peer"][0]
        work = proc.stdout.split("; work ", 1)[1].split()[0]  # its temporary folder, removed at the end
        assert work.startswith(tempfile.gettempdir()) and not Path(work).exists(), work
    if bench == "serve_load":  # the service under load, one replica killed at 1 s: nothing lost, SIGTERM 143
        row = rows[0]
        assert row["answered"] > 0 and row["offline_ips"] > 0 and row["killed"] and row["client_procs"] == 2, row
        assert (row["lost"], row["wrong"], row["exit_code"]) == (0, 0, 143), row
        assert row["busiest_processes"] and set(row["images_per_call"]) == set(row["images_routed"]), row
        phases = row["phases"]  # the answers' Server-Timing, and the clients' round trip less it
        assert {"body", "parse", "queue", "stream", "to_replica", "from_replica", "encode", "outside"} <= set(phases)
        assert all(v["p50_ms"] >= 0 for k, v in phases.items() if k != "outside"), phases
    if bench == "lane_trace":  # every piece of two float32 and two pixels streams over the two lanes
        assert [r["images"] for r in rows] == [600] * 4 and rows[1]["pieces"] > 0, rows
        assert set(rows[1]["lanes"]) == {"cpu0", "cpu1"} and sum(e["images"] for e in rows[1]["lanes"].values()) == 600
        assert "   split " in proc.stdout and "   done " in proc.stdout
    if bench == "http_ceiling":  # bodies carried and answered by the ingress's HTTP server alone
        row = rows[0]
        assert row["req_s"] > 0 and row["body_mb_s"] > 0 and row["server_cores"] > 0, row


@pytest.mark.parametrize("protocol", ["v1", "v2-http"])
def test_the_http_load_client_accepts_the_services_answer_and_no_other(protocol: str) -> None:
    """The load's HTTP clients check every answer: the service's own encoding of the right outputs passes
    (v2: Triton's client decodes it), outputs off by more than the tolerance do not."""
    import argparse

    from autohet.service import oip
    from bench.serve_load import Bodies, http_call, npy

    x = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 3)
    expected = np.linspace(-1.0, 1.0, 2 * 5, dtype=np.float32).reshape(2, 5)
    bodies = Bodies("application/x-npy", [npy(x)], [expected], 2, accept="application/x-npy", arrays=[x],
                    model="m")
    call = http_call(bodies, argparse.Namespace(protocol=protocol, pixels=True), tolerance=1e-3)
    info = oip.ModelInfo("m", (4, 4, 3), 5, 8)

    class Response:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = headers

        def getheader(self, name: str) -> str | None:
            return self.headers.get(name)

    def answer(outputs: np.ndarray) -> tuple[Response, bytes]:
        if protocol == "v1":
            return Response({}), npy(outputs)
        request = oip.parse_infer(call.bodies[0], call.headers[0].get("Inference-Header-Content-Length"), info)
        # exact: uint8 pixels moved, not computed: the client's encoding as the service reads it
        assert request.binary and np.array_equal(request.images, x)
        body, _, headers = oip.infer_answer(request, outputs, info)
        return Response(headers), body

    assert call.correct(*answer(expected), 0)
    assert not call.correct(*answer(expected + 0.01), 0)


def test_the_grpc_load_client_sends_what_the_service_reads_and_checks_its_answers() -> None:
    """The load's gRPC requests (tritonclient's encoding) are read by the service's own reader, the pixels
    exact; the service's own answer with the right outputs passes (tritonclient decodes it), outputs off by
    more than the tolerance do not, nor bytes that are no answer."""
    import argparse

    from autohet.service import oip
    from autohet.service.oip_grpc import infer_response, read_infer_request, request_images
    from bench.serve_load import Bodies, grpc_call, npy

    x = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 3)
    expected = np.linspace(-1.0, 1.0, 2 * 5, dtype=np.float32).reshape(2, 5)
    bodies = Bodies("application/x-npy", [npy(x)], [expected], 2, arrays=[x], model="m")
    call = grpc_call(bodies, argparse.Namespace(pixels=True), tolerance=1e-3)
    info = oip.ModelInfo("m", (4, 4, 3), 5, 8)
    request, raws = read_infer_request(call.wires[0])
    shape, datatype, data = request_images(request, info, raws)
    # exact: uint8 pixels moved, not computed: the client's encoding as the service reads it
    assert datatype == "UINT8" and np.array_equal(oip.binary_tensor(data, shape, datatype), x)
    assert call.correct(infer_response(info, request.id, expected).SerializeToString(), 0)
    assert not call.correct(infer_response(info, request.id, expected + 0.01).SerializeToString(), 0)
    assert not call.correct(b"not an answer", 0)


def test_the_grpc_load_client_retries_the_services_unavailable_and_loses_a_broken_connection() -> None:
    """The service's UNAVAILABLE (draining, a full queue, no replica answered) is retried like a 503; grpc
    core's own (the connection failed or broke) is a lost request, like HTTP's broken connection."""
    from bench.serve_load import broken_transport

    for mine in ("the service is shutting down", "no replica answered after 3 attempts (last: ConnectionError: "
                 "Connection reset by peer); retry", "", None):
        assert not broken_transport(mine)
    for core in ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused",
                 "Socket closed", "recvmsg:Connection reset by peer", "Connection reset by peer"):
        assert broken_transport(core)


def test_perf_analyzer_as_the_load_is_asked_for_the_protocol_and_read_from_its_last_window(tmp_path) -> None:
    """``serve_load --perf-analyzer``: the binary gets the model, protocol, port, batch and requests in
    flight; its last measurement window gives img/s (every image of a batch an inference), req/s and
    latencies in ms; a run that ends non-zero is an error naming it, never figures. A shell script
    stands in for perf_analyzer (it writes the CSV that ``-f`` names, as perf_analyzer does)."""
    import argparse
    import stat

    from bench.serve_load import perf_analyzer_load

    fake = tmp_path / "perf_analyzer"
    fake.write_text("#!/bin/sh\n"
                    "echo \"$@\" > \"$(dirname \"$0\")/args\"\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = -f ] && f=$2; shift; done\n"
                    "printf 'Concurrency,Inferences/Second,p50 latency,p90 latency,p99 latency\\n"
                    "8,1000,9000,11000,15000\\n8,1280,8000,10000,12000\\n' > \"$f\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    args = argparse.Namespace(protocol="v2-grpc", port=8000, grpc_port=8001, npy_batch=64, clients=8, seconds=2.0)
    got = perf_analyzer_load(str(fake), "resnet18", args, tmp_path)
    sent = (tmp_path / "args").read_text().split()
    for flag, value in (("-m", "resnet18"), ("-i", "grpc"), ("-u", "127.0.0.1:8001"), ("-b", "64"),
                        ("--concurrency-range", "8"), ("--measurement-interval", "2000")):
        assert sent[sent.index(flag) + 1] == value, (flag, sent)
    assert got["img_s"] == pytest.approx(1280) and got["req_s"] == pytest.approx(20)  # the last window's
    assert (got["p50_ms"], got["p90_ms"], got["p99_ms"]) == pytest.approx((8.0, 10.0, 12.0))
    args.protocol = "v2-http"
    perf_analyzer_load(str(fake), "resnet18", args, tmp_path)
    sent = (tmp_path / "args").read_text().split()
    assert sent[sent.index("-i") + 1] == "http" and sent[sent.index("-u") + 1] == "127.0.0.1:8000"
    fake.write_text("#!/bin/sh\necho 'Failed to retrieve results from inference request.' >&2\nexit 99\n")
    with pytest.raises(SystemExit, match="perf_analyzer ended with 99: Failed to retrieve"):
        perf_analyzer_load(str(fake), "resnet18", args, tmp_path / "none")


def test_the_stack_sampler_names_where_each_thread_waits() -> None:
    """``bench/_stacks.py`` (``runtime_load --stacks``): a thread parked in a known function shows under
    its group (a pool's numbered threads as one), with that function among its stacks and its cores."""
    import threading
    import time

    from bench._stacks import StackSampler

    stop = threading.Event()

    def _parked_in_the_probe() -> None:
        stop.wait(10)

    threads = [threading.Thread(target=_parked_in_the_probe, name=f"probe-{k}") for k in range(2)]
    for t in threads:
        t.start()
    try:
        with StackSampler(interval_s=0.002) as sampler:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sampler.samples > 0 and sum(sampler.counts["probe"].values()) == 2 * sampler.samples
    report = "\n".join(sampler.report())
    assert "  probe: " in report and "_parked_in_the_probe" in report and "cores " in report


@pytest.mark.parametrize("pixels", [False, True])
def test_the_streams_synthetic_batches_read_fresh_memory_not_a_cached_bank(pixels: bool) -> None:
    """Issue 49: a stream bench's batches are distinct memory up to ``SOURCE_BYTES`` (a real stream reads
    freshly decoded images, not a bank the CPU's 300 MiB cache holds: staged from a 128 MB bank, float32 ran
    1.4x its rate from DRAM, BENCHMARKS.md 39). resnet18's distinct bank is 222 images (128 MB); repeated
    to two batches, a stream read the same 308 MB over and over."""
    from types import SimpleNamespace

    from bench.runtime_load import SOURCE_BYTES, synthetic_batches

    runner = SimpleNamespace(model=SimpleNamespace(name="resnet18"), config=SimpleNamespace(workload_seed=0))
    per_image = 3 * 224 * 224 * (1 if pixels else 4)
    batches = list(synthetic_batches(runner, 2048, 256, pixels)())
    assert len(batches) == 8 and all(len(b) == 256 and b.dtype == (np.uint8 if pixels else np.float32)
                                     for b in batches)
    distinct = len({b.__array_interface__["data"][0] for b in batches})
    assert distinct == min(8, SOURCE_BYTES // per_image // 256)  # float32: 1 GiB holds 1784 images, 6 batches apart
