"""The ingress's own HTTP server: uvicorn on an ingress process's event loop, on a socket bound with
SO_REUSEPORT, so that several ingress processes listen on one port and the kernel shares the
connections between them.

Why not Serve's HTTP: its proxy (one process per node) hands a request's body to the ingress as Ray
calls of body chunks. On the H100 box it carried 646-703 MB/s of 9.6 MB bodies to a deployment that
only counted them, one process reading its bodies itself 1.9 GB/s (BENCHMARKS.md §20), and a tuned GPU
config takes 10 GB/s of uint8 pixels at full speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

__all__ = ["Listener", "bind_shared"]

AsgiApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


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


class Listener:
    """Serves ``app`` on ``sock`` from the running event loop until ``stop``."""

    def __init__(self, app: AsgiApp, sock: socket.socket, keep_alive_s: float = 5.0) -> None:
        import uvicorn

        class QuietServer(uvicorn.Server):
            """Leaves the process's signal handlers alone (they are Ray's: the driver stops the service)."""

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        config = uvicorn.Config(app, interface="asgi3", lifespan="off", ws="none", access_log=False, log_config=None,
                                log_level=None, proxy_headers=False, timeout_keep_alive=int(keep_alive_s))
        self.sock = sock
        self.server = QuietServer(config)
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))

    def stop(self) -> None:
        """No new connections; open ones end after their current request."""
        self.server.should_exit = True
