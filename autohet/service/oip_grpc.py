"""The Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``) in each ingress process,
beside its HTTP listener: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig
(Triton's extension, which perf_analyzer reads) and ModelInfer with ``raw_input_contents`` or typed
contents; other methods answer UNIMPLEMENTED. Every ingress process serves it on ``--grpc-port`` (gRPC
binds with SO_REUSEPORT: the kernel shares connections between them) and runs its requests like REST's:
admitted against ``max_queue``, the tensor copied once into a shared-memory body that the replicas of
this node map, the images shared between the replicas by speed.

The messages come from ``oip_messages.proto`` (generated ``oip_messages_pb2``, committed); the service
is registered here by its protocol name with grpc's generic handlers rather than generated stubs,
because the messages' package is autohet's own (see the proto).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from autohet.core.errors import last_line
from autohet.service import oip
from autohet.service import oip_messages_pb2 as pb
from autohet.service.admission import NoReplica
from autohet.service.http_messages import Reply
from autohet.service.requests import BadRequest

__all__ = ["SERVICE", "infer_response", "read_infer_request", "request_images", "serve_grpc"]

log = logging.getLogger("autohet.service")

SERVICE = "inference.GRPCInferenceService"
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED,
          408: grpc.StatusCode.DEADLINE_EXCEEDED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
          503: grpc.StatusCode.UNAVAILABLE}
_CONTENTS = {"FP32": "fp32_contents", "UINT8": "uint_contents"}


_RAW_INPUT_CONTENTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number


def _varint(wire: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        byte = wire[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("a varint longer than 10 bytes")


def read_infer_request(wire: bytes) -> tuple[pb.ModelInferRequest, list[memoryview]]:
    """A ModelInfer request's wire bytes as its message less ``raw_input_contents``, and those tensors as
    views of the wire bytes. Parsed whole by protobuf, a 9.6 MB request cost the server 2.6x the CPU
    (``bench/grpc_ingress.py``, docs/serving.md). The top-level fields are walked (tag, length); every
    field but the tensors is parsed by protobuf as usual. ``BadRequest`` (400) where the bytes are not a
    message."""
    view, head, raws, pos = memoryview(wire), [], [], 0
    try:
        while pos < len(view):
            start = pos
            tag, pos = _varint(view, pos)
            wire_type = tag & 7
            if wire_type == 0:
                _, pos = _varint(view, pos)
            elif wire_type in (1, 5):
                pos += 8 if wire_type == 1 else 4
            elif wire_type == 2:
                size, body = _varint(view, pos)
                pos = body + size
                if tag >> 3 == _RAW_INPUT_CONTENTS and pos <= len(view):
                    raws.append(view[body:pos])
                    continue
            else:  # groups (3, 4) are not in this message; 6 and 7 are no wire type
                raise ValueError(f"wire type {wire_type}")
            if pos > len(view):
                raise ValueError("a field runs past the message's end")
            head.append(view[start:pos])
        return pb.ModelInferRequest.FromString(b"".join(head)), raws
    except (ValueError, IndexError, DecodeError) as exc:
        raise BadRequest(400, f"the ModelInfer request is not a valid protobuf message ({exc}); send it as "
                              "tritonclient.grpc or the protocol's grpc_service.proto writes it") from None


def request_images(request: pb.ModelInferRequest, info: oip.ModelInfo,
                   raws: list[memoryview] | None = None) -> tuple[tuple[int, ...], str, Any]:
    """A ModelInfer request checked against the model: its input's shape, datatype and data (the raw
    bytes, or an array of its typed contents); ``BadRequest`` naming the fix. ``raws``: the tensors'
    bytes where ``read_infer_request`` took them out of the message."""
    info.check(request.model_name, request.model_version)
    names = [t.name for t in request.inputs]
    if names != [oip.INPUT]:
        raise BadRequest(400, f"the request's inputs are {names}; {info.name} takes one input, {oip.INPUT!r}")
    tensor = request.inputs[0]
    shape = oip.tensor_shape(list(tensor.shape), tensor.datatype, info)
    for output in request.outputs:
        if output.name != oip.OUTPUT:
            raise BadRequest(400, f"the request asks for output {output.name!r}; the model has one, {oip.OUTPUT!r}")
        if "classification" in output.parameters:
            raise BadRequest(400, "the classification extension is not served; ask for the logits and take their "
                                  "top k")
    raw = list(request.raw_input_contents) if raws is None else raws
    if len(raw) > 1:
        raise BadRequest(400, f"{len(raw)} raw_input_contents for one input; send one")
    if raw:
        return shape, tensor.datatype, raw[0]
    values = np.asarray(getattr(tensor.contents, _CONTENTS[tensor.datatype]))
    if len(values) != int(np.prod(shape)):
        raise BadRequest(400, f"input {oip.INPUT!r} of shape {list(shape)} needs {int(np.prod(shape))} values in "
                              f"contents.{_CONTENTS[tensor.datatype]} (or raw_input_contents) and has {len(values)}")
    if tensor.datatype == "UINT8" and (values > 255).any():
        raise BadRequest(400, f"input {oip.INPUT!r} is UINT8 and has values over 255; send pixels")
    return shape, tensor.datatype, values.astype(oip.DATATYPES[tensor.datatype]).reshape(shape)


def infer_response(info: oip.ModelInfo, request_id: str, outputs: np.ndarray) -> pb.ModelInferResponse:
    """The logits as raw output contents (FP32, little-endian)."""
    logits = np.ascontiguousarray(outputs, dtype="<f4")
    tensor = pb.ModelInferResponse.InferOutputTensor(name=oip.OUTPUT, datatype="FP32", shape=list(logits.shape))
    return pb.ModelInferResponse(model_name=info.name, model_version=info.version, id=request_id, outputs=[tensor],
                                 raw_output_contents=[logits.tobytes()])


class _Service:
    """The methods, each ``(request, context) -> response`` on the ingress's event loop."""

    def __init__(self, ingress: Any) -> None:
        self.ingress = ingress

    async def _info(self, context: grpc.aio.ServicerContext, name: str | None = None,
                    version: str | None = None) -> oip.ModelInfo:
        info = await self.ingress.model_info()
        if name is not None:
            try:
                info.check(name, version)
            except BadRequest as exc:
                await context.abort(_CODES[exc.status], exc.reason)
        return info

    async def server_live(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.ingress.ready() is None)

    async def model_ready(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        await self._info(context, request.name, request.version)
        return pb.ModelReadyResponse(ready=await self.ingress.ready() is None)

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        from autohet import __version__

        return pb.ServerMetadataResponse(**(await self._info(context)).server_metadata(__version__))

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        meta = (await self._info(context, request.name, request.version)).metadata()
        tensors = {side: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[side]]
                   for side in ("inputs", "outputs")}
        return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                        **tensors)

    async def model_config(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        config = (await self._info(context, request.name, request.version)).config()
        return pb.ModelConfigResponse(config=pb.ModelConfig(
            name=config["name"], platform=config["platform"], max_batch_size=config["max_batch_size"],
            input=[pb.ModelInput(name=t["name"], data_type=t["data_type"], dims=t["dims"]) for t in config["input"]],
            output=[pb.ModelOutput(name=t["name"], data_type=t["data_type"], dims=t["dims"])
                    for t in config["output"]]))

    async def model_infer(self, wire: bytes, context: Any) -> pb.ModelInferResponse:
        ingress = self.ingress
        try:
            request, raws = read_infer_request(wire)
            info = await ingress.model_info()
            shape, datatype, data = request_images(request, info, raws)
        except BadRequest as exc:
            await context.abort(_CODES[exc.status], exc.reason)
        slot = ingress.enter()
        if isinstance(slot, Reply):  # draining, or the queue is full: retry
            await context.abort(grpc.StatusCode.UNAVAILABLE, _reason(slot))
        answered = False
        try:
            if isinstance(data, memoryview):
                shared = slot.body(len(data))  # one copy, into memory the replicas of this node map
                if shared is not None and len(shared) == len(data):
                    shared[:] = data
                    data = shared
                images = oip.binary_tensor(data, shape, datatype)
            else:
                images = data
            outputs = await asyncio.wait_for(ingress.infer(images, slot), ingress.settings.request_timeout_s)
            answered = True
        except BadRequest as exc:
            await context.abort(_CODES.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT), exc.reason)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"not answered within "
                                f"{ingress.settings.request_timeout_s:g} s (autohet serve --request-timeout-s)")
        except NoReplica as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception as exc:  # the runner refused or failed: this request fails, the service stays up
            log.exception("autohet serve: a gRPC request failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"inference failed: {last_line(exc)}")
        finally:
            slot.release(answered=answered)
        return infer_response(info, request.id, outputs)


def _reason(reply: Reply) -> str:
    import json

    return str(json.loads(reply.body).get("error", reply.status))


def handler(ingress: Any) -> grpc.GenericRpcHandler:
    """The protocol's service over ``ingress``, by its protocol name."""
    service = _Service(ingress)
    methods = {"ServerLive": (service.server_live, pb.ServerLiveRequest),
               "ServerReady": (service.server_ready, pb.ServerReadyRequest),
               "ModelReady": (service.model_ready, pb.ModelReadyRequest),
               "ServerMetadata": (service.server_metadata, pb.ServerMetadataRequest),
               "ModelMetadata": (service.model_metadata, pb.ModelMetadataRequest),
               "ModelConfig": (service.model_config, pb.ModelConfigRequest),
               "ModelInfer": (service.model_infer, None)}  # its bytes: read_infer_request
    return grpc.method_handlers_generic_handler(SERVICE, {
        name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=kind.FromString if kind else None,
                                                  response_serializer=lambda m: m.SerializeToString())
        for name, (fn, kind) in methods.items()})


def serve_grpc(ingress: Any, host: str, port: int, max_body: int) -> grpc.aio.Server:
    """The service listening on ``host:port`` from the running event loop (started on a task); several
    processes may listen on one port (SO_REUSEPORT, gRPC's default on Linux)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_body + (1 << 16)),
                                      ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((handler(ingress),))
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(where) == 0:
        raise OSError(f"gRPC cannot listen on {where}")
    asyncio.get_running_loop().create_task(server.start())
    return server
