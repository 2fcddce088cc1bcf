"""The ingress's HTTP/1.1 server: requests framed by llhttp (through ``httptools``) in a buffered asyncio
protocol on a socket bound with SO_REUSEPORT, so that several ingress processes listen on one port and the
kernel shares the connections between them. A Content-Length body is read straight into one array of its
declared length, not fed to llhttp (why llhttp, and why not uvicorn: docs/serving.md, "HTTP framing").

What it serves: HTTP/1.1 and 1.0, keep-alive, pipelined requests (each let in on its head and run at
once, up to ``PIPELINE_DEPTH`` per connection, answered in order), ``Content-Length`` and chunked
bodies, ``Expect: 100-continue``. The application sees a request's head first (``App.begin``) and
refuses it there (a body of up to twice the limit is read and dropped before the answer, so a client
still sending reads it, not a broken pipe) or admits it; an admitted request's body is then read and
handed to it whole. A malformed request gets its 4xx (501 for a transfer coding other than chunked)
after the answers before it, and the connection closes.
"""

from __future__ import annotations

import asyncio
import socket

from autohet.core.settings import HEAD_TIMEOUT_S
from autohet.service.connection import Connection
from autohet.service.http_messages import (
    Admitted,
    App,
    BadHead,
    Head,
    Reply,
    bind_shared,
    parse_head,
)

# the messages are re-exported: the server and its callers meet here
__all__ = ["Admitted", "App", "BadHead", "Head", "Listener", "Reply", "bind_shared", "parse_head"]


class Listener:
    """Serves ``app`` on ``sock`` from the running event loop until ``stop``. ``max_body``: the longest
    body read (a chunked one past it gets 413); ``body_timeout_s``: the longest wait for a body's next
    bytes (408); ``head_timeout_s``: the longest a head may take to come whole (408);
    ``keep_alive_s``: how long an idle connection stays open."""

    def __init__(self, app: App, sock: socket.socket, max_body: int, keep_alive_s: float = 5.0,
                 body_timeout_s: float = 60.0, head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self.app, self.max_body = app, max_body
        self.keep_alive_s, self.body_timeout_s, self.head_timeout_s = keep_alive_s, body_timeout_s, head_timeout_s
        self.loop = asyncio.get_running_loop()
        self.connections: set[Connection] = set()
        self.stopping = False
        sock.listen(1024)
        sock.setblocking(False)
        self.sock = sock
        self.ready = self.loop.create_task(self._start())

    async def _start(self) -> None:
        self.server = await self.loop.create_server(lambda: Connection(self), sock=self.sock)

    def stop(self) -> None:
        """No new connections; idle ones close now, the others after their current requests."""
        self.stopping = True
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
