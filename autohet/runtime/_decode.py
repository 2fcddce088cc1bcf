"""Decoding one image file into model input, light enough for a decoding process to import (Pillow
and numpy only): the pixels resized and centre-cropped as uint8, scaled to float32 by the runner (or a GPU)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from autohet.core.errors import UserError
from autohet.core.workload import PixelScale

__all__ = ["BadImage", "Preprocessing", "decode", "decode_batch", "decode_pixels", "normalise", "pin_process"]


class BadImage(UserError):
    """A file that is not a readable image (corrupt, truncated, not an image at all)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} is not a readable image ({reason}); remove it or pass --skip-bad")
        self.path, self.reason = path, reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # made in a decoding process, raised in the caller
        return BadImage, (self.path, self.reason)


@dataclass(frozen=True)
class Preprocessing:
    """The preprocessing of one model: its channels and crop (C, H, W), the shorter side's size
    before the crop, per-channel mean and std, and the resampling filter."""

    shape: tuple[int, int, int]
    resize: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str

    @property
    def scale(self) -> PixelScale:
        """The pixels-to-inputs step alone (where a GPU takes uint8 pixels, it runs there)."""
        return PixelScale(self.mean, self.std)

    def to_dict(self) -> dict[str, object]:
        return {"shape": list(self.shape), "resize": self.resize, "mean": list(self.mean), "std": list(self.std),
                "interpolation": self.interpolation}


def decode(path: str | Path | BinaryIO, prep: Preprocessing, name: str | None = None) -> np.ndarray:
    """One image file (or an open binary stream of one, ``name`` in errors) as a model input (C, H, W)
    float32; BadImage when it cannot be read whole."""
    return normalise(decode_pixels(path, prep, name)[None], prep)[0]


def decode_pixels(path: str | Path | BinaryIO, prep: Preprocessing, name: str | None = None) -> np.ndarray:
    """One image file (or stream) resized and centre-cropped, as (C, H, W) uint8 (a quarter of the
    float32's bytes to hand from a decoding process); BadImage when it cannot be read whole."""
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
    pixels = np.asarray(image, dtype=np.uint8)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1) if channels == 3 else pixels[None])


def normalise(pixels: np.ndarray, prep: Preprocessing) -> np.ndarray:
    """(N, C, H, W) uint8 pixels as model inputs: scaled to [0, 1], minus the mean, over the std."""
    return prep.scale.apply(pixels)


def decode_batch(paths: Sequence[str], prep: Preprocessing) -> list[np.ndarray | BadImage]:
    """Each file's pixels (``decode_pixels``) or its BadImage, in order: one decoding process's job."""
    out: list[np.ndarray | BadImage] = []
    for path in paths:
        try:
            out.append(decode_pixels(path, prep))
        except BadImage as exc:
            out.append(exc)
    return out


def pin_process(cores: Sequence[int]) -> None:
    """A decoding process's initializer: it runs on ``cores`` only."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))


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


