"""HTTP requests of ``autohet serve`` as model inputs, and outputs as response bodies.

Pure functions (no Ray, no web framework), so every refusal is tested without a service: each is a
``BadRequest`` with its HTTP status and a one-line reason naming the fix.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autohet.runtime.images import BadImage, Preprocessing, decode_pixels

__all__ = ["IMAGE_TYPES", "NPY_TYPE", "BadRequest", "check_declared_length", "check_route", "decode_image",
           "media_type", "npy_bytes", "outputs_body", "parse_npy", "parse_query", "predict_body"]

IMAGE_TYPES = ("image/jpeg", "image/png")
NPY_TYPE = "application/x-npy"
PREDICT, HEALTH = "/v1/predict", "/healthz"
NPY_HEAD_LIMIT = 65536 + 16  # numpy's own limit on an .npy header, with its magic and length
_ROUTES = {PREDICT: "POST", HEALTH: "GET"}


@dataclass
class BadRequest(Exception):
    """A request the service refuses: ``status`` (4xx), a one-line ``reason``, extra ``headers``."""

    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.reason


def check_route(method: str, path: str) -> str:
    """``predict`` or ``healthz``; 404 for another path, 405 (with ``Allow``) for another method."""
    allowed = _ROUTES.get(path.rstrip("/") or "/")
    if allowed is None:
        raise BadRequest(404, f"no endpoint {path}; use POST {PREDICT} or GET {HEALTH}")
    if method.upper() != allowed and not (allowed == "GET" and method.upper() == "HEAD"):
        raise BadRequest(405, f"{path} takes {allowed}, not {method.upper()}", {"Allow": allowed})
    return "predict" if allowed == "POST" else "healthz"


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type header, lower case, without parameters; 415 unless served."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in (*IMAGE_TYPES, NPY_TYPE):
        given = f"content type {media!r}" if media else "no content type"
        raise BadRequest(415, f"{given} is not served; send one image as image/jpeg or image/png, or a batch as "
                              f"{NPY_TYPE} (an .npy of N x C x H x W float32 inputs or uint8 pixels)")
    return media


def check_declared_length(content_length: str | None, limit: int) -> None:
    """413 when the declared body is over ``limit`` bytes (before reading it); 400 for a bad header."""
    if content_length is None:
        return
    try:
        length = int(content_length)
    except ValueError:
        raise BadRequest(400, f"Content-Length {content_length!r} is not a number of bytes") from None
    if length > limit:
        raise BadRequest(413, too_large(length, limit))


def too_large(length: int, limit: int) -> str:
    return (f"the body is {length} bytes, over the limit of {limit} (autohet serve --max-body-mb); send fewer "
            "images per request")


def parse_query(query: Mapping[str, str]) -> bool:
    """Whether to add the logits to an image's answer (``?logits=1``); 400 for anything else."""
    unknown = sorted(set(query) - {"logits"})
    if unknown:
        raise BadRequest(400, f"unknown query parameter {unknown[0]!r}; the only one is logits=1")
    value = query.get("logits", "0").strip().lower()
    if value not in ("0", "1", "true", "false", ""):
        raise BadRequest(400, f"logits={value!r}: use logits=1 (add the logits) or logits=0")
    return value in ("1", "true")


def check_body(body: bytes | memoryview, media: str) -> None:
    if not body:
        what = "one image's bytes" if media in IMAGE_TYPES else "an .npy of N x C x H x W float32 or uint8 (numpy.save)"
        raise BadRequest(400, f"the body is empty; send {what}")


def decode_image(body: bytes | memoryview, prep: Preprocessing) -> np.ndarray:
    """One JPEG/PNG body as uint8 pixels (1, C, H, W), resized and cropped as ``run --input`` does: the
    replica's runner scales them (on its GPU where it takes pixels), a quarter of float32's bytes to hand on."""
    check_body(body, IMAGE_TYPES[0])
    try:
        return decode_pixels(io.BytesIO(body), prep, "the body")[None]
    except BadImage as exc:
        reason = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", exc.reason)  # Pillow names the stream
        raise BadRequest(400, f"the body is not a readable image ({reason}); send a whole JPEG or PNG file") from None


def parse_npy(body: bytes | memoryview, shape: tuple[int, ...], model: str) -> np.ndarray:
    """An .npy body as a (N, C, H, W) float32 array (model inputs) or uint8 array (pixels, scaled by the
    config's preprocess mean and std), a view of the body where its byte order is native."""
    check_body(body, NPY_TYPE)
    want = f"(N, {', '.join(map(str, shape))}) float32 inputs or uint8 pixels"
    stream = io.BytesIO(bytes(memoryview(body)[:NPY_HEAD_LIMIT]))  # the header only: the data stays where it is
    try:
        version = np.lib.format.read_magic(stream)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        dims, fortran, dtype = header(stream)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise BadRequest(400, f"the body is not an .npy file ({reason}); write it with numpy.save") from None
    if (dtype.kind, dtype.itemsize) not in (("f", 4), ("u", 1)):
        raise BadRequest(400, f"the .npy holds {dtype}; {model} takes {want}: convert (pixels: x.astype(numpy.uint8); "
                              "scaled inputs: x.astype(numpy.float32))")
    if len(dims) != len(shape) + 1 or tuple(dims[1:]) != tuple(shape):
        raise BadRequest(400, f"the .npy holds shape {tuple(dims)}; {model} takes {want}: resize and crop the "
                              "images to the model's input (or send them one by one as JPEG/PNG)")
    count = int(np.prod(dims))
    offset = stream.tell()
    if len(body) - offset != count * dtype.itemsize:
        raise BadRequest(400, f"the .npy of shape {tuple(dims)} needs {count * dtype.itemsize} bytes of data and has "
                              f"{len(body) - offset}: the body is truncated or has extra bytes")
    array = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(dims, order="F" if fortran else "C")
    if fortran or not dtype.isnative:
        array = np.ascontiguousarray(array, dtype=dtype.newbyteorder("="))
    return array


def npy_bytes(array: np.ndarray) -> bytes:
    """An array as .npy bytes (``Accept: application/x-npy`` answers)."""
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(array), allow_pickle=False)
    return out.getvalue()


def predict_body(logits: np.ndarray, with_logits: bool) -> dict[str, Any]:
    """One image's answer: its top-5 classes with softmax scores (and its logits when asked)."""
    from autohet.runtime.batch import top_classes

    top, scores = top_classes(logits[None])
    body: dict[str, Any] = {"top": [{"index": i, "score": s} for i, s in zip(top[0], scores[0], strict=True)]}
    if with_logits:
        body["logits"] = [float(v) for v in logits]
    return body


def outputs_body(outputs: np.ndarray) -> dict[str, Any]:
    """An .npy batch's answer: every image's logits, in input order."""
    return {"outputs": outputs.tolist()}
