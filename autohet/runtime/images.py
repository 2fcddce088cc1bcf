"""Image files to model inputs: listing a folder, decoding and preprocessing, on cores the config
leaves free.

Preprocessing is what torchvision's ImageNet weights expect, for the model's input size: the
shorter side resized to 256/224 of the crop (256 for a 224 model), a centre crop of the model's
input size, values scaled to [0, 1] and normalised by the ImageNet mean and std. Grayscale images
become RGB for a 3-channel model and colour images L for a 1-channel one (lenet), normalised by the
ImageNet mean and std averaged over the channels. A config's ``preprocess`` block overrides any of
resize, mean, std and interpolation (``autohet.config.Preprocess``).
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from autohet.config import Preprocess
from autohet.errors import UserError

__all__ = ["IMAGE_SUFFIXES", "BadImage", "Decoders", "Preprocessing", "decode", "list_images", "preprocessing_for"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RESIZE_PER_CROP = 256 / 224  # torchvision's ImageNet evaluation: resize 256, crop 224


class BadImage(UserError):
    """A file that is not a readable image (corrupt, truncated, not an image at all)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} is not a readable image ({reason}); remove it or pass --skip-bad")
        self.path, self.reason = path, reason


@dataclass(frozen=True)
class Preprocessing:
    """The preprocessing of one model: its channels and crop (C, H, W), the shorter side's size
    before the crop, per-channel mean and std, and the resampling filter."""

    shape: tuple[int, int, int]
    resize: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str

    def to_dict(self) -> dict[str, object]:
        return {"shape": list(self.shape), "resize": self.resize, "mean": list(self.mean), "std": list(self.std),
                "interpolation": self.interpolation}


def preprocessing_for(shape: Sequence[int], given: Preprocess | None, where: str) -> Preprocessing:
    """The defaults for a model of input ``shape`` (C, H, W), with what the config's block gives."""
    channels, height, width = (int(v) for v in shape)
    given = given or Preprocess()
    resize = given.resize or round(min(height, width) * RESIZE_PER_CROP)
    if resize < min(height, width):
        raise UserError(f"{where}: preprocess.resize {resize} is smaller than the model's {height}x{width} crop; "
                        f"use at least {min(height, width)}")
    stats = {}
    for key, default in (("mean", IMAGENET_MEAN), ("std", IMAGENET_STD)):
        value = getattr(given, key)
        if value is None:
            if channels not in (1, 3):
                raise UserError(f"{where}: a model of {channels} channels has no default {key}; give "
                                f"preprocess.{key} (one value per channel)")
            value = default if channels == 3 else (round(sum(default) / 3, 4),)
        if len(value) == 1:
            value = tuple(value) * channels
        if len(value) != channels:
            raise UserError(f"{where}: preprocess.{key} has {len(value)} values; the model takes {channels} channels")
        stats[key] = tuple(value)
    return Preprocessing((channels, height, width), resize, stats["mean"], stats["std"], given.interpolation)


def decode(path: str | Path | BinaryIO, prep: Preprocessing, name: str | None = None) -> np.ndarray:
    """One image file (or an open binary stream of one, ``name`` in errors) as a model input (C, H, W)
    float32; BadImage when it cannot be read whole."""
    from PIL import Image, UnidentifiedImageError

    channels, height, width = prep.shape
    try:
        with Image.open(path) as image:
            image.load()  # the whole file now: a truncated one fails here, not half-decoded later
            image = image.convert("RGB" if channels == 3 else "L")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadImage(name or str(path), reason[:160]) from None
    size = _resized(image.size, prep.resize, width, height)
    filters = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
               "bicubic": Image.Resampling.BICUBIC}
    image = image.resize(size, filters[prep.interpolation])
    left, top = int(round((size[0] - width) / 2.0)), int(round((size[1] - height) / 2.0))  # torchvision's centre
    image = image.crop((left, top, left + width, top + height))
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    pixels = pixels.transpose(2, 0, 1) if channels == 3 else pixels[None]
    mean = np.asarray(prep.mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(prep.std, dtype=np.float32).reshape(-1, 1, 1)
    return np.ascontiguousarray((pixels - mean) / std, dtype=np.float32)


def _resized(size: tuple[int, int], resize: int, width: int, height: int) -> tuple[int, int]:
    """(w, h) with the shorter side ``resize`` and the longer in proportion, truncated (torchvision's
    Resize); scaled up further when a non-square crop would not fit."""
    w, h = size
    if w <= h:
        out = (resize, int(resize * h / w))
    else:
        out = (int(resize * w / h), resize)
    if out[0] < width or out[1] < height:
        scale = max(width / w, height / h)
        out = (max(width, math.ceil(w * scale)), max(height, math.ceil(h * scale)))
    return out


def list_images(folder: Path) -> list[Path]:
    """JPEG and PNG files under ``folder`` (recursive), sorted by path."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


class Decoders:
    """Decoding threads pinned to the cores of this process that ``busy`` (the config's devices)
    leaves free; with none free, all of them (shared with the devices, ``shared``). Pillow and numpy
    release the interpreter lock while they decode, resize and normalise."""

    def __init__(self, busy: frozenset[int], threads: int | None = None) -> None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
            range(os.cpu_count() or 1))
        free = [c for c in allowed if c not in busy]
        self.cores = free or allowed
        self.shared = not free
        self.threads = threads or len(self.cores)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="autohet-decode", initializer=self._pin)

    def _pin(self) -> None:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(threading.get_native_id(), set(self.cores))

    def batches(self, paths: Sequence[Path], prep: Preprocessing, batch: int, skip_bad: bool,
                skipped: list[dict[str, str]]) -> Iterator[tuple[np.ndarray, list[Path]]]:
        """(images, their paths) in file order, ``batch`` at a time, decoded ahead on the threads. A
        bad file raises BadImage, or with ``skip_bad`` is left out and appended to ``skipped``."""
        ahead: deque[tuple[Path, Future]] = deque()
        todo = iter(paths)
        rows: list[np.ndarray] = []
        names: list[Path] = []

        def fill() -> None:
            while len(ahead) < max(4 * self.threads, 2 * batch):
                path = next(todo, None)
                if path is None:
                    return
                ahead.append((path, self.pool.submit(decode, path, prep)))

        fill()
        while ahead:
            path, future = ahead.popleft()
            fill()
            try:
                rows.append(future.result())
                names.append(path)
            except BadImage as exc:
                if not skip_bad:
                    raise
                skipped.append({"path": exc.path, "reason": exc.reason})
            if len(rows) == batch:
                yield np.stack(rows), names
                rows, names = [], []
        if rows:
            yield np.stack(rows), names

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict[str, object]:
        return {"cores": self.cores, "threads": self.threads, "shared_with_devices": self.shared}
