"""HTTP/1.1 messages as the ingress's server and its application see them: a request's head (framed by
llhttp, through ``httptools``), the reply, the admission of a request on its head, and the shared
listening socket. Kept apart from the connection handling (``listener``) so that the application side
(``admission``, the protocol endpoints) depends on the messages only."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol
from urllib.parse import parse_qsl, unquote

import httptools

__all__ = ["Admitted", "App", "BadHead", "Head", "Reply", "add_header", "bind_shared", "head_of", "parse_head"]

def bind_shared(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` that other processes of this user may bind too (SO_REUSEPORT);
    the kernel spreads new connections over every process listening on it."""
    family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(where)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(frozen=True)
class Head:
    """A request's line and headers (names lower case; repeated ones joined by ", ")."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    version: str  # "1.1" or "1.0"
    length: int | None  # Content-Length; None for a chunked body
    chunked: bool = False
    keep_alive: bool = True  # llhttp's reading of the version and Connection

    @property
    def expects_continue(self) -> bool:
        return self.headers.get("expect", "").lower() == "100-continue"


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self, keep_alive: bool, head_only: bool = False) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}", f"content-type: {self.content_type}",
                 f"content-length: {len(self.body)}", *(f"{k}: {v}" for k, v in self.headers.items())]
        lines.append("connection: keep-alive" if keep_alive else "connection: close")  # said for HTTP/1.0
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else self.body)


@dataclass
class Admitted:
    """A request let in on its head: ``run(body)`` answers it; ``release()`` if its body never comes;
    ``buffer(length)``, where given, is the memory its Content-Length body is read into (None: the
    server's own)."""

    run: Callable[[memoryview], Awaitable[Reply]]
    release: Callable[[], None]
    buffer: Callable[[int], memoryview | None] | None = None


class App(Protocol):
    def begin(self, head: Head) -> Reply | Admitted: ...

    def error(self, status: int, reason: str) -> Reply: ...


class BadHead(ValueError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def head_of(parser: httptools.HttpRequestParser, target: bytes, headers: dict[str, str]) -> Head:
    """The head llhttp parsed, with what it leaves to the server refused (``BadHead``): another HTTP
    version, a transfer coding other than chunked, a target that is not a path."""
    version = parser.get_http_version()
    if version not in ("1.1", "1.0"):
        raise BadHead(400, f"HTTP/{version} is not served; send HTTP/1.1")
    coding = headers.get("transfer-encoding")
    if coding is not None and [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
        raise BadHead(501, f"transfer-encoding {coding!r} is not served; send a Content-Length or chunked")
    try:
        url = httptools.parse_url(target)
    except httptools.HttpParserInvalidURLError:
        raise BadHead(400, f"a malformed request target {target[:80]!r}; send a path") from None
    length = None if coding is not None else int(headers.get("content-length", "0"))  # llhttp checked it
    return Head(parser.get_method().decode("ascii"), unquote((url.path or b"/").decode("latin-1")),
                dict(parse_qsl((url.query or b"").decode("latin-1"), keep_blank_values=True)), headers, version,
                length, coding is not None, parser.should_keep_alive())


class _HeadReader:
    """llhttp's callbacks for ``parse_head``: the one request's line and headers."""

    def __init__(self) -> None:
        self.target, self.headers, self.head = bytearray(), {}, None
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, part: bytes) -> None:
        self.target += part

    def on_header(self, name: bytes, value: bytes) -> None:
        add_header(self.headers, name, value)

    def on_headers_complete(self) -> None:
        self.head = head_of(self.parser, bytes(self.target), self.headers)


def parse_head(raw: bytes) -> Head:
    """A request line and headers (without the blank line ending them) as llhttp reads them; ``BadHead``
    if malformed. For the application's tests: the server parses heads as they come."""
    reader = _HeadReader()
    try:
        reader.parser.feed_data(raw + b"\r\n\r\n")
    except httptools.HttpParserCallbackError as exc:
        if isinstance(exc.__context__, BadHead):
            raise exc.__context__ from None
        raise
    except httptools.HttpParserError as exc:
        raise BadHead(400, f"a malformed request ({exc})") from None
    if reader.head is None:
        raise BadHead(400, "an incomplete request head")
    return reader.head


def add_header(headers: dict[str, str], name: bytes, value: bytes) -> None:
    key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip()
    headers[key] = f"{headers[key]}, {text}" if key in headers else text
