"""A pool: the executors of one run, started for one model and workload, used through dispatchers;
what makes two executors the same worker (``Identity``), and where a stream's time went."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from autohet.core.models import ModelSpec
from autohet.core.workload import PixelScale, Workload
from autohet.executors import ExecutorSpec, executor_kind
from autohet.pool.dispatch import Dispatcher
from autohet.pool.spec import PoolSpec

if TYPE_CHECKING:
    from autohet.pool.lanes import Lanes

__all__ = ["Identity", "Pool", "StreamStats", "identity"]




class Identity(NamedTuple):
    """What makes two executors the same worker: an actor of one serves the other after
    ``configure`` (batch and precision are per run)."""

    name: str
    kind: str
    cores: tuple[int, ...]
    gpu: int | None
    node: str | None

    @property
    def holds_gpu(self) -> bool:
        """Its actor holds a real GPU while alive (see ``ExecutorKind.holds_gpu``)."""
        return executor_kind(self.kind).holds_gpu


def identity(spec: ExecutorSpec) -> Identity:
    return Identity(spec.name, spec.kind, spec.cores, spec.gpu, spec.node)


@dataclass
class StreamStats:
    """Where a stream's time went, summed over its windows (``stream_windows``): waiting for the
    source's next window (``wait_s``: a service's requests not there yet), staging windows into pinned
    memory (``stage_s``, beside the device's work) and the device's own time on them (``device_s``,
    CUDA events). Against the wall time they say whether the device or its feeding is the bound."""

    windows: int = 0
    images: int = 0
    wait_s: float = 0.0
    stage_s: float = 0.0
    device_s: float = 0.0
    # a stream over several executors (``autohet.pool.lanes``): each one's images and busy seconds
    executors: dict[str, dict[str, float]] = field(default_factory=dict)


class Pool(ABC):
    """Executors started for one model and workload; strategies use them through dispatchers."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.started_for: tuple[ModelSpec, int] | None = None
        self.stream_stats = StreamStats()
        self.unconfigured: set[int] = set()  # executors the last ``configure`` left out (``only``)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.spec.executors]

    @property
    def simulated(self) -> bool:
        return self.spec.simulated

    on_ray = False  # in-process strategies then run their engine in a Ray actor

    def __len__(self) -> int:
        return len(self.spec.executors)

    @abstractmethod
    def start(self, model: ModelSpec, workload: Workload) -> float:
        """Builds the model on every executor and places the workload once; returns compile seconds."""

    @abstractmethod
    def dispatcher(self) -> Dispatcher: ...

    @abstractmethod
    def set_workload(self, workload: Workload) -> list[int]:
        """Gives the started executors new images (a served call's), models kept; returns the
        executors that could not take them (dead)."""

    def overlaps_windows(self) -> bool:
        """Whether ``stream_windows`` can run a stream (one executor that queues units asynchronously)."""
        return False

    def stream_windows(self, windows: Iterable[list[np.ndarray]], lock: Any) -> Iterator[np.ndarray]:
        """Each window's outputs, the next window's units queued before the current one's are collected
        (only where ``overlaps_windows``)."""
        raise NotImplementedError(f"{type(self).__name__} does not overlap a stream's windows")

    def accept_pixels(self, scale: PixelScale) -> bool:
        """Whether every executor takes uint8 pixels and scales them itself (then they do, by ``scale``);
        else calls keep float32 inputs. Executors behind Ray take float32."""
        return False

    def lanes(self, speeds: list[float | None], alive: list[bool]) -> Lanes | None:
        """A stream over every executor, each on a lane of its own (``autohet.pool.lanes``), where this
        pool's executors can run staged pieces; else None (its streams go window by window)."""
        return None

    def stage(self, parts: list[np.ndarray]) -> Any:
        """A stream's next call made ready while the current one runs (``use_staged`` then gives it to the
        executors): by default the parts joined, to be placed with ``set_workload``."""
        from autohet.executors.base import join_parts

        return join_parts(parts)

    def use_staged(self, staged: Any) -> list[int]:
        """Gives the executors the staged call's images; returns those that could not take them."""
        return self.set_workload(Workload(staged, len(staged)))

    @abstractmethod
    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        """Each executor's throughput running alone, measured one after another (only ``indices``,
        in that order, when given)."""

    def configure(self, by_kind: dict[str, dict[str, Any]], only: Collection[int] | None = None) -> float:
        """Applies per-kind executor params (batch, precision, backend...) for the next run; returns
        the seconds executors spent compiling for them. ``only``: the executors the next run uses (a
        single's one); the others get the params later (``configure_rest``), from the compile cache
        the first one filled, instead of every GPU of the topology compiling the setting at once."""
        self.spec = self.spec.with_executor_params(by_kind)
        everyone = set(range(len(self.spec.executors)))
        now = everyone if only is None else everyone & set(only)
        self.unconfigured = everyone - now
        return self._push(sorted(now))

    def configure_rest(self, indices: Collection[int] | None = None) -> float:
        """Gives the executors ``configure`` left out (those of ``indices`` among them, when given)
        the pool's params before they run; returns their compile seconds."""
        due = self.unconfigured if indices is None else self.unconfigured & set(indices)
        self.unconfigured = self.unconfigured - due
        return self._push(sorted(due)) if due else 0.0

    def _push(self, indices: list[int]) -> float:
        return sum(d.get("compile_s", 0.0) for d in self._apply_config(indices))

    def _apply_config(self, indices: list[int]) -> list[dict[str, Any]]:
        """Optional hook: push the spec's executor params to these live executors; their descriptions."""
        return []

    def shutdown(self) -> None:  # noqa: B027
        """Optional hook: stop executors."""


