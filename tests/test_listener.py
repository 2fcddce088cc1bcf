"""The ingress's HTTP/1.1 server (``autohet.service.listener``) against real sockets, without Ray: bodies
whole and intact (Content-Length, chunked, 100-continue), keep-alive and pipelining, refusals read
past, and every way a request can fail to arrive answered or released."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from autohet.service.listener import Admitted, BadHead, Head, Listener, Reply, bind_shared, parse_head

MAX_BODY = 4 << 20


class EchoApp:
    """Answers a body's length and digest; ``/refuse`` is refused on its head, ``/slow`` answers late."""

    def __init__(self) -> None:
        self.admitted = 0
        self.released = 0
        self.heads: list[Head] = []

    def begin(self, head: Head) -> Reply | Admitted:
        self.heads.append(head)
        if head.path == "/refuse":
            return Reply(503, b'{"error": "refused"}', headers={"Retry-After": "1"})
        self.admitted += 1
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self.released += 1

        async def run(body: memoryview) -> Reply:
            try:
                if head.path == "/slow":
                    await asyncio.sleep(0.3)
                answer = {"length": len(body), "sha": hashlib.sha256(body).hexdigest(), "query": head.query,
                          "method": head.method}
                return Reply(200, json.dumps(answer).encode())
            finally:
                release()

        return Admitted(run, release)

    def error(self, status: int, reason: str) -> Reply:
        return Reply(status, json.dumps({"error": reason}).encode())


@pytest.fixture
def served() -> Iterator[tuple[EchoApp, int]]:
    app, loop = EchoApp(), asyncio.new_event_loop()
    sock = bind_shared("127.0.0.1", 0)
    port = sock.getsockname()[1]
    started = threading.Event()
    holder: dict[str, Listener] = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            holder["listener"] = Listener(app, sock, MAX_BODY, keep_alive_s=2.0, body_timeout_s=1.0,
                                           head_timeout_s=1.5)
            await holder["listener"].ready
            started.set()

        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield app, port
    loop.call_soon_threadsafe(holder["listener"].stop)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    sock.close()


def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    _readers.pop(s.fileno(), None)
    return s


def _read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer off a raw socket (status, headers, body by its Content-Length); what follows it stays
    in the socket's reader for the next call."""
    reader = _readers.setdefault(s.fileno(), s.makefile("rb"))
    status_line = reader.readline()
    if not status_line:
        raise ConnectionError("closed")
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.lower()] = value.strip()
    return int(status_line.split()[1]), headers, reader.read(int(headers.get("content-length", 0)))


_readers: dict[int, object] = {}


def test_bodies_arrive_whole_on_one_kept_alive_connection(served):
    app, port = served
    rng = np.random.default_rng(0)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for size in (3_000_001, 0, 17, 1_234_567):
        body = rng.integers(0, 255, size, dtype=np.uint8).tobytes()
        connection.request("POST", "/v1/predict?logits=1", body=body)
        answer = json.loads(connection.getresponse().read())
        assert answer == {"length": size, "sha": hashlib.sha256(body).hexdigest(), "query": {"logits": "1"},
                          "method": "POST"}
    assert app.admitted == app.released == 4
    assert len({id(h) for h in app.heads}) == 4 and connection.sock is not None  # one connection throughout


def test_a_chunked_body_is_joined_and_one_over_the_limit_gets_413(served):
    app, port = served
    pieces = [b"a" * 70_000, b"", b"b" * 5, b"c" * 300_000]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/x", body=iter([p for p in pieces if p]), encode_chunked=True)
    answer = json.loads(connection.getresponse().read())
    assert answer["length"] == 370_005 and answer["sha"] == hashlib.sha256(b"".join(pieces)).hexdigest()
    connection.request("POST", "/x", body=iter([b"z" * (1 << 20)] * 5), encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 413 and "over the limit" in json.loads(response.read())["error"]
    assert app.admitted == app.released == 2


def test_expect_100_continue_and_pipelined_requests(served):
    _, port = served
    with _raw(port) as s:
        s.sendall(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
        assert _read_answer(s)[0] == 100
        s.sendall(b"hello")
        status, _, body = _read_answer(s)
        assert status == 200 and json.loads(body)["sha"] == hashlib.sha256(b"hello").hexdigest()
        s.sendall(b"GET /slow?n=1 HTTP/1.1\r\n\r\nGET /b?n=2 HTTP/1.1\r\n\r\nHEAD /c HTTP/1.1\r\n\r\n")
        first, second = _read_answer(s), _read_answer(s)
        assert [json.loads(a[2])["query"] for a in (first, second)] == [{"n": "1"}, {"n": "2"}]  # in order
        reader = _readers[s.fileno()]
        head = b"".join(iter(reader.readline, b"\r\n"))
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: " in head  # HEAD: the headers only
        s.sendall(b"GET /after HTTP/1.1\r\n\r\n")
        assert json.loads(_read_answer(s)[2])["method"] == "GET"  # no HEAD body came before this answer


def test_a_refused_body_is_read_past_and_the_connection_goes_on(served):
    """A refusal on the head: the client sending a 1 MB body reads the 503, not a broken pipe, and
    the connection carries the next request."""
    app, port = served
    with _raw(port) as s:
        s.sendall(b"POST /refuse HTTP/1.1\r\ncontent-length: 1000000\r\n\r\n" + b"x" * 1_000_000)
        status, headers, body = _read_answer(s)
        assert status == 503 and headers["retry-after"] == "1" and json.loads(body)["error"] == "refused"
        s.sendall(b"POST /ok HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc")
        assert _read_answer(s)[0] == 200
    assert app.admitted == app.released == 1


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n"  # a second request hidden in a malformed one's body

MALFORMED = {
    "content-length, then transfer-encoding": (b"POST /x HTTP/1.1\r\ncontent-length: 5\r\ntransfer-encoding: chunked"
                                               b"\r\n\r\n0\r\n\r\n" + SMUGGLED, {400}),
    "transfer-encoding, then content-length": (b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 40"
                                               b"\r\n\r\n0\r\n\r\n" + SMUGGLED, {400}),
    "two different content-lengths": (b"POST /x HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 42\r\n\r\nhello"
                                      + SMUGGLED, {400}),
    "a list of content-lengths": (b"POST /x HTTP/1.1\r\ncontent-length: 5, 42\r\n\r\nhello" + SMUGGLED, {400}),
    "a negative content-length": (b"POST /x HTTP/1.1\r\ncontent-length: -5\r\n\r\nhello" + SMUGGLED, {400}),
    "a non-numeric content-length": (b"POST /x HTTP/1.1\r\ncontent-length: lots\r\n\r\n" + SMUGGLED, {400}),
    "a superscript content-length": ("POST /x HTTP/1.1\r\ncontent-length: \u00b2\r\n\r\n".encode("latin-1"), {400}),
    "an unknown transfer coding": (b"POST /x HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n" + SMUGGLED, {400, 501}),
    "a coding before chunked": (b"POST /x HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
                                {400, 501}),
    "chunked twice": (b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
                      + SMUGGLED, {400, 501}),
    "a bad chunk size": (b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n" + SMUGGLED,
                         {400}),
    "a negative chunk size": (b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n-100000\r\nabc\r\n", {400}),
    "a 0x chunk size": (b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0x10\r\nabc\r\n", {400}),
    "an overflowing chunk size": (b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n" + b"f" * 20 + b"\r\nab\r\n",
                                  {400}),
    "a 100 KB header line": (b"GET /x HTTP/1.1\r\nx-big: " + b"y" * 100_000 + b"\r\n\r\n" + SMUGGLED, {431}),
    "70 KB of headers": (b"GET /x HTTP/1.1\r\n" + b"".join(b"x-%d: %s\r\n" % (k, b"y" * 990) for k in range(70))
                         + b"\r\n", {431}),
    "bare LF line ends": (b"GET /x HTTP/1.1\nhost: a\n\n" + SMUGGLED, {400}),
    "a bare LF ending the head": (b"GET /x HTTP/1.1\r\nhost: a\r\n\n" + SMUGGLED, {400}),
    "obsolete line folding": (b"GET /x HTTP/1.1\r\nx-a: 1\r\n 2\r\n\r\n" + SMUGGLED, {400}),
    "a space before a header's colon": (b"GET /x HTTP/1.1\r\ncontent-length : 5\r\n\r\nhello" + SMUGGLED, {400}),
    "not a request": (b"NOT A REQUEST\r\n\r\n", {400}),
    "a lower-case method": (b"get /x HTTP/1.1\r\n\r\n", {400}),
    "HTTP/2.0": (b"GET /x HTTP/2.0\r\n\r\n", {400}),
    "HTTP/0.9": (b"GET /x\r\n\r\n", {400}),
}


def _answers_until_closed(s: socket.socket) -> list[tuple[int, dict[str, str], bytes]]:
    answers = []
    while True:
        try:
            answers.append(_read_answer(s))
        except (ConnectionError, ValueError, IndexError):
            return answers


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_request_gets_one_4xx_and_the_connection_closes(served, case):
    """Each malformed or hostile request: one 4xx (501 for a transfer coding the server does not know)
    with a one-line reason, or a closed connection; never a 5xx, never an answer to a request smuggled
    behind it; and the server answers a good request after it."""
    app, port = served
    request_bytes, statuses = MALFORMED[case]
    with _raw(port) as s:
        s.sendall(request_bytes)
        answers = _answers_until_closed(s)  # the server closes (each read times out after 10 s otherwise)
    assert len(answers) <= 1, [a[0] for a in answers]  # nothing smuggled answered
    if answers:
        status, headers, body = answers[0]
        assert status in statuses and headers["connection"] == "close", (status, body)
        reason = json.loads(body)["error"]
        assert reason and len(reason.splitlines()) == 1
    assert all(h.path != "/smuggled" for h in app.heads)
    with _raw(port) as s:
        s.sendall(b"POST /ok HTTP/1.1\r\ncontent-length: 2\r\n\r\nok")
        assert _read_answer(s)[0] == 200
    assert app.admitted == app.released


def test_slowloris_connections_get_408_while_good_requests_are_answered(served):
    """60 connections trickling a head's lines one by one never finish it: each gets 408 once the head
    timeout passes (or is closed), and requests on other connections are answered meanwhile."""
    _, port = served
    slow = [_raw(port) for _ in range(60)]
    try:
        for s in slow:
            s.sendall(b"GET /slow-loris HTTP/1.1\r\n")
        answered = 0
        for k in range(4):  # the timeout is 1.5 s: these go on while every slow head is still incomplete
            for s in slow:
                s.sendall(b"x-%d: y\r\n" % k)
            with _raw(port) as good:
                good.sendall(b"GET /good HTTP/1.1\r\n\r\n")
                answered += _read_answer(good)[0] == 200
            time.sleep(0.1)
        assert answered == 4
        for s in slow:
            answers = _answers_until_closed(s)
            assert [a[0] for a in answers] in ([408], []), answers
    finally:
        for s in slow:
            s.close()


def test_a_declared_body_over_the_limit_gets_413_whatever_the_app_said(served):
    app, port = served
    with _raw(port) as s:
        s.sendall(f"POST /x HTTP/1.1\r\ncontent-length: {MAX_BODY + 1}\r\nexpect: 100-continue\r\n\r\n".encode())
        status, headers, body = _read_answer(s)
        assert status == 413 and headers["connection"] == "close" and "over the limit" in json.loads(body)["error"]
    assert app.admitted == app.released == 1  # admitted by the app, released by the listener


def test_a_client_that_half_closes_gets_its_answer_and_http_1_0_is_closed_after_one(served):
    app, port = served
    with _raw(port) as s:
        s.sendall(b"POST /slow HTTP/1.1\r\ncontent-length: 2\r\n\r\nhi")
        s.shutdown(socket.SHUT_WR)  # nothing more to send; the answer still comes
        status, _, body = _read_answer(s)
        assert status == 200 and json.loads(body)["length"] == 2
    for path in ("/refuse", "/ok"):
        with _raw(port) as s:
            s.sendall(f"POST {path} HTTP/1.0\r\ncontent-length: 3\r\n\r\nabc".encode())
            status, headers, _ = _read_answer(s)
            assert status in (200, 503) and headers["connection"] == "close"
            assert _readers[s.fileno()].read(10) == b""


def test_many_pipelined_requests_and_a_half_close_after_them_are_all_answered(served):
    """Pipelined requests are parsed one per turn of the loop (no recursion per request), refused ones
    included; a client that half-closes after sending them still gets every answer."""
    _, port = served
    with _raw(port) as s:
        s.sendall(b"GET /refuse HTTP/1.1\r\n\r\n" * 300 + b"GET /last HTTP/1.1\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        statuses = [_read_answer(s)[0] for _ in range(301)]
        assert statuses == [503] * 300 + [200]
        assert _readers[s.fileno()].read(10) == b""


def test_a_refused_head_request_gets_no_body_and_http_1_0_keep_alive_is_said(served):
    _, port = served
    with _raw(port) as s:
        s.sendall(b"HEAD /refuse HTTP/1.1\r\n\r\nGET /ok HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
        reader = _readers.setdefault(s.fileno(), s.makefile("rb"))
        head = b"".join(iter(reader.readline, b"\r\n"))
        assert head.startswith(b"HTTP/1.1 503") and b"content-length: " in head  # the headers, no body
        status, headers, _ = _read_answer(s)
        assert status == 200 and headers["connection"] == "keep-alive"


def test_a_body_that_stops_coming_gets_408_and_one_cut_off_is_released(served):
    app, port = served
    with _raw(port) as s:
        s.sendall(b"POST /x HTTP/1.1\r\ncontent-length: 100\r\n\r\nonly some")
        started = time.perf_counter()
        status, _, body = _read_answer(s)
        assert status == 408 and "stopped coming" in json.loads(body)["error"]
        assert time.perf_counter() - started < 5
        assert _readers[s.fileno()].read(10) == b""  # and the connection is closed after it, not left open
        assert time.perf_counter() - started < 8
    with _raw(port) as s:
        s.sendall(b"POST /x HTTP/1.1\r\ncontent-length: 100\r\n\r\nonly some")
        time.sleep(0.2)
    deadline = time.perf_counter() + 5
    while app.released < 2 and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert app.admitted == app.released == 2  # neither request is left counted in flight


def test_parse_head_reads_the_line_the_headers_and_the_body_framing():
    head = parse_head(b"POST /v1/predict?logits=1&x=a%20b HTTP/1.0\r\nContent-Type: image/png\r\n"
                      b"content-length: 12\r\nX-A: 1\r\nx-a: 2\r\nconnection: keep-alive")
    assert (head.method, head.path, head.version) == ("POST", "/v1/predict", "1.0")
    assert (head.length, head.chunked) == (12, False)
    assert head.query == {"logits": "1", "x": "a b"} and head.headers["x-a"] == "1, 2" and head.keep_alive
    assert not parse_head(b"GET / HTTP/1.0").keep_alive and parse_head(b"GET / HTTP/1.1").keep_alive
    assert not parse_head(b"GET / HTTP/1.1\r\nconnection: close").keep_alive
    assert parse_head(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked").chunked
    with pytest.raises(BadHead) as info:
        parse_head(b"POST / HTTP/1.1\r\ntransfer-encoding: gzip")
    assert info.value.status == 501 and "send a Content-Length" in info.value.reason
