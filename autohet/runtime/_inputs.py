"""What a runner accepts and gives back: batches as numpy arrays or torch tensors, checked in one
line each; and the read-ahead of a stream of batches on its own thread."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from autohet.core.errors import UserError

__all__ = ["Batch", "ReadAhead", "as_batch", "join"]


@dataclass
class Batch:
    """One call's images as a C-contiguous array, float32 model inputs or uint8 pixels (``pixels``),
    and how to hand outputs back: a torch tensor on ``device`` when the input was one (else numpy)."""

    images: np.ndarray
    torch_device: Any = None

    @property
    def pixels(self) -> bool:
        return self.images.dtype == np.uint8

    def give_back(self, outputs: np.ndarray) -> Any:
        if self.torch_device is None:
            return outputs
        import torch

        out = torch.from_numpy(outputs)
        return out if self.torch_device.type == "cpu" else out.to(self.torch_device)


_TAKES = "float32 model inputs or uint8 pixels (scaled by the config's preprocess mean and std)"
_FIX_NP = "pixels: x.astype(numpy.uint8); scaled inputs: x.astype(numpy.float32)"
_FIX_TORCH = "pixels: x.to(torch.uint8); scaled inputs: x.float()"


def as_batch(x: Any, shape: tuple[int, ...], model: str) -> Batch:
    """``x`` checked against the model's input (N, C, H, W), float32 or uint8; UserError naming the fix."""
    device = None
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        import torch

        if x.dtype not in (torch.float32, torch.uint8):
            raise UserError(f"input dtype is {x.dtype}; {model} takes {_TAKES}: convert ({_FIX_TORCH})")
        device = x.device
        x = x.detach().cpu().numpy()
    elif not isinstance(x, np.ndarray):
        raise UserError(f"input is a {type(x).__name__}; pass a numpy array or a torch tensor of shape "
                        f"(N, {', '.join(map(str, shape))})")
    elif x.dtype not in (np.float32, np.uint8):
        raise UserError(f"input dtype is {x.dtype}; {model} takes {_TAKES}: convert ({_FIX_NP})")
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != tuple(shape):
        hint = "add the batch axis (x[None])" if tuple(x.shape) == tuple(shape) else \
            "resize and crop the images to the model's input (autohet run --input does)"
        raise UserError(f"input has shape {tuple(x.shape)}; {model} takes (N, {', '.join(map(str, shape))}): {hint}")
    return Batch(np.ascontiguousarray(x), device)


def join(arrays: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """The arrays one after another into ``out`` (as many rows as they hold together), copied on
    several threads (``host_copy``)."""
    from autohet.executors.base import join_parts

    return join_parts(arrays, out)


_END = object()


class ReadAhead:
    """Batches pulled from ``source`` on a thread of their own, checked (``as_batch``) and held until
    taken, at most ``limit`` bytes ahead (uint8 pixels: four times float32's images), so producing the
    next batches (decoding, a tensor's copy from a GPU) overlaps the current call. An error of the
    source or of a check is raised in order, after the batches before it."""

    def __init__(self, source: Iterable[Any], shape: tuple[int, ...], model: str, limit: int) -> None:
        self.items: deque[Any] = deque()
        self.held = 0
        self.limit = max(1, limit)
        self.stopped = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(iter(source), shape, model), daemon=True,
                                       name="autohet-read-ahead")
        self.thread.start()

    def _read(self, source: Iterator[Any], shape: tuple[int, ...], model: str) -> None:
        try:
            for x in source:
                item: Any = as_batch(x, shape, model)
                with self.cond:
                    self.cond.wait_for(lambda: self.stopped or self.held < self.limit)
                    if self.stopped:
                        return
                    self._put(item, item.images.nbytes)
        except BaseException as exc:  # handed to the consumer, in order
            with self.cond:
                self._put(exc, 0)
            return
        with self.cond:
            self._put(_END, 0)

    def _put(self, item: Any, size: int) -> None:
        self.items.append(item)
        self.held += size
        self.cond.notify_all()

    def take(self, images: int, most_bytes: int | None = None,
             granule: int | None = None) -> tuple[list[Batch], BaseException | None, bool]:
        """At least one batch (waiting for it), then more while they are already here and fewer than
        ``images`` images (and ``most_bytes`` bytes) are taken: (batches, an error that came next,
        whether the source ended). With ``granule`` (the devices' batch), a window past it that would
        end in a part-filled batch ends instead at its last whole batch, where one falls between two
        of its batches; the rest stays for the next window, so that a window's few images past a
        whole batch do not cost a full batch of device work (docs/why.md, runtime/_inputs.py)."""
        taken: list[Batch] = []
        count = size = 0
        with self.cond:
            self.cond.wait_for(lambda: bool(self.items) or self.stopped)
            if self.stopped and not self.items:
                return taken, None, True
            while self.items and (not taken or (count < images and (most_bytes is None or size < most_bytes))):
                if taken and not isinstance(self.items[0], Batch):
                    break  # the end or an error: the next take returns it, after this window
                item = self.items.popleft()
                if item is _END:
                    return taken, None, True
                if isinstance(item, BaseException):
                    return taken, item, True
                taken.append(item)
                count += len(item.images)
                size += item.images.nbytes
                self.held -= item.images.nbytes
            if granule and count > granule and count % granule:
                self._keep_whole_batches(taken, granule)
            self.cond.notify_all()
        return taken, None, False

    def _keep_whole_batches(self, taken: list[Batch], granule: int) -> None:
        """``taken`` cut after its last part that ends a whole batch (if one does); the parts after it
        go back to the front, in order."""
        ends = np.cumsum([len(b.images) for b in taken])
        whole = [k + 1 for k, end in enumerate(ends) if end % granule == 0]
        if not whole or whole[-1] == len(taken):
            return
        for batch in reversed(taken[whole[-1]:]):
            self.items.appendleft(batch)
            self.held += batch.images.nbytes
        del taken[whole[-1]:]

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
