"""A strategy's configuration held ready for production calls: what ``Strategy.serve`` returns.

Built once (executors or engine devices started, models placed or compiled, the plan taken from
the parameters or measured once); every call runs its images the way the strategy ran them when
it was measured and returns the outputs in input order. The runtime (``autohet.runtime``) calls
every family through this one interface, checks the first call's outputs and makes calls from
several threads safe: a Served runs one call at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from autohet.core.workload import PixelScale
    from autohet.engine import Engine, Program

__all__ = ["EngineServed", "Served"]


class Served(ABC):
    """``served(images)``: (N, C, H, W) float32, N >= 1 -> (N, classes) float32, same order.

    ``precision``: the least precise precision taking part (the output check's tolerance);
    ``simulated``: outputs are simulated executors' (image indices), not the model's; ``batch``:
    images per call that give every device work at once (a stream's calls are at least this);
    ``cores``: the CPU cores its devices pin (the rest are free for decoding); ``deaths``:
    executors that died during calls (their work re-run on the others)."""

    precision: str = "fp32"
    simulated: bool = False
    batch: int = 1
    cores: frozenset[int] = frozenset()
    deaths: list[str]

    @abstractmethod
    def __call__(self, images: np.ndarray) -> np.ndarray: ...

    def stream(self, windows: Iterable[list[np.ndarray]], lock: Any = None) -> Iterator[np.ndarray]:
        """Outputs of each window (a call's images as parts), in order: one call per window, under
        ``lock`` (the runner's: calls from other threads run between windows). Configurations that can
        make the next window ready while one runs override this."""
        for parts in windows:
            images = parts[0] if len(parts) == 1 else np.concatenate(parts)
            with lock or nullcontext():
                yield self(images)

    def accept_pixels(self, scale: PixelScale) -> bool:
        """Whether calls may hand (N, C, H, W) uint8 pixels that the devices scale themselves (``scale``):
        a GPU copies a quarter of float32's bytes. Otherwise the caller scales them on the host."""
        return False

    def describe(self) -> dict[str, Any]:
        """What runs where (devices, the plan): for logs and the CLI's summary."""
        return {}

    def close(self) -> None:  # noqa: B027
        """Optional hook: stop what ``serve`` started (not the pool: its owner stops it)."""


class EngineServed(Served):
    """One program on an in-process engine (placement, split, coedge, channels, pipeline): each call's
    images as frames of ``batch`` (padded at the end), ``depth`` frames in flight, so a frame's step on
    one device runs beside the next frame's step on another."""

    def __init__(self, engine: Engine, program: Program, batch: int, depth: int, precision: str,
                 plan: dict[str, Any] | None = None, cores: frozenset[int] = frozenset()) -> None:
        self.engine, self.program, self.batch, self.depth = engine, program, batch, depth
        self.precision, self.plan, self.cores, self.deaths = precision, plan or {}, cores, []
        # frames made pinned on the calling thread where a GPU takes part (its worker never stages them)
        self.pinned = any(d.on_gpu for d in engine.compute_devices)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        from autohet.engine import frames_through

        outs = frames_through(self.engine, self.program, lambda start, n: images[start : start + n], len(images),
                              self.batch, self.depth, self.pinned)
        return np.concatenate([o.float().numpy() for o in outs])

    def describe(self) -> dict[str, Any]:
        return {"devices": [d.name for d in self.engine.compute_devices], "batch": self.batch, "depth": self.depth,
                **self.plan}

    def close(self) -> None:
        self.engine.close()
