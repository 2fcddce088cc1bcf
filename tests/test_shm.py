"""Request bodies in shared memory (``autohet.service.shm``), without Ray: a chunk located in a body
opens as the same images in another process, the file goes when the request is done, and where
/dev/shm has no room the ingress keeps the body itself."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from autohet.service import shm

pytestmark = pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm on this machine")


def _sum_in_child(ref: shm.ShmImages, conn) -> None:
    conn.send(float(ref.open().astype(np.float64).sum()))


def test_a_chunk_of_a_body_opens_as_the_same_images_in_another_process():
    images = np.random.default_rng(0).integers(0, 256, (10, 3, 8, 8), dtype=np.uint8)
    header = 128
    body = shm.shm_body(header + images.nbytes)
    assert body is not None and os.path.exists(body.path)
    try:
        _chunk_in_another_process(body, images, header)
    finally:
        body.remove()


def _chunk_in_another_process(body: shm.ShmBody, images: np.ndarray, header: int) -> None:
    body.view[header:] = images.tobytes()
    array = np.frombuffer(body.view, np.uint8, offset=header).reshape(images.shape)
    chunk = array[3:7]
    ref = body.locate(chunk)
    assert (ref.offset, ref.shape, ref.dtype) == (header + 3 * 192, (4, 3, 8, 8), "|u1")
    parent, child = multiprocessing.get_context("spawn").Pipe(duplex=False)
    proc = multiprocessing.get_context("spawn").Process(target=_sum_in_child, args=(ref, child))
    proc.start()
    assert parent.recv() == float(images[3:7].astype(np.float64).sum())
    proc.join(30)
    opened = ref.open()
    assert np.array_equal(opened, images[3:7])  # exact: bytes moved, no arithmetic; a live view of the body
    body.remove()
    body.remove()  # twice: no error
    assert not os.path.exists(body.path)
    assert np.array_equal(opened[1:], images[4:7])  # exact: bytes moved, no arithmetic; a mapping outlives the file
    with pytest.raises(ValueError):
        body.locate(np.zeros((2, 3, 8, 8), np.uint8))  # not a view of the body


def test_no_room_in_dev_shm_keeps_the_body_in_the_ingress(monkeypatch):
    monkeypatch.setattr(shm, "SHM_RESERVE", 1 << 62)
    assert shm.shm_body(1000) is None


def test_a_service_removes_its_bodies_and_no_other():
    mine, other = shm.shm_body(10, "s1xaa"), shm.shm_body(10, "s2xbb")
    assert mine is not None and other is not None
    assert shm.remove_service("s1xaa") == 1 and not os.path.exists(mine.path) and os.path.exists(other.path)
    assert shm.remove_service("") == 0
    other.remove()


def test_a_pool_reuses_its_bodies_and_a_replica_its_mappings():
    """A kept body is the next request's (its pages stay allocated); a replica's kept mapping sees the
    new body in the same file, and a new file at the same path is mapped again."""
    pool = shm.BodyPool(keep=1, service="t")
    first = pool.take(1000)
    assert first is not None
    first.view[:] = b"a" * 1000
    ref = first.locate(np.frombuffer(first.view, np.uint8))
    assert bytes(ref.open()[:3]) == b"aaa"
    pool.give_back(first)
    again = pool.take(600)
    assert again is first and len(again.view) == 600  # reused, for a smaller body
    again.view[:] = b"b" * 600
    assert bytes(ref.open()[:3]) == b"bbb"  # the kept mapping reads the new body
    bigger, other = pool.take(5000), pool.take(10)
    assert bigger is not None and other is not None and bigger is not first and other is not first
    pool.give_back(again)
    pool.give_back(other)  # over ``keep``: removed
    assert not os.path.exists(other.path) and os.path.exists(first.path)
    path = first.path
    pool.close()
    assert not os.path.exists(path)
    with open(path, "wb") as f:  # another file where the kept mapping's was
        f.write(b"c" * 1000)
    try:
        assert bytes(ref.open()[:3]) == b"ccc"
    finally:
        os.unlink(path)
    bigger.remove()


def test_pinned_mappings_are_registered_once_and_let_go_only_when_no_image_of_them_is_left():
    """A replica with a GPU page-locks each body it maps (once: a body reused by its ingress is the same
    mapping); a body removed while images of it are still held (a window copying them) stays
    registered until they are dropped, then is unregistered."""
    calls: list[tuple[str, int]] = []

    def register(address: int, size: int) -> bool:
        calls.append(("register", address))
        return True

    shm.pin_mappings(register, lambda address: calls.append(("unregister", address)))
    first, second = shm.ShmBody(4096, "test-pin"), shm.ShmBody(4096, "test-pin")
    try:
        first.view[:] = bytes(range(256)) * 16
        held = shm.ShmImages(first.path, 0, (16, 256), "|u1").open()
        again = shm.ShmImages(first.path, 256, (1, 256), "|u1").open()
        assert [c[0] for c in calls] == ["register"] and int(again[0, 255]) == 255
        first.remove()
        shm.ShmImages(second.path, 0, (1, 16), "|u1").open()  # a new mapping purges the removed body's
        assert [c[0] for c in calls] == ["register", "register"]  # its images are still held: kept
        assert int(held[15, 7]) == 7
        del held, again
        shm.ShmImages(second.path, 0, (1, 16), "|u1").open()
        assert calls[-1] == ("unregister", calls[0][1])  # dropped: unregistered at the next open
    finally:
        shm.pin_mappings(None)
        first.remove()
        second.remove()
        shm._MAPS.clear()  # no fake unregister left for later tests
        shm._RETIRED.clear()
