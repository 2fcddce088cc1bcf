"""The ingress's own HTTP/1.1 server: a buffered asyncio protocol on a socket bound with SO_REUSEPORT,
so that several ingress processes listen on one port and the kernel shares the connections between
them.

Why not uvicorn (nor Serve's HTTP proxy before it): a request's body is read straight into one
array of its declared length (``recv_into``, as much as the socket holds per call), not as 256 KiB
``bytes`` chunks each handed through an ASGI receive, paused and resumed, then joined. On the H100
box, with the rest of the ingress unchanged, its processes used 1.25 CPU seconds per GB of 9.6 MB
bodies against 1.84 through uvicorn, and the service answered 1.14x the images (BENCHMARKS.md §21).

What it speaks: HTTP/1.1 and 1.0, keep-alive, pipelined requests (one answered at a time),
``Content-Length`` and chunked bodies, ``Expect: 100-continue``. The application sees a request's
head first (``App.begin``) and refuses it there (the body, up to twice the limit, is read and
dropped before the answer so a client still sending reads it, not a broken pipe) or admits it; an
admitted request's body is then read and handed to it whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol
from urllib.parse import parse_qsl, unquote

import numpy as np

__all__ = ["Admitted", "App", "Head", "Listener", "Reply", "bind_shared", "parse_head"]

log = logging.getLogger("autohet.service")

HEAD_LIMIT = 64 * 1024  # request line and headers
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
CHUNK_READ = 256 * 1024  # reads of a chunked or dropped body
TICK_S = 0.5  # how often a connection checks its timeouts
LINGER_S = 2.0  # how long a closing connection reads and drops what the client still sends


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

    @property
    def keep_alive(self) -> bool:
        said = self.headers.get("connection", "").lower()
        return "keep-alive" in said if self.version == "1.0" else "close" not in said

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


def parse_head(raw: bytes) -> Head:
    """The request line and headers (without the blank line ending them); ``BadHead`` (400) if malformed."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[0].isalpha():
        raise BadHead(400, f"a malformed request line {lines[0][:80]!r}; send HTTP/1.1")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise BadHead(400, f"a malformed header line {line[:80]!r}")
        key, text = name.decode("latin-1").lower(), value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    chunked = headers.get("transfer-encoding", "").lower().rsplit(",", 1)[-1].strip() == "chunked"
    if "transfer-encoding" in headers and not chunked:
        raise BadHead(501, f"transfer-encoding {headers['transfer-encoding']!r} is not served; send a Content-Length")
    length = None
    if chunked:
        if "content-length" in headers:
            raise BadHead(400, "both Content-Length and a chunked transfer-encoding; send one of them")
    else:
        declared = headers.get("content-length", "0")
        if not (declared.isascii() and declared.isdigit()):
            raise BadHead(400, f"Content-Length {declared!r} is not a number of bytes")
        length = int(declared)
    target, _, query = parts[1].decode("latin-1").partition("?")
    return Head(parts[0].decode("ascii").upper(), unquote(target), dict(parse_qsl(query, keep_blank_values=True)),
                headers, parts[2][5:].decode("ascii"), length, chunked)


class Listener:
    """Serves ``app`` on ``sock`` from the running event loop until ``stop``. ``max_body``: the longest
    body read (a chunked one past it gets 413); ``body_timeout_s``: the longest wait for a request's
    next bytes once it started (408); ``keep_alive_s``: how long an idle connection stays open."""

    def __init__(self, app: App, sock: socket.socket, max_body: int, keep_alive_s: float = 5.0,
                 body_timeout_s: float = 60.0) -> None:
        self.app, self.max_body = app, max_body
        self.keep_alive_s, self.body_timeout_s = keep_alive_s, body_timeout_s
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self.stopping = False
        sock.listen(1024)
        sock.setblocking(False)
        self.sock = sock
        self.ready = self.loop.create_task(self._start())

    async def _start(self) -> None:
        self.server = await self.loop.create_server(lambda: _Connection(self), sock=self.sock)

    def stop(self) -> None:
        """No new connections; idle ones close now, the others after their current request."""
        self.stopping = True
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.close_if_idle()


class _Connection(asyncio.BufferedProtocol):
    """One client connection: reads heads into ``head``, bodies straight into their own array."""

    def __init__(self, listener: Listener) -> None:
        self.listener, self.loop = listener, listener.loop
        self.transport: asyncio.Transport | None = None
        self.head = bytearray(HEAD_LIMIT)
        self.filled = 0  # bytes in ``head``: a head being read, or what a client sent past a body
        self.state = "head"  # head | body | chunked | drain | busy | linger | closed
        self.request: Head | None = None
        self.admitted: Admitted | None = None
        self.refusal: Reply | None = None
        self.body = memoryview(b"")
        self.got = 0
        self.scratch = bytearray()
        self.chunks = bytearray()  # a chunked body's data so far
        self.framing = bytearray()  # a chunked body's bytes not yet parsed
        self.last = self.loop.time()
        self.timer: asyncio.TimerHandle | None = None
        self.linger_since = 0.0
        self.half_closed = False

    # --- asyncio's calls ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.listener.connections.add(self)
        self.timer = self.loop.call_later(TICK_S, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state in ("body", "chunked") and self.admitted is not None:
            self.admitted.release()
        self.state = "closed"
        self.listener.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.state == "body":
            return self.body[self.got :]
        if self.state in ("chunked", "drain", "linger"):
            if len(self.scratch) < CHUNK_READ:
                self.scratch = bytearray(CHUNK_READ)
            view = memoryview(self.scratch)
            return view[: min(CHUNK_READ, self.got)] if self.state == "drain" else view
        return memoryview(self.head)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last = self.loop.time()
        if self.state == "body":
            self.got += nbytes
            if self.got == len(self.body):
                self._run(self.body)
        elif self.state == "chunked":
            self.framing += memoryview(self.scratch)[:nbytes]
            self._parse_chunks()
        elif self.state == "drain":
            self.got -= nbytes
            if self.got == 0:
                self._answer_refusal()
        elif self.state != "linger":  # lingering: read into scratch and dropped, the connection closes
            self.filled += nbytes
            if self.state == "head":
                self._parse_head()
            elif self.filled == len(self.head) and self.transport is not None:
                self.transport.pause_reading()  # pipelined requests fill the head buffer: wait

    def eof_received(self) -> bool:
        """The client sent all it will: the requests it sent (one being answered, pipelined ones) still
        get their answers, then the connection closes."""
        if self.state == "busy" or (self.state == "head" and self.filled):
            self.half_closed = True
            return True
        return False

    # --- a request's parts ----------------------------------------------------------------------------

    def _parse_head(self) -> None:
        end = self.head.find(b"\r\n\r\n", 0, self.filled)
        if end < 0:
            if self.filled == len(self.head):
                self._fail(431, f"the request line and headers are over {HEAD_LIMIT} bytes")
            return
        try:
            request = parse_head(bytes(self.head[:end]))
        except BadHead as exc:
            self._fail(exc.status, exc.reason)
            return
        self._keep(end + 4)
        self.request = request
        try:
            verdict = self.listener.app.begin(request)
        except Exception:  # the application's own bug: this request fails, the connection closes
            log.exception("autohet serve: a request's head failed")
            self._fail(500, "the service failed to take this request")
            return
        if isinstance(verdict, Reply):
            self._refuse(verdict)
            return
        if not request.chunked and (request.length or 0) > self.listener.max_body:  # whatever the app said
            from autohet.service.requests import too_large

            verdict.release()
            self._refuse(self.listener.app.error(413, too_large(request.length or 0, self.listener.max_body)))
            return
        self.admitted = verdict
        if request.chunked:
            self.chunks, self.framing = bytearray(), bytearray(self._take(len(self.head)))
            self.state = "chunked"
            self._continue()
            self._parse_chunks()
            return
        length = request.length or 0
        try:
            given = verdict.buffer(length) if verdict.buffer is not None and length else None
        except Exception:  # the app's memory for the body failed: the server's own
            log.exception("autohet serve: a body's buffer failed")
            given = None
        self.body = given if given is not None else memoryview(np.empty(length, np.uint8))
        first = self._take(len(self.body))
        self.body[: len(first)] = first
        self.got = len(first)
        if self.got == len(self.body):
            self._run(self.body)
        else:
            self.state = "body"
            self._continue()

    def _keep(self, start: int) -> None:
        """Drops ``head[:start]``: what follows (a body's first bytes, the next request) moves to the front."""
        rest = self.filled - start
        self.head[:rest] = self.head[start : self.filled]
        self.filled = rest

    def _take(self, most: int) -> bytes:
        """Up to ``most`` bytes from the front of ``head`` (a body's first bytes read with its head)."""
        taken = bytes(self.head[: min(most, self.filled)])
        self._keep(len(taken))
        return taken

    def _continue(self) -> None:
        if self.request is not None and self.request.expects_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refuse(self, reply: Reply) -> None:
        """A refusal: its body (up to twice the limit) read and dropped first, so the client reads it."""
        request = self.request
        assert request is not None
        self.refusal = reply
        if request.chunked or request.expects_continue or (request.length or 0) > 2 * self.listener.max_body:
            self._write(reply, keep_alive=False, head_only=request.method == "HEAD")  # not read: then closed
            return
        self.got = (request.length or 0) - len(self._take(request.length or 0))
        if self.got == 0:
            self._answer_refusal()
        else:
            self.state = "drain"

    def _answer_refusal(self) -> None:
        assert self.refusal is not None and self.request is not None
        self._write(self.refusal, keep_alive=self.request.keep_alive, head_only=self.request.method == "HEAD")
        self.refusal = None
        self._next()

    def _parse_chunks(self) -> None:
        """Chunk sizes and data out of ``framing`` into ``chunks``; the whole body run once the last came."""
        framing = self.framing
        while True:
            line_end = framing.find(b"\r\n")
            if line_end < 0:
                if len(framing) > 1024:
                    self._fail(400, "a malformed chunk size line in a chunked body")
                return
            size_text = bytes(framing[:line_end]).split(b";", 1)[0].strip()
            if not _HEX.fullmatch(size_text):
                self._fail(400, f"a malformed chunk size {size_text[:20]!r} in a chunked body")
                return
            size = int(size_text, 16)
            if size == 0:  # the last chunk, then trailers up to an empty line
                end = framing.find(b"\r\n\r\n", line_end)
                if end < 0:
                    if len(framing) > HEAD_LIMIT:
                        self._fail(431, f"a chunked body's trailers are over {HEAD_LIMIT} bytes")
                    return
                rest = bytes(framing[end + 4 :])
                self.head[: len(rest)] = rest
                self.filled = len(rest)
                self._run(memoryview(self.chunks))
                return
            if len(self.chunks) + size > self.listener.max_body:
                from autohet.service.requests import too_large

                assert self.admitted is not None
                self.admitted.release()
                self.admitted = None
                self._write(self.listener.app.error(413, too_large(len(self.chunks) + size, self.listener.max_body)),
                            keep_alive=False)
                return
            if len(framing) < line_end + 2 + size + 2:
                return
            self.chunks += framing[line_end + 2 : line_end + 2 + size]
            del framing[: line_end + 2 + size + 2]

    def _run(self, body: memoryview) -> None:
        """The admitted request's answer, on a task; bytes of pipelined requests are read into ``head``
        meanwhile until it is full, then reading pauses until the answer is written."""
        self.state = "busy"
        if self.filled >= len(self.head) and self.transport is not None:
            self.transport.pause_reading()
        admitted, request = self.admitted, self.request
        assert admitted is not None and request is not None
        self.admitted = None
        self.loop.create_task(self._answer(admitted, request, body))

    async def _answer(self, admitted: Admitted, request: Head, body: memoryview) -> None:
        try:
            reply = await admitted.run(body)
        except Exception:  # the application's own bug: this request fails, the service stays up
            log.exception("autohet serve: a request failed")
            reply = self.listener.app.error(500, "the service failed to answer this request")
        if self.state == "closed":
            return
        self._write(reply, keep_alive=request.keep_alive, head_only=request.method == "HEAD")
        self._next()

    def _next(self) -> None:
        """The connection's next request (already in ``head`` if pipelined), or its close."""
        if self.state in ("closed", "linger") or self.transport is None or self.transport.is_closing():
            return
        if self.listener.stopping or (self.half_closed and not self.filled):
            self.transport.close()
            return
        self.state, self.request, self.body, self.got = "head", None, memoryview(b""), 0
        self.last = self.loop.time()  # the keep-alive wait starts now, not when the request's bytes came
        self.transport.resume_reading()
        if self.filled:  # a pipelined request: parsed on the loop's next turn (no recursion per request)
            self.loop.call_soon(self._parse_pipelined)

    def _parse_pipelined(self) -> None:
        if self.state == "head" and self.filled:
            self._parse_head()

    def _write(self, reply: Reply, keep_alive: bool, head_only: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        keep = keep_alive and not self.listener.stopping
        self.transport.write(reply.encode(keep, head_only))
        if not keep:
            self._linger()

    def _linger(self) -> None:
        """Closes after the answer without losing it: sending done (FIN), what the client still sends read
        and dropped until it closes too or ``LINGER_S`` pass (closing with unread bytes would send a reset,
        and a reset can discard the answer before the client reads it)."""
        assert self.transport is not None
        self.state, self.linger_since = "linger", self.loop.time()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()
        self.transport.resume_reading()

    def _fail(self, status: int, reason: str) -> None:
        """A request the server cannot read on: its error, and the connection closes."""
        if self.admitted is not None:
            self.admitted.release()
            self.admitted = None
        head_only = self.request is not None and self.request.method == "HEAD"
        self._write(self.listener.app.error(status, reason), keep_alive=False, head_only=head_only)

    def _tick(self) -> None:
        """Closes an idle connection after ``keep_alive_s``; a request whose bytes stop coming gets 408."""
        if self.state == "closed" or self.transport is None:
            return
        idle = self.loop.time() - self.last
        waiting = self.state == "head" and self.filled == 0  # between requests: keep-alive's limit only
        if waiting and idle > self.listener.keep_alive_s:
            self.transport.close()
            return
        if self.state == "linger":
            if self.loop.time() - self.linger_since > LINGER_S:
                self.transport.close()
                return
        elif self.state != "busy" and not waiting and idle > self.listener.body_timeout_s:
            self._fail(408, f"the request's bytes stopped coming for {idle:.0f} s; send the whole request")
        self.timer = self.loop.call_later(TICK_S, self._tick)  # a lingering close still ends on time

    def close_if_idle(self) -> None:
        if self.state == "head" and self.filled == 0 and self.transport is not None:
            with contextlib.suppress(Exception):
                self.transport.close()
