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

import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

from autohet.config import Preprocess
from autohet.core.errors import UserError
from autohet.runtime._decode import BadImage, Preprocessing, decode, decode_batch, decode_pixels, pin_process

__all__ = ["IMAGE_SUFFIXES", "BadImage", "Decoders", "Preprocessing", "decode", "decode_pixels", "list_images",
           "preprocessing_for"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RESIZE_PER_CROP = 256 / 224  # torchvision's ImageNet evaluation: resize 256, crop 224


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


def list_images(folder: Path) -> list[Path]:
    """JPEG and PNG files under ``folder`` (recursive), sorted by path."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


class Decoders:
    """Decoding processes pinned to the cores of this process that ``busy`` (the config's devices)
    leaves free; with none free, all of them (shared with the devices, ``shared``). Processes, not
    threads: Pillow's calls hold the interpreter lock between them, so decoding threads contend for it
    (docs/why.md, runtime/images.py). A process decodes ``chunk`` files per job into uint8
    pixels, handed on as uint8 batches: the runner scales them (on the GPU where its devices take
    pixels, a quarter of float32's bytes to copy; else on the host)."""

    def __init__(self, busy: frozenset[int], processes: int | None = None, chunk: int = 16) -> None:
        import multiprocessing

        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
            range(os.cpu_count() or 1))
        free = [c for c in allowed if c not in busy]
        self.cores = free or allowed
        self.shared = not free
        self.processes = processes or len(self.cores)
        self.chunk = chunk
        # spawned: a forked copy of a process holding CUDA, Ray and OpenMP state is not safe to run
        self.pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=pin_process, initargs=(self.cores,))

    def batches(self, paths: Sequence[Path], prep: Preprocessing, batch: int, skip_bad: bool,
                skipped: list[dict[str, str]]) -> Iterator[tuple[np.ndarray, list[Path]]]:
        """(uint8 pixels, their paths) in file order, ``batch`` at a time, decoded ahead by the processes. A
        bad file raises BadImage, or with ``skip_bad`` is left out and appended to ``skipped``."""
        ahead: deque[tuple[list[Path], Future]] = deque()
        todo = iter(paths)
        rows: list[np.ndarray] = []
        names: list[Path] = []

        def fill() -> None:
            while len(ahead) * self.chunk < max(4 * self.processes * self.chunk, 2 * batch):
                job = [p for _, p in zip(range(self.chunk), todo, strict=False)]
                if not job:
                    return
                ahead.append((job, self.pool.submit(decode_batch, [str(p) for p in job], prep)))

        fill()
        while ahead:
            job, future = ahead.popleft()
            fill()
            for path, got in zip(job, future.result(), strict=True):
                if isinstance(got, BadImage):
                    if not skip_bad:
                        raise got
                    skipped.append({"path": got.path, "reason": got.reason})
                    continue
                rows.append(got)
                names.append(path)
                if len(rows) == batch:
                    yield np.stack(rows), names
                    rows, names = [], []
        if rows:
            yield np.stack(rows), names

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict[str, object]:
        return {"cores": self.cores, "processes": self.processes, "shared_with_devices": self.shared}
