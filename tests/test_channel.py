"""A replica's direct channel (``autohet.service.channel``), without Ray: real Unix sockets, a server
thread as the replica's, calls from an event loop as an ingress's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from autohet.service.channel import Answer, ChannelClient, ChannelClosed, ChannelServer, ReplicaFailed
from autohet.service.shm import ShmBody


async def _sums(images: np.ndarray) -> Answer:
    """A replica's answer: each image's sum; a NaN is refused as a runner would; the larger a chunk, the
    later it is answered (so answers come back out of order)."""
    if np.isnan(images).any():
        raise ValueError("a NaN reached the device\nsecond line")
    await asyncio.sleep(0.002 * len(images))
    return Answer(images.reshape(len(images), -1).sum(axis=1, keepdims=True).astype(np.float32),
                  {"queue": 0.001, "stream": 0.002}, (1.0, 2.0))


def test_calls_at_once_get_their_own_answers_and_a_failed_one_leaves_the_channel_up():
    server = ChannelServer(_sums)
    client = ChannelClient(server.address)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, 3, 4), dtype=np.float32) for n in (9, 1, 5, 2)]
    pixels = rng.integers(0, 256, (3, 3, 4), dtype=np.uint8)

    async def run():
        answers = await asyncio.gather(*(client.call(x) for x in [*xs, pixels]))
        failed = await asyncio.gather(client.call(np.full((1, 3, 4), np.nan, np.float32)), return_exceptions=True)
        after = await client.call(xs[0])
        client.close()
        return answers, failed[0], after

    try:
        answers, failed, after = asyncio.run(run())
    finally:
        server.close()
    for x, answer in zip([*xs, pixels], answers, strict=True):
        assert np.allclose(answer.outputs[:, 0], x.reshape(len(x), -1).sum(axis=1))
        # exact: Python float arithmetic on the test's own figures
        assert answer.phases == {"queue": 0.001, "stream": 0.002} and answer.span == (1.0, 2.0)
    assert isinstance(failed, ReplicaFailed) and str(failed) == "second line"  # the error's own last line
    assert np.allclose(after.outputs[:, 0], xs[0].reshape(9, -1).sum(axis=1))


def test_images_in_shared_memory_go_as_where_they_lie():
    """An ingress's body under /dev/shm: only its place crosses the socket, the replica maps it."""
    seen: list[bool] = []

    async def answer(images: np.ndarray) -> Answer:
        seen.append(images.base is not None and not images.flags.owndata)
        return await _sums(images)

    x = np.random.default_rng(1).standard_normal((6, 3, 4), dtype=np.float32)
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this machine")
    body = ShmBody(x.nbytes, "test-channel")  # any other failure to make it is a failure of the test
    server = ChannelServer(answer)
    try:
        body.view[:] = x.tobytes()
        images = np.frombuffer(body.view, dtype=np.float32).reshape(x.shape)
        client = ChannelClient(server.address)
        out = asyncio.run(client.call(body.locate(images[2:5]))).outputs
    finally:
        server.close()
        body.remove()
    assert np.allclose(out[:, 0], x[2:5].reshape(3, -1).sum(axis=1)) and seen == [True]


def test_a_replica_that_goes_away_fails_its_calls_and_a_new_one_is_reached_at_its_address():
    """Calls in flight when the replica's end closes get ChannelClosed (the ingress sends them again);
    a call to an address no one listens on too; a successor at its own address answers."""
    async def slow(images: np.ndarray) -> Answer:
        await asyncio.sleep(30)
        raise AssertionError("never answered")

    server = ChannelServer(slow)
    client = ChannelClient(server.address)
    x = np.ones((2, 3, 4), np.float32)

    async def run():
        calls = [asyncio.ensure_future(client.call(x)) for _ in range(3)]
        await asyncio.sleep(0.2)  # the calls are at the replica
        await asyncio.to_thread(server.close)
        failed = await asyncio.gather(*calls, return_exceptions=True)
        gone = await asyncio.gather(client.call(x), return_exceptions=True)
        return failed, gone[0]

    failed, gone = asyncio.run(run())
    assert all(isinstance(f, ChannelClosed) for f in failed), failed
    assert isinstance(gone, ChannelClosed) and "not there" in str(gone)
    successor = ChannelServer(_sums)
    try:
        assert successor.address != server.address
        answer = asyncio.run(ChannelClient(successor.address).call(x))
    finally:
        successor.close()
    assert np.allclose(answer.outputs, 12.0)


def test_both_ends_work_on_uvloop_as_in_serve_processes():
    """Serve runs its replicas and ingresses on uvloop, which refuses abstract Unix addresses given as
    such (EINVAL): both ends make their sockets themselves."""
    uvloop = pytest.importorskip("uvloop")
    policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # the server's loop is made under it
    try:
        server = ChannelServer(_sums)
    finally:
        asyncio.set_event_loop_policy(policy)
    try:
        assert type(server.loop).__module__.startswith("uvloop")
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        answer = uvloop.run(ChannelClient(server.address).call(x))
    finally:
        server.close()
    assert np.allclose(answer.outputs[:, 0], [66.0, 210.0])
