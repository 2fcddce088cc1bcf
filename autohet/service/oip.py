"""The Open Inference Protocol v2 (KServe, Triton, OpenVINO Model Server, MLServer) as ``autohet serve``
speaks it: routes, metadata, and inference requests and answers, as pure functions (no Ray, no server),
shared by the REST endpoints and the gRPC service (``oip_grpc``).

The served model has one input, ``input`` (N, C, H, W): ``FP32`` model inputs, or ``UINT8`` pixels
scaled by the config's preprocess mean and std on the replica; its metadata says FP32 (one datatype per
input; ``--input-datatype UINT8`` says pixels, so that clients that generate inputs from it, perf_analyzer
among them, send pixels), and both are taken whatever it says. One output, ``logits`` (N, classes),
``FP32``. The batch dimension is ``-1``. REST requests carry tensors in JSON (``data``) or, with the
binary tensor data extension, after a JSON header of ``Inference-Header-Content-Length`` bytes
(``binary_data_size``); an answer's logits are binary where the request asks (``binary_data`` on the
output, or ``binary_data_output``). Every refusal is a ``BadRequest`` (status, one line naming the
fix), answered as ``{"error": ...}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from autohet.service.requests import BadRequest

__all__ = ["DATATYPES", "HEADER_LENGTH", "INPUT", "OUTPUT", "InferRequest", "ModelInfo", "Route", "binary_tensor",
           "infer_answer", "parse_infer", "route", "tensor_shape"]

INPUT, OUTPUT = "input", "logits"
MODEL_VERSION = "1"
HEADER_LENGTH = "inference-header-content-length"
DATATYPES = {"FP32": np.dtype("<f4"), "UINT8": np.dtype("u1")}
EXTENSIONS = ("binary_tensor_data", "model_configuration")
_MODEL_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
                         r"(?P<tail>/ready|/infer|/config)?$")
_SERVER_PATHS = {"/v2": "server", "/v2/health/live": "live", "/v2/health/ready": "ready"}


@dataclass(frozen=True)
class ModelInfo:
    """What the protocol says of the served model: its ``name`` (the config's model, or ``--name``), input
    shape without the batch, classes, the largest batch a replica runs at once, and the input's datatype
    its metadata states (``DATATYPES``; either is taken)."""

    name: str
    input_shape: tuple[int, ...]
    classes: int
    max_batch: int
    version: str = MODEL_VERSION
    datatype: str = "FP32"

    def server_metadata(self, server_version: str) -> dict[str, Any]:
        return {"name": "autohet", "version": server_version, "extensions": list(EXTENSIONS)}

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "versions": [self.version], "platform": "autohet",
                "inputs": [{"name": INPUT, "datatype": self.datatype, "shape": [-1, *self.input_shape]}],
                "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, self.classes]}]}

    def config(self) -> dict[str, Any]:
        """Triton's model configuration (its ``model_configuration`` extension), which perf_analyzer reads
        for the batch it may send."""
        return {"name": self.name, "platform": "autohet", "max_batch_size": self.max_batch,
                "input": [{"name": INPUT, "data_type": f"TYPE_{self.datatype}", "dims": list(self.input_shape)}],
                "output": [{"name": OUTPUT, "data_type": "TYPE_FP32", "dims": [self.classes]}]}

    def check(self, name: str, version: str | None) -> None:
        """404 for another model or version."""
        if name != self.name:
            raise BadRequest(404, f"no model {name!r}; this service serves {self.name!r}")
        if version not in (None, "", self.version):
            raise BadRequest(404, f"no version {version!r} of {self.name!r}; the only one is {self.version!r}")


@dataclass(frozen=True)
class Route:
    """A v2 path: ``kind`` (server, live, ready, model, model_ready, infer, config) and the model named."""

    kind: str
    model: str | None = None
    version: str | None = None


def route(method: str, path: str) -> Route:
    """The v2 endpoint of ``method path``; 404 for another path, 405 (with ``Allow``) for another method."""
    path = path.rstrip("/") or "/"
    kind = _SERVER_PATHS.get(path)
    model = version = None
    if kind is None:
        match = _MODEL_PATH.match(path)
        if match is None:
            raise BadRequest(404, f"no endpoint {path}; the v2 endpoints are /v2, /v2/health/live|ready and "
                                  "/v2/models/{name}[/ready|/config|/infer]")
        kind = {None: "model", "/ready": "model_ready", "/infer": "infer", "/config": "config"}[match["tail"]]
        model, version = match["name"], match["version"]
    allowed = "POST" if kind == "infer" else "GET"
    if method.upper() != allowed and not (allowed == "GET" and method.upper() == "HEAD"):
        raise BadRequest(405, f"{path} takes {allowed}, not {method.upper()}", {"Allow": allowed})
    return Route(kind, model, version)


def tensor_shape(shape: Any, datatype: str, info: ModelInfo) -> tuple[int, ...]:
    """An input's shape and datatype checked against the model's: (N, C, H, W); 400 naming the fix."""
    want = f"[N, {', '.join(map(str, info.input_shape))}] FP32 inputs or UINT8 pixels"
    if datatype not in DATATYPES:
        raise BadRequest(400, f"input {INPUT!r} has datatype {datatype!r}; {info.name} takes {want}: send FP32 "
                              "(scaled inputs) or UINT8 (pixels)")
    if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BadRequest(400, f"input {INPUT!r} has shape {shape!r}; give a list of non-negative sizes: {want}")
    if len(shape) != len(info.input_shape) + 1 or tuple(shape[1:]) != info.input_shape:
        raise BadRequest(400, f"input {INPUT!r} has shape {list(shape)}; {info.name} takes {want}: resize and "
                              "crop the images to the model's input")
    return tuple(int(d) for d in shape)


def binary_tensor(data: memoryview | bytes, shape: tuple[int, ...], datatype: str) -> np.ndarray:
    """Raw little-endian tensor bytes as an array of ``shape``: a view of them where they are aligned
    for the datatype, else a copy; 400 when their size is not the shape's."""
    dtype = DATATYPES[datatype]
    need = int(np.prod(shape)) * dtype.itemsize
    if len(data) != need:
        raise BadRequest(400, f"input {INPUT!r} of shape {list(shape)} {datatype} needs {need} bytes and has "
                              f"{len(data)}: send the whole tensor, row-major, without padding")
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    return array if array.flags.aligned else array.copy()


@dataclass
class InferRequest:
    """An inference request read: its images, its ``id`` (echoed), whether its logits go back binary."""

    images: np.ndarray
    id: str | None = None
    binary: bool = False


def parse_infer(body: memoryview | bytes, header_length: str | None, info: ModelInfo) -> InferRequest:
    """A REST inference request: its JSON (the first ``Inference-Header-Content-Length`` bytes where
    given, else the whole body) and any binary tensor data after it."""
    view = memoryview(body)
    if header_length is None:
        split = len(view)
    else:
        if not header_length.strip().isdigit() or int(header_length) > len(view):
            raise BadRequest(400, f"Inference-Header-Content-Length {header_length!r} is not the length of the "
                                  f"request's JSON within its {len(view)} bytes")
        split = int(header_length)
    try:
        request = json.loads(bytes(view[:split]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"the inference request is not JSON ({str(exc).splitlines()[0][:100]}); send "
                              '{"inputs": [...]} (binary data after it: Inference-Header-Content-Length)') from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest(400, 'the inference request has no "inputs" list; send {"inputs": [{"name": "input", ...}]}')
    inputs = request["inputs"]
    if len(inputs) != 1 or not isinstance(inputs[0], dict) or inputs[0].get("name") != INPUT:
        names = [i.get("name") if isinstance(i, dict) else i for i in inputs]
        raise BadRequest(400, f"the request's inputs are {names}; {info.name} takes one input, {INPUT!r}")
    tensor = inputs[0]
    datatype = tensor.get("datatype")
    shape = tensor_shape(tensor.get("shape"), str(datatype), info)
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    rest = view[split:]
    if size is not None:
        if not isinstance(size, int) or size != len(rest):
            raise BadRequest(400, f"binary_data_size {size!r} is not the {len(rest)} bytes after the JSON header")
        images = binary_tensor(rest, shape, str(datatype))
    else:
        if len(rest):
            raise BadRequest(400, f"{len(rest)} bytes after the JSON header and no input with binary_data_size")
        images = _json_tensor(tensor.get("data"), shape, str(datatype))
    binary = _binary_output(request)
    request_id = request.get("id")
    return InferRequest(images, str(request_id) if request_id is not None else None, binary)


def _json_tensor(data: Any, shape: tuple[int, ...], datatype: str) -> np.ndarray:
    """A tensor's JSON ``data`` (flat or nested, row-major) as an array of ``shape``."""
    if data is None:
        raise BadRequest(400, f'input {INPUT!r} has no "data" and no binary_data_size; send one of them')
    try:
        values = np.asarray(data, dtype=np.float64).reshape(-1)
    except (ValueError, TypeError):
        raise BadRequest(400, f'input {INPUT!r}\'s "data" is not a list of numbers; send them row-major') from None
    if len(values) != int(np.prod(shape)):
        raise BadRequest(400, f"input {INPUT!r} of shape {list(shape)} needs {int(np.prod(shape))} values and has "
                              f"{len(values)}")
    if datatype == "UINT8" and ((values < 0) | (values > 255) | (values != np.round(values))).any():
        raise BadRequest(400, f"input {INPUT!r} is UINT8 and has values outside 0-255 or not whole; send pixels")
    return values.astype(DATATYPES[datatype]).reshape(shape)


def _binary_output(request: dict[str, Any]) -> bool:
    """Whether the logits go back as binary data; 400 for another output or a classification."""
    default = bool((request.get("parameters") or {}).get("binary_data_output", False))
    outputs = request.get("outputs")
    if outputs is None:
        return default
    if not isinstance(outputs, list) or len(outputs) != 1 or not isinstance(outputs[0], dict) or \
            outputs[0].get("name") != OUTPUT:
        raise BadRequest(400, f"the request asks for outputs {outputs!r}; the model has one, {OUTPUT!r}")
    parameters = outputs[0].get("parameters") or {}
    if "classification" in parameters:
        raise BadRequest(400, "the classification extension is not served; ask for the logits and take their top k")
    return bool(parameters.get("binary_data", default))


def infer_answer(request: InferRequest, outputs: np.ndarray, info: ModelInfo) -> tuple[bytes, str, dict[str, str]]:
    """The REST answer: (body, content type, headers); binary logits follow the JSON header."""
    logits = np.ascontiguousarray(outputs, dtype="<f4")
    tensor: dict[str, Any] = {"name": OUTPUT, "datatype": "FP32", "shape": list(logits.shape)}
    answer: dict[str, Any] = {"model_name": info.name, "model_version": info.version}
    if request.id is not None:
        answer["id"] = request.id
    answer["outputs"] = [tensor]
    if not request.binary:
        tensor["data"] = logits.reshape(-1).tolist()
        return json.dumps(answer, separators=(",", ":")).encode(), "application/json", {}
    tensor["parameters"] = {"binary_data_size": logits.nbytes}
    header = json.dumps(answer, separators=(",", ":")).encode()
    return header + logits.tobytes(), "application/octet-stream", {"Inference-Header-Content-Length": str(len(header))}
