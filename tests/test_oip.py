"""The Open Inference Protocol v2 codec (``autohet.service.oip``) and its gRPC messages (``oip_grpc``)
without a service: routes, metadata, JSON and binary tensors in, logits out, and every refusal a
status with one line naming the fix; the gRPC messages read by tritonclient's own descriptors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from autohet.service import oip
from autohet.service.oip import ModelInfo, infer_answer, parse_infer, route
from autohet.service.requests import BadRequest

INFO = ModelInfo("cifarnet", (3, 32, 32), 10, 64)


def refused(status: int, fn, *args) -> str:
    with pytest.raises(BadRequest) as info:
        fn(*args)
    assert info.value.status == status and len(info.value.reason.splitlines()) == 1, info.value.reason
    return info.value.reason


def binary_request(x: np.ndarray, datatype: str, outputs: list | None = None, **extra) -> tuple[bytes, str]:
    """A request with the binary tensor data extension, as tritonclient.http builds it: (body, header length)."""
    request = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": datatype,
                           "parameters": {"binary_data_size": x.nbytes}}], **extra}
    if outputs is not None:
        request["outputs"] = outputs
    header = json.dumps(request).encode()
    return header + x.tobytes(), str(len(header))


def test_routes_and_their_methods():
    assert route("GET", "/v2") == oip.Route("server") and route("GET", "/v2/health/live/") == oip.Route("live")
    assert route("HEAD", "/v2/health/ready") == oip.Route("ready")
    assert route("GET", "/v2/models/cifarnet") == oip.Route("model", "cifarnet")
    assert route("GET", "/v2/models/cifarnet/versions/1/ready") == oip.Route("model_ready", "cifarnet", "1")
    assert route("POST", "/v2/models/cifarnet/infer") == oip.Route("infer", "cifarnet")
    assert route("GET", "/v2/models/cifarnet/config") == oip.Route("config", "cifarnet")
    assert "/v2/models/{name}" in refused(404, route, "GET", "/v2/models/cifarnet/stats")
    refused(404, route, "GET", "/v2/repository/index")
    with pytest.raises(BadRequest) as info:
        route("GET", "/v2/models/cifarnet/infer")
    assert info.value.status == 405 and info.value.headers == {"Allow": "POST"}
    refused(405, route, "POST", "/v2/models/cifarnet")


def test_metadata_and_config_say_the_model_with_a_variable_batch():
    assert INFO.metadata() == {"name": "cifarnet", "versions": ["1"], "platform": "autohet",
                               "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}],
                               "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}
    config = INFO.config()
    assert config["max_batch_size"] == 64 and config["input"][0]["dims"] == [3, 32, 32]
    assert "binary_tensor_data" in INFO.server_metadata("0.1.0")["extensions"]
    pixels = dataclasses.replace(INFO, datatype="UINT8")  # serve --input-datatype UINT8: clients send pixels
    assert pixels.metadata()["inputs"][0]["datatype"] == "UINT8" and pixels.config()["input"][0]["data_type"] == \
        "TYPE_UINT8" and config["input"][0]["data_type"] == "TYPE_FP32"
    INFO.check("cifarnet", None)
    INFO.check("cifarnet", "1")
    assert "serves 'cifarnet'" in refused(404, INFO.check, "resnet18", None)
    assert "the only one is '1'" in refused(404, INFO.check, "cifarnet", "2")


def test_binary_tensors_are_read_in_place_and_answered_binary():
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32), dtype=np.float32)
    body, length = binary_request(x, "FP32", [{"name": "logits", "parameters": {"binary_data": True}}], id="r7")
    padded = bytearray(body)  # an aligned body: the tensor is a view of it, not a copy
    request = parse_infer(memoryview(padded), length, INFO)
    # exact: bytes moved, no arithmetic
    assert np.array_equal(request.images, x) and request.id == "r7" and request.binary
    pixels = np.random.default_rng(1).integers(0, 256, (2, 3, 32, 32), dtype=np.uint8)
    body, length = binary_request(pixels, "UINT8", parameters={"binary_data_output": True})
    got = parse_infer(body, length, INFO)
    # exact: bytes moved, no arithmetic
    assert got.images.dtype == np.uint8 and np.array_equal(got.images, pixels) and got.binary
    assert np.shares_memory(np.frombuffer(body, np.uint8), got.images)  # uint8: never copied
    logits = np.random.default_rng(2).standard_normal((2, 10), dtype=np.float32)
    data, content_type, headers = infer_answer(got, logits, INFO)
    split = int(headers["Inference-Header-Content-Length"])
    answer = json.loads(data[:split])
    assert content_type == "application/octet-stream" and answer["model_name"] == "cifarnet"
    assert answer["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [2, 10],
                                  "parameters": {"binary_data_size": 80}}]
    # exact: bytes moved, no arithmetic
    assert np.array_equal(np.frombuffer(data[split:], "<f4").reshape(2, 10), logits)


def test_json_tensors_in_and_out():
    x = np.random.default_rng(3).integers(0, 256, (1, 3, 32, 32)).astype(np.uint8)
    body = json.dumps({"id": 5, "inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "UINT8",
                                            "data": x.tolist()}]}).encode()  # nested lists, row-major
    request = parse_infer(body, None, INFO)
    # exact: integers through JSON
    assert np.array_equal(request.images, x) and request.id == "5" and not request.binary
    logits = np.arange(10, dtype=np.float32)[None]
    data, content_type, headers = infer_answer(request, logits, INFO)
    assert content_type == "application/json" and not headers
    # exact: small integers through JSON
    assert json.loads(data)["outputs"][0]["data"] == list(range(10))


def test_bad_requests_get_400_naming_the_fix():
    x = np.zeros((1, 3, 32, 32), np.float32)
    good, length = binary_request(x, "FP32")
    cases = [
        (b"not json", None, "not JSON"),
        (b'{"inputs": 3}', None, '"inputs" list'),
        (json.dumps({"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32"}]}).encode(), None,
         "one input, 'input'"),
        (*binary_request(x.astype(np.float64), "FP64"), "send FP32 (scaled inputs) or UINT8 (pixels)"),
        (*binary_request(np.zeros((1, 3, 32, 31), np.float32), "FP32"), "resize and crop"),
        (good[:-4], length, "binary_data_size"),
        (good, str(len(good) + 1), "Inference-Header-Content-Length"),
        (good, "lots", "Inference-Header-Content-Length"),
        (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                 "data": [1.0] * 5}]}).encode(), None, "needs 3072 values"),
        (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "UINT8",
                                 "data": [300] * 3072}]}).encode(), None, "outside 0-255"),
        (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32"}]}).encode(), None,
         'no "data"'),
        (*binary_request(x, "FP32", [{"name": "probabilities"}]), "the model has one, 'logits'"),
        (*binary_request(x, "FP32", [{"name": "logits", "parameters": {"classification": 3}}]), "classification"),
    ]
    for body, header_length, fix in cases:
        reason = refused(400, parse_infer, body, header_length, INFO)
        assert fix in reason, (fix, reason)


def test_a_model_infer_request_is_read_with_its_tensors_left_in_the_wire_bytes():
    """``read_infer_request``: every field but the tensors as protobuf reads them, the tensors as views
    of the wire bytes (no copy), in order; bytes that are not a message are a 400."""
    from tritonclient.grpc import service_pb2 as triton

    from autohet.service import oip_messages_pb2 as pb
    from autohet.service.oip_grpc import read_infer_request

    raws = [bytes(range(256)) * 40, b"", b"\x07" * 3]
    message = triton.ModelInferRequest(
        model_name="cifarnet", model_version="1", id="r9", raw_input_contents=raws,
        parameters={"sequence_id": triton.InferParameter(int64_param=7)},
        inputs=[triton.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 3, 32, 32])],
        outputs=[triton.ModelInferRequest.InferRequestedOutputTensor(name="logits")])
    wire = message.SerializeToString()
    head, views = read_infer_request(wire)
    whole = pb.ModelInferRequest.FromString(wire)
    assert [bytes(v) for v in views] == list(whole.raw_input_contents) == raws
    assert all(v.obj is wire for v in views)  # views of the wire bytes, not copies
    whole.ClearField("raw_input_contents")
    assert head == whole and head.parameters["sequence_id"].int64_param == 7
    assert read_infer_request(b"") == (pb.ModelInferRequest(), [])
    for broken in (wire[:-2], wire[:3], b"\xff" * 11, b"\x3b", bytes([0x3A, 0x80])):  # cut, long varint, group
        assert "not a valid protobuf message" in refused(400, read_infer_request, broken)


def test_grpc_requests_read_by_the_protocol_descriptors():
    """A ModelInfer request as tritonclient.grpc writes it (its own ``inference`` messages), read by the
    service's messages; the answer read back by tritonclient's: one wire format."""
    from tritonclient.grpc import service_pb2 as triton

    from autohet.service import oip_messages_pb2 as pb
    from autohet.service.oip_grpc import infer_response, request_images

    pixels = np.random.default_rng(4).integers(0, 256, (3, 3, 32, 32), dtype=np.uint8)
    wire = triton.ModelInferRequest(model_name="cifarnet", id="x1", inputs=[triton.ModelInferRequest.InferInputTensor(
        name="input", datatype="UINT8", shape=[3, 3, 32, 32])], raw_input_contents=[pixels.tobytes()],
        outputs=[triton.ModelInferRequest.InferRequestedOutputTensor(name="logits")]).SerializeToString()
    shape, datatype, data = request_images(pb.ModelInferRequest.FromString(wire), INFO)
    # exact: bytes moved, no arithmetic
    assert (shape, datatype) == ((3, 3, 32, 32), "UINT8") and np.array_equal(
        oip.binary_tensor(data, shape, datatype), pixels)
    typed = triton.ModelInferRequest(model_name="cifarnet", inputs=[triton.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, 3, 32, 32], contents=triton.InferTensorContents(
            fp32_contents=[0.5] * 3072))])
    shape, _, values = request_images(pb.ModelInferRequest.FromString(typed.SerializeToString()), INFO)
    assert values.shape == (1, 3, 32, 32) and float(values.max()) == 0.5  # exact: 0.5 is a float32
    logits = np.random.default_rng(5).standard_normal((3, 10), dtype=np.float32)
    back = triton.ModelInferResponse.FromString(infer_response(INFO, "x1", logits).SerializeToString())
    assert (back.model_name, back.id, back.outputs[0].name, list(back.outputs[0].shape)) == ("cifarnet", "x1",
                                                                                            "logits", [3, 10])
    # exact: bytes moved, no arithmetic
    assert np.array_equal(np.frombuffer(back.raw_output_contents[0], "<f4").reshape(3, 10), logits)
    wrong = triton.ModelInferRequest(model_name="resnet", inputs=[triton.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, 3, 32, 32])])
    refused(404, request_images, pb.ModelInferRequest.FromString(wrong.SerializeToString()), INFO)
    short = triton.ModelInferRequest(model_name="cifarnet", inputs=[triton.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, 3, 32, 32])], raw_input_contents=[b"\0" * 100])
    shape, datatype, data = request_images(pb.ModelInferRequest.FromString(short.SerializeToString()), INFO)
    assert "needs 12288 bytes" in refused(400, oip.binary_tensor, data, shape, datatype)
