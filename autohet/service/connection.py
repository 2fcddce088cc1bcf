"""One client connection of the ingress's HTTP/1.1 server (``listener``): llhttp is fed what comes, the
requests it frames are decided on their heads by the application, read (a Content-Length body straight
into its own memory) and answered in order; timeouts, pipelining and the lingering close live here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import httptools
import numpy as np

from autohet.core.settings import CHUNK_READ, HEAD_LIMIT, LINGER_S, PIPELINE_DEPTH, TICK_S
from autohet.service.http_messages import Admitted, App, BadHead, Head, Reply, add_header, head_of

__all__ = ["Connection", "Server"]

log = logging.getLogger("autohet.service")


class Server(Protocol):
    """What a connection reads of the server it belongs to."""

    app: App
    loop: asyncio.AbstractEventLoop
    max_body: int
    keep_alive_s: float
    body_timeout_s: float
    head_timeout_s: float
    stopping: bool
    connections: set[Connection]


@dataclass(eq=False)
class _Exchange:
    """One request of a connection, from its first byte to its answer written."""

    started: float
    target: bytearray = field(default_factory=bytearray)
    headers: dict[str, str] = field(default_factory=dict)
    head_bytes: int = 0  # its line's and headers' bytes so far
    fed_after: int = -1  # bytes fed after the read it began in, while its head is incomplete
    head: Head | None = None
    admitted: Admitted | None = None
    body: memoryview | None = None  # a Content-Length body's memory
    chunks: bytearray | None = None  # a chunked body's data so far
    got: int = 0
    complete: bool = False  # all of it read
    reply: Reply | None = None
    close_after: bool = False  # its answer goes before its body is read, or ends the connection
    continued: bool = False  # 100 Continue sent

    def release(self) -> None:
        """Its admission given back where its body will not come."""
        if self.admitted is not None and not self.complete:
            self.admitted.release()
            self.admitted = None


class Connection(asyncio.BufferedProtocol):
    """One client connection: llhttp is fed what comes; ``queue`` holds its requests not yet answered,
    in order; a Content-Length body is read into its own memory (``direct``)."""

    def __init__(self, listener: Server) -> None:
        self.listener, self.loop = listener, listener.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.scratch = bytearray(CHUNK_READ)
        self.queue: deque[_Exchange] = deque()
        self.reading: _Exchange | None = None  # the request whose bytes are being parsed
        self.direct = False  # reads go straight into ``reading``'s body
        self.state = "open"  # open | done (no more requests read) | linger | closed
        self.paused = False
        self.half_closed = False
        self.last = self.loop.time()
        self.timer: asyncio.TimerHandle | None = None
        self.linger_since = 0.0

    # --- asyncio's calls ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.listener.connections.add(self)
        self.timer = self.loop.call_later(TICK_S, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        for exchange in self.queue:
            exchange.release()
        self.state = "closed"
        self.listener.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.direct:
            exchange = self.reading
            assert exchange is not None and exchange.body is not None
            return exchange.body[exchange.got :]
        return memoryview(self.scratch)

    def buffer_updated(self, nbytes: int) -> None:
        self.last = self.loop.time()
        if self.state != "open":  # what comes after the last request, or while closing: dropped
            return
        if self.direct:
            self._read_in_place(nbytes)
            return
        try:
            self.parser.feed_data(memoryview(self.scratch)[:nbytes])
        except httptools.HttpParserUpgrade:  # no protocol switch: answered, then the connection ends
            self.state = "done"
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, BadHead):
                self._fail(exc.__context__.status, exc.__context__.reason)
            else:
                log.error("autohet serve: a request's head failed", exc_info=exc.__context__)
                self._fail(500, "the service failed to take this request")
        except httptools.HttpParserError as exc:
            if self.state == "open":  # else: bytes after a request that ended the connection
                self._fail(400, f"a malformed request ({exc}); send HTTP/1.1")
        self._after_read(nbytes)

    def eof_received(self) -> bool:
        """The client sent all it will: the requests it sent whole still get their answers, then the
        connection closes; one cut off is given up."""
        exchange = self.reading
        if exchange is not None and not exchange.complete:
            exchange.release()
            with contextlib.suppress(ValueError):
                self.queue.remove(exchange)
            self.reading, self.direct = None, False
        if self.queue:
            self.half_closed = True
            if self.state == "open":
                self.state = "done"
            return True
        return False

    # --- llhttp's calls -------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.reading = _Exchange(self.loop.time())
        self.queue.append(self.reading)

    def on_url(self, part: bytes) -> None:
        self._head_part(part)
        assert self.reading is not None
        self.reading.target += part

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_part(name, value)
        assert self.reading is not None
        add_header(self.reading.headers, name, value)

    def on_headers_complete(self) -> None:
        exchange = self.reading
        assert exchange is not None
        exchange.head = head_of(self.parser, bytes(exchange.target), exchange.headers)
        if self.state == "open":  # else: the connection is closing; nothing more is let in
            self._decide(exchange)

    def on_body(self, part: bytes) -> None:
        exchange = self.reading
        assert exchange is not None
        if exchange.body is not None:
            if exchange.got + len(part) > len(exchange.body):
                raise BadHead(400, "the body is longer than its Content-Length")
            exchange.body[exchange.got : exchange.got + len(part)] = part
            exchange.got += len(part)
        elif exchange.chunks is not None:
            size = len(exchange.chunks) + len(part)
            if size > self.listener.max_body:
                from autohet.service.requests import too_large

                exchange.release()
                exchange.chunks = None  # the rest of it is dropped
                self._refuse(exchange, self.listener.app.error(413, too_large(size, self.listener.max_body)),
                             early=True)
                return
            exchange.chunks += part

    def on_message_complete(self) -> None:
        exchange = self.reading
        assert exchange is not None and exchange.head is not None
        if exchange.body is not None and exchange.got != len(exchange.body):  # llhttp counts as we do
            raise BadHead(400, "the body ended before its Content-Length")
        self._complete(exchange)

    # --- a request's parts ----------------------------------------------------------------------------

    def _read_in_place(self, nbytes: int) -> None:
        """A Content-Length body's bytes read straight into its memory. llhttp, which validated the length
        and took the bytes that came with the head, is not fed the rest (it would only count them, and
        httptools would copy each read for it): once the body is whole, the next request starts on a new
        parser, as llhttp would have gone on after it."""
        exchange = self.reading
        assert exchange is not None and exchange.body is not None
        exchange.got += nbytes
        if exchange.got == len(exchange.body):
            self.parser = httptools.HttpRequestParser(self)
            self._complete(exchange)

    def _complete(self, exchange: _Exchange) -> None:
        """A request read whole: run where admitted, answered in turn."""
        assert exchange.head is not None
        exchange.complete = True
        self.reading, self.direct = None, False
        if not exchange.head.keep_alive and self.state == "open":
            self.state = "done"  # HTTP/1.0 or Connection: close: nothing after it is read
        admitted = exchange.admitted
        if admitted is not None:
            body = exchange.body if exchange.body is not None else memoryview(exchange.chunks or b"")
            self.loop.create_task(self._answer(exchange, admitted, body))
        self._flush()

    def _head_part(self, *parts: bytes) -> None:
        exchange = self.reading
        assert exchange is not None
        exchange.head_bytes += sum(len(p) + 2 for p in parts)
        if exchange.head_bytes > HEAD_LIMIT:
            raise BadHead(431, f"the request line and headers are over {HEAD_LIMIT} bytes")

    def _decide(self, exchange: _Exchange) -> None:
        """The application's verdict on a head: refused (answered after its body is read and dropped, or
        at once where that body is not read) or admitted, its body's memory ready."""
        head = exchange.head
        assert head is not None
        try:
            verdict = self.listener.app.begin(head)
        except Exception:  # the application's own bug: this request fails, the connection closes
            log.exception("autohet serve: a request's head failed")
            self._refuse(exchange, self.listener.app.error(500, "the service failed to take this request"), early=True)
            return
        if isinstance(verdict, Reply):
            self._refuse(exchange, verdict)
            return
        if not head.chunked and (head.length or 0) > self.listener.max_body:  # whatever the app said
            from autohet.service.requests import too_large

            verdict.release()
            self._refuse(exchange, self.listener.app.error(413, too_large(head.length or 0, self.listener.max_body)))
            return
        exchange.admitted = verdict
        if head.chunked:
            exchange.chunks = bytearray()
        else:
            length = head.length or 0
            try:
                given = verdict.buffer(length) if verdict.buffer is not None and length else None
            except Exception:  # the app's memory for the body failed: the server's own
                log.exception("autohet serve: a body's buffer failed")
                given = None
            exchange.body = given if given is not None else memoryview(np.empty(length, np.uint8))
        self._continue()

    def _refuse(self, exchange: _Exchange, reply: Reply, early: bool = False) -> None:
        """A refusal, answered once its body (up to twice the limit) is read and dropped, so that the
        client reads it; at once, the connection then closing, where that body is not read."""
        head = exchange.head
        exchange.reply = reply
        if early or head is None or head.chunked or head.expects_continue or \
                (head.length or 0) > 2 * self.listener.max_body:
            exchange.close_after = True
            self._flush()

    def _continue(self) -> None:
        """100 Continue for the first unanswered request, admitted and waiting for its body."""
        exchange = self.queue[0] if self.queue else None
        if exchange is None or exchange.continued or exchange.complete or exchange.admitted is None:
            return
        if exchange.head is not None and exchange.head.expects_continue and self.transport is not None:
            exchange.continued = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _after_read(self, nbytes: int) -> None:
        """After llhttp took a read: where the next read goes, a head that never ends refused, reading
        paused while the connection's requests wait for their answers."""
        exchange = self.reading
        if self.state != "open" or exchange is None:
            self.direct = False
        else:
            if exchange.head is None:  # its head's bytes after the read it began in: a lower bound of its size
                exchange.fed_after = 0 if exchange.fed_after < 0 else exchange.fed_after + nbytes
                if exchange.fed_after > HEAD_LIMIT:
                    self._fail(431, f"the request line and headers are over {HEAD_LIMIT} bytes")
                    return
            self.direct = exchange.admitted is not None and exchange.body is not None and \
                exchange.got < len(exchange.body)
        if len(self.queue) >= PIPELINE_DEPTH and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    async def _answer(self, exchange: _Exchange, admitted: Admitted, body: memoryview) -> None:
        try:
            exchange.reply = await admitted.run(body)
        except Exception:  # the application's own bug: this request fails, the service stays up
            log.exception("autohet serve: a request failed")
            exchange.reply = self.listener.app.error(500, "the service failed to answer this request")
        self._flush()

    def _flush(self) -> None:
        """Writes the answers that are ready, in the order of their requests."""
        while self.queue and self.state != "closed":
            exchange = self.queue[0]
            if exchange.reply is None or not (exchange.complete or exchange.close_after):
                break
            self.queue.popleft()
            head = exchange.head
            keep = head is not None and head.keep_alive and not exchange.close_after and not self.listener.stopping
            if self.transport is None or self.transport.is_closing():
                return
            self.transport.write(exchange.reply.encode(keep, head_only=head is not None and head.method == "HEAD"))
            self.last = self.loop.time()  # the keep-alive wait starts now
            if not keep:
                exchange.release()
                self._linger()
                return
        if self.state == "closed" or self.transport is None:
            return
        self._continue()
        if self.half_closed and not self.queue:
            self.transport.close()
        elif self.paused and len(self.queue) < PIPELINE_DEPTH:
            self.paused = False
            self.transport.resume_reading()

    def _linger(self) -> None:
        """Closes after the answer without losing it: sending done (FIN), what the client still sends read
        and dropped until it closes too or ``LINGER_S`` pass (closing with unread bytes would send a reset,
        and a reset can discard the answer before the client reads it)."""
        assert self.transport is not None
        for exchange in self.queue:  # requests after the last answer: never answered
            exchange.release()
        self.queue.clear()
        self.state, self.linger_since, self.direct = "linger", self.loop.time(), False
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()
        if self.paused:
            self.paused = False
            self.transport.resume_reading()

    def _fail(self, status: int, reason: str) -> None:
        """A request the server cannot read on: its error after the answers before it, then the close."""
        exchange = self.reading
        if exchange is None:
            exchange = _Exchange(self.loop.time())
            self.queue.append(exchange)
        exchange.release()
        self.reading, self.direct = None, False
        if self.state == "open":
            self.state = "done"
        exchange.reply, exchange.close_after = self.listener.app.error(status, reason), True
        self._flush()

    def _tick(self) -> None:
        """Closes an idle connection after ``keep_alive_s``; a head or body whose bytes stop coming gets 408."""
        if self.state == "closed" or self.transport is None:
            return
        now, exchange = self.loop.time(), self.reading
        if self.state == "linger":
            if now - self.linger_since > LINGER_S:
                self.transport.close()
                return
        elif exchange is not None and exchange.head is None:
            if now - exchange.started > self.listener.head_timeout_s:
                self._fail(408, f"the request's head did not come whole within {self.listener.head_timeout_s:g} s; "
                                "send the whole request")
        elif exchange is not None:
            if now - self.last > self.listener.body_timeout_s:
                self._fail(408, f"the request's bytes stopped coming for {now - self.last:.0f} s; send the whole "
                                "request")
        elif not self.queue and now - self.last > self.listener.keep_alive_s:
            self.transport.close()
            return
        self.timer = self.loop.call_later(TICK_S, self._tick)  # a lingering close still ends on time

    def close_if_idle(self) -> None:
        if not self.queue and self.reading is None and self.transport is not None:
            with contextlib.suppress(Exception):
                self.transport.close()
