"""Workloads: N input images, synthetic from a seed or loaded from an .npy file, held in memory.

The workload is materialised once per run and placed where every executor can read it
without copies per work unit (the Ray object store, shared read-only); work units are
index ranges [start, start + size) into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autohet.core.errors import UserError
from autohet.core.settings import MAX_DISTINCT_BYTES

__all__ = ["MAX_DISTINCT_BYTES", "PixelScale", "Workload", "WorkloadSpec", "workload_for"]



@dataclass(frozen=True)
class PixelScale:
    """How uint8 pixels (N, C, H, W) become model inputs: scaled to [0, 1], minus the per-channel mean,
    over the std. A GPU applies it after copying the pixels (a quarter of float32's bytes); the host
    applies it where a device takes float32 inputs."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def apply(self, pixels: np.ndarray) -> np.ndarray:
        """The pixels as float32 model inputs, on the host."""
        mean = np.asarray(self.mean, dtype=np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(self.std, dtype=np.float32).reshape(1, -1, 1, 1)
        return np.ascontiguousarray((pixels.astype(np.float32) / 255.0 - mean) / std, dtype=np.float32)

    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) with inputs = pixels * a + b, each shaped (1, C, 1, 1) float32: one fused multiply-add
        on a device."""
        std = np.asarray(self.std, dtype=np.float64)
        a = 1.0 / (255.0 * std)
        b = -np.asarray(self.mean, dtype=np.float64) / std
        return a.astype(np.float32).reshape(1, -1, 1, 1), b.astype(np.float32).reshape(1, -1, 1, 1)


@dataclass(frozen=True)
class WorkloadSpec:
    """Either ``images`` synthetic images drawn from ``seed``, or the images of an .npy file."""

    images: int
    shape: tuple[int, int, int]
    seed: int = 0
    npy: str | None = None

    def to_dict(self) -> dict:
        return {"images": self.images, "shape": list(self.shape), "seed": self.seed, "npy": self.npy}


class Workload:
    """The images of one run as a float32 bank plus the mapping from image index to bank row."""

    def __init__(self, bank: np.ndarray, images: int) -> None:
        if images < 1:
            raise UserError(f"--images must be at least 1, got {images}")
        self.bank = bank
        self.images = images

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bank.shape[1:])

    @classmethod
    def from_spec(cls, spec: WorkloadSpec) -> Workload:
        if spec.npy:
            return cls.from_npy(spec.npy, spec.shape, spec.images)
        if spec.images < 1:
            raise UserError(f"--images must be at least 1, got {spec.images}")
        per_image = int(np.prod(spec.shape)) * 4
        distinct = max(1, min(spec.images, MAX_DISTINCT_BYTES // per_image))
        rng = np.random.default_rng(spec.seed)
        bank = rng.standard_normal((distinct, *spec.shape), dtype=np.float32)
        return cls(bank, spec.images)

    @classmethod
    def from_npy(cls, path: str, shape: tuple[int, int, int], images: int | None = None) -> Workload:
        file = Path(path)
        if not file.is_file():
            raise UserError(f"workload file {file} not found; pass an existing .npy of N x {shape} images")
        try:
            array = np.load(file, mmap_mode="r")
        except ValueError as exc:
            raise UserError(f"{file} is not a readable .npy file ({exc}); save it with numpy.save") from None
        if tuple(array.shape[1:]) != tuple(shape):
            raise UserError(f"{file} holds images of shape {tuple(array.shape[1:])} but the model takes "
                            f"{tuple(shape)}; reshape the array to N x {shape}")
        n = array.shape[0] if not images else min(images, array.shape[0])
        return cls(np.ascontiguousarray(array[:n], dtype=np.float32), n)

    def rows(self, start: int, size: int) -> np.ndarray:
        """Images [start, start + size) as one array (a view when the range does not wrap)."""
        n = len(self.bank)
        first = start % n
        if first + size <= n:
            return self.bank[first : first + size]
        return self.bank[(np.arange(start, start + size) % n)]

    def indices_sample(self, count: int) -> np.ndarray:
        """Evenly spread image indices for the output check (first and last included). Where the images
        cycle through the bank (more images than rows), each is the index nearest its even spot whose row
        is one of ``count`` rows evenly spread over the bank: runs of any length check those rows (and
        the last image's), so their reference outputs are computed once (``RunContext.reference``)."""
        count = min(count, self.images)
        spots = np.linspace(0, self.images - 1, count).round().astype(np.int64)
        rows = len(self.bank)
        if self.images <= rows:
            return np.unique(spots)
        grid = np.linspace(0, rows - 1, min(count, rows)).round().astype(np.int64)
        offsets = np.concatenate([grid - rows, grid, grid + rows])
        candidates = (spots - spots % rows)[:, None] + offsets[None, :]
        distance = np.where((candidates >= 0) & (candidates < self.images), np.abs(candidates - spots[:, None]),
                            np.iinfo(np.int64).max)
        nearest = candidates[np.arange(len(spots)), distance.argmin(axis=1)]
        return np.unique(np.append(nearest, self.images - 1))


def workload_for(model: str, images: int, seed: int = 0, npy: str | None = None) -> Workload:
    """The workload of a run of ``model``: synthetic images of its input shape, or an .npy file."""
    from autohet.core.models import input_shape

    return Workload.from_spec(WorkloadSpec(images, input_shape(model), seed, npy))
