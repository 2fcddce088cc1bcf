"""A replica's direct channel to the ingress processes of its node: chunks and their answers over a
Unix socket, past Ray and Serve.

Why: Serve's path between an ingress and the GPU's replica took longer per request than the replica's
own work, growing with the load, while the GPU worked half the time: the requests' path, not the
replica, set the rate (docs/why.md, service/channel.py). Here a replica listens on an abstract Unix
socket (no file to clean up; gone with its process) served by a thread and event loop of its own, and
an ingress of the same node sends each chunk there as a small header — where its images lie in shared
memory (``ShmImages``), or the array's bytes after it — and reads the outputs back the same way.
Replicas on other nodes, and a replica that is down (a call through Serve waits for its successor),
keep Serve's path.

A message is a 4-byte little-endian header length, the header (JSON) and ``nbytes`` of payload.
A request: ``{"id", "shm": [path, offset, shape, dtype]}`` or ``{"id", "shape", "dtype", "nbytes"}``
and the array's bytes. An answer: ``{"id", "shape", "dtype", "nbytes", "phases", "span"}`` and the
outputs' bytes, or ``{"id", "error"}``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autohet.core.errors import last_line
from autohet.service.shm import ShmImages

__all__ = ["Answer", "ChannelClient", "ChannelClosed", "ChannelServer", "ReplicaFailed"]

_LENGTH = struct.Struct("<I")
MAX_HEADER = 1 << 16


@dataclass
class Answer:
    """A replica's outputs for a chunk and where the replica's time on it went, in seconds: ``queue``
    before its stream took the chunk (``@serve.batch``'s gathering on Serve's path), ``stream`` in the
    stream (the windows before it, staging, the device, collecting), ``back`` from the outputs being
    ready to the replica returning them. ``span``: when the replica took the chunk and returned it
    (``time.perf_counter``, one clock for the processes of a node)."""

    outputs: np.ndarray
    phases: dict[str, float] = field(default_factory=dict)
    span: tuple[float, float] | None = None


class ChannelClosed(ConnectionError):
    """The replica's end went away (its process died or stopped): the chunk was not answered."""


class ReplicaFailed(RuntimeError):
    """The replica answered a chunk with an error (its runner refused or failed it)."""


async def _read(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    """One message: its header and payload."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_HEADER:
        raise ConnectionError(f"a channel header of {length} bytes")
    header = json.loads(await reader.readexactly(length))
    nbytes = int(header.get("nbytes", 0))
    return header, (await reader.readexactly(nbytes) if nbytes else b"")


def _write(writer: asyncio.StreamWriter, header: dict[str, Any], payload: Any = None) -> None:
    """One message, written whole before any other task's (no await between its parts)."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    writer.write(_LENGTH.pack(len(encoded)) + encoded)
    if payload is not None and header.get("nbytes"):
        writer.write(payload)


class ChannelServer:
    """The replica's end: ``answer(images) -> Answer`` for each request, on a thread and event loop of
    its own (not Serve's), several requests of a connection at once. ``address`` is what ingresses
    connect to; ``close`` stops it."""

    def __init__(self, answer: Callable[[np.ndarray], Awaitable[Answer]]) -> None:
        self.answer = answer
        self.address = f"\0autohet-replica-{os.getpid()}-{secrets.token_hex(6)}"
        self.loop = asyncio.new_event_loop()
        self.connections: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self.started = threading.Event()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="autohet-channel", daemon=True)
        self.thread.start()
        self.started.wait(30)
        if self.failed is not None:
            raise self.failed

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:  # bound here: uvloop (where it is the policy) refuses abstract addresses
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(self.address)
            sock.setblocking(False)
            self.server = self.loop.run_until_complete(asyncio.start_unix_server(self._connection, sock=sock))
        except BaseException as exc:
            self.failed = exc
            self.started.set()
            return
        self.started.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: set[asyncio.Task] = set()
        me = asyncio.current_task()
        assert me is not None
        self.connections[me] = writer
        try:
            while True:
                header, payload = await _read(reader)
                task = asyncio.get_running_loop().create_task(self._one(header, payload, writer))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass  # the ingress went away (or spoke nonsense): its requests' answers have no one to go to
        finally:
            for task in tasks:
                task.cancel()
            writer.close()
            self.connections.pop(me, None)

    async def _one(self, header: dict[str, Any], payload: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            if "shm" in header:
                path, offset, shape, dtype = header["shm"]
                images = ShmImages(path, int(offset), tuple(shape), dtype).open()
            else:
                images = np.frombuffer(payload, dtype=np.dtype(header["dtype"])).reshape(header["shape"])
            answer = await self.answer(images)
        except Exception as exc:  # this request fails, the channel stays
            _write(writer, {"id": header.get("id"), "error": last_line(exc)})
            return
        outputs = np.ascontiguousarray(answer.outputs)
        _write(writer, {"id": header["id"], "shape": list(outputs.shape), "dtype": outputs.dtype.str,
                        "nbytes": outputs.nbytes, "phases": answer.phases, "span": answer.span},
               memoryview(outputs).cast("B"))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    def close(self) -> None:
        """Stops listening and closes the ingresses' connections (their calls in flight fail and are
        sent again), then the thread."""
        async def shut() -> None:
            server = getattr(self, "server", None)
            if server is not None:
                server.close()
            for writer in self.connections.values():
                writer.close()
            if self.connections:
                await asyncio.wait(list(self.connections), timeout=5)

        if not self.thread.is_alive():
            return
        with contextlib.suppress(RuntimeError, TimeoutError, concurrent.futures.TimeoutError):  # loop stopped
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class ChannelClient:
    """An ingress's end of one replica's channel: ``await call(images) -> Answer``;
    connects on first use (again after the replica's end went away) and carries any number of calls
    at once. A call whose connection breaks raises ``ChannelClosed``; an error answer ``ReplicaFailed``."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.writer: asyncio.StreamWriter | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.serial = 0
        self.connecting: asyncio.Lock | None = None
        self.reading: asyncio.Task | None = None

    async def call(self, images: np.ndarray | ShmImages) -> Answer:
        writer = await self._connected()
        pending = self.pending  # this connection's calls
        self.serial += 1
        key = self.serial
        future = asyncio.get_running_loop().create_future()
        pending[key] = future
        if isinstance(images, ShmImages):
            _write(writer, {"id": key, "shm": [images.path, images.offset, list(images.shape), images.dtype]})
        else:
            array = np.ascontiguousarray(images)
            _write(writer, {"id": key, "shape": list(array.shape), "dtype": array.dtype.str, "nbytes": array.nbytes},
                   memoryview(array).cast("B"))
        try:
            await writer.drain()
            return await future
        except OSError as exc:  # ChannelClosed from the reader passes as it is
            if isinstance(exc, ChannelClosed):
                raise
            raise ChannelClosed(f"the replica's channel closed: {exc}") from exc
        finally:
            pending.pop(key, None)

    async def _connected(self) -> asyncio.StreamWriter:
        if self.connecting is None:
            self.connecting = asyncio.Lock()
        async with self.connecting:
            if self.writer is None or self.writer.is_closing():
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:  # connected here: uvloop (Serve's event loop) refuses abstract addresses (EINVAL)
                    sock.connect(self.address)
                    sock.setblocking(False)
                    reader, self.writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
                except BaseException as exc:
                    sock.close()
                    if isinstance(exc, OSError):
                        raise ChannelClosed(f"the replica's channel is not there: {exc}") from exc
                    raise
                self.pending = {}  # a connection's calls fail with it, not those of the next one
                self.reading = asyncio.get_running_loop().create_task(self._answers(reader, self.writer, self.pending))
            return self.writer

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       pending: dict[int, asyncio.Future]) -> None:
        """The answers, each to its call, until the connection ends: then every call still waiting on
        it gets ``ChannelClosed``."""
        reason = "closed"
        try:
            while True:
                header, payload = await _read(reader)
                future = pending.get(header.get("id"))
                if future is None or future.done():
                    continue  # its caller went away (a timeout)
                if "error" in header:
                    future.set_exception(ReplicaFailed(header["error"]))
                else:
                    outputs = np.frombuffer(payload, dtype=np.dtype(header["dtype"])).reshape(header["shape"])
                    span = header.get("span")
                    future.set_result(Answer(outputs, header.get("phases") or {}, tuple(span) if span else None))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            writer.close()
            if self.writer is writer:
                self.writer = None
        for future in list(pending.values()):
            if not future.done():
                future.set_exception(ChannelClosed(f"the replica's channel closed ({reason})"))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
