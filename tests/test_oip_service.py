"""``autohet serve`` speaking the Open Inference Protocol v2 to Triton's own clients: one service (a
cifarnet config on actors/cpu2.yaml, HTTP and gRPC) started once for the module; ``tritonclient.http``
and ``tritonclient.grpc`` read its metadata and configuration and infer with binary data (FP32 inputs
and UINT8 pixels), outputs as ``autohet.load``'s for the same inputs; an unknown model is 404 /
NOT_FOUND, a wrong shape or datatype 400 / INVALID_ARGUMENT, and the service answers after each."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from autohet.config import RunConfig, write_config
from autohet.context import TOLERANCE
from autohet.core.models import ModelSpec
from autohet.pool import load_pool

REPO = Path(__file__).resolve().parents[1]
SHAPE = (3, 32, 32)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[dict]:
    """The service, its ports and ``autohet.load``'s outputs for the inputs the tests send."""
    import autohet

    folder = tmp_path_factory.mktemp("oip")
    config = write_config(RunConfig(ModelSpec("cifarnet"), load_pool(str(REPO / "actors/cpu2.yaml")), "fast_split",
                                    {"w_s": 2, "threshold": 2}, images=64), folder / "c.yaml")
    rng = np.random.default_rng(11)
    inputs = {"FP32": rng.standard_normal((70, *SHAPE), dtype=np.float32),  # over one batch of 64
              "UINT8": rng.integers(0, 256, (5, *SHAPE), dtype=np.uint8)}
    with autohet.load(config) as runner:
        expected = {kind: runner(x) for kind, x in inputs.items()}
    http_port, grpc_port = free_port(), free_port()
    command = [os.fspath(Path(os.sys.executable)), "-m", "autohet.cli", "serve", "--config", str(config), "--port",
               str(http_port), "--grpc-port", str(grpc_port), "--ingress-procs", "2"]
    proc = subprocess.Popen(command, cwd=folder, env=dict(os.environ, PYTHONPATH=str(REPO), RAY_TMPDIR="/tmp"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    watchdog = threading.Timer(300, os.killpg, (proc.pid, signal.SIGKILL))  # never ready: killed, the read ends
    watchdog.start()
    try:
        ready = [proc.stdout.readline() for _ in range(2)]
    finally:
        watchdog.cancel()
    try:
        assert "2 replicas" in ready[1], [*ready, proc.stderr.read()[-3000:] if proc.poll() is not None else ""]
        assert f"gRPC at 127.0.0.1:{grpc_port}" in ready[0] and "as model 'cifarnet'" in ready[0]
        yield {"http": f"127.0.0.1:{http_port}", "grpc": f"127.0.0.1:{grpc_port}", "inputs": inputs,
               "expected": expected}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def clients(service: dict) -> list:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return [httpclient.InferenceServerClient(service["http"]), grpcclient.InferenceServerClient(service["grpc"])]


def infer(client, x: np.ndarray, datatype: str, model: str = "cifarnet") -> np.ndarray:
    """One inference with binary data both ways, as tritonclient sends it."""
    module = __import__(type(client).__module__.rsplit(".", 1)[0], fromlist=["InferInput"])
    tensor = module.InferInput("input", list(x.shape), datatype)
    output = module.InferRequestedOutput("logits")
    if module.__name__.endswith("http"):
        tensor.set_data_from_numpy(x, binary_data=True)
        output = module.InferRequestedOutput("logits", binary_data=True)
    else:
        tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], outputs=[output], request_id="t1").as_numpy("logits")


def close_to(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.shape == ref.shape and out.dtype == np.float32
    assert float(np.abs(out - ref).max()) <= TOLERANCE["fp32"] * float(np.abs(ref).max())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_clients_read_metadata_and_infer_as_autohet_load(service, protocol):
    client = clients(service)[0 if protocol == "http" else 1]
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cifarnet")
    as_json = protocol == "http"
    meta = client.get_model_metadata("cifarnet", as_json=True) if not as_json else client.get_model_metadata("cifarnet")
    assert meta["name"] == "cifarnet" and meta["versions"] == ["1"]
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [
        ("input", "FP32", [-1, *SHAPE])]
    assert [(t["name"], [int(d) for d in t["shape"]]) for t in meta["outputs"]] == [("logits", [-1, 10])]
    config = client.get_model_config("cifarnet") if as_json else client.get_model_config("cifarnet", as_json=True)
    config = config.get("config", config)
    assert int(config["max_batch_size"]) == 64 and [int(d) for d in config["input"][0]["dims"]] == list(SHAPE)
    server = client.get_server_metadata() if as_json else client.get_server_metadata(as_json=True)
    assert "binary_tensor_data" in server["extensions"]
    for datatype, x in service["inputs"].items():
        close_to(infer(client, x, datatype), service["expected"][datatype])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_requests_get_the_protocol_errors_and_the_service_answers_after_each(service, protocol):
    from tritonclient.utils import InferenceServerException

    client = clients(service)[0 if protocol == "http" else 1]
    x = service["inputs"]["FP32"][:2]
    cases = [("resnet18", x, "FP32", "404", "StatusCode.NOT_FOUND", "serves 'cifarnet'"),
             ("cifarnet", x[:, :, :, :31].copy(), "FP32", "400", "StatusCode.INVALID_ARGUMENT", "resize and crop"),
             ("cifarnet", x[:, :2].copy(), "FP32", "400", "StatusCode.INVALID_ARGUMENT", "resize and crop"),
             ("cifarnet", x.astype(np.float64), "FP64", "400", "StatusCode.INVALID_ARGUMENT", "send FP32"),
             ("cifarnet", x.astype(np.int32), "INT32", "400", "StatusCode.INVALID_ARGUMENT", "send FP32")]
    for model, data, datatype, http_status, grpc_status, fix in cases:
        with pytest.raises(InferenceServerException) as info:
            infer(client, data, datatype, model)
        assert info.value.status() == (http_status if protocol == "http" else grpc_status), info.value
        assert fix in info.value.message() and len(info.value.message().splitlines()) == 1
        assert client.is_server_live()
        close_to(infer(client, service["inputs"]["UINT8"], "UINT8"), service["expected"]["UINT8"])
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("resnet18")
    assert info.value.status() in ("404", "StatusCode.NOT_FOUND")


def test_the_readme_tritonclient_example_runs(service, capsys):
    """README's tritonclient example as written, but for where this service listens and what it serves
    (cifarnet, not resnet18): it prints the logits' shape."""
    import re

    readme = (REPO / "README.md").read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "tritonclient.http" in block)
    exec(example.replace("localhost:8000", service["http"]).replace('"resnet18"', '"cifarnet"'), {})
    assert capsys.readouterr().out.strip() == "(8, 10)"
