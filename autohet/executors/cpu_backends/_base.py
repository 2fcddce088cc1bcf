"""The CPU backend extension point: what a backend can run here, and the program it builds."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from autohet.core.models import ModelSpec
    from autohet.executors.base import ExecutorSpec

__all__ = ["CpuBackend", "CpuProgram", "ModelSource"]


class ModelSource:
    """An executor's model: the fp32 module built once (every variant is converted from it) and the
    spec that names it (the key of converted artefacts in the compile cache)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._module: Any = None

    def module(self) -> Any:
        if self._module is None:
            from autohet.core.models import build_model

            self._module = build_model(self.spec)
        return self._module


class CpuProgram(ABC):
    """The model built for one executor variant (backend, precision, layout, batch, streams)."""

    compile_s: float = 0.0  # seconds converting and compiling it (0 where the cache had it)
    # ``launch`` returns before the call has run (OpenVINO's infer requests): the executor may then queue
    # its next part behind the current one (``CpuExecutor.run_ahead``); a synchronous program would run
    # that part before returning the current one, so it is not asked to
    asynchronous: ClassVar[bool] = False

    @abstractmethod
    def run(self, x: np.ndarray, batch: int) -> np.ndarray:
        """Outputs (float32, in input order) of the float32 images ``x``, any count, ``batch`` at a time."""

    def launch(self, x: np.ndarray, batch: int) -> Any:
        """Starts ``run(x, batch)`` and returns a handle for ``collect`` (synchronous programs: runs it)."""
        return self.run(x, batch)

    def collect(self, handle: Any) -> np.ndarray:
        """The outputs of a launched call, once it is done (launched calls complete in launch order)."""
        return handle

    def drop(self, handle: Any) -> None:  # noqa: B027
        """Forgets a launched call that will not be collected (its work not yet started is skipped)."""

    def drain(self) -> None:  # noqa: B027
        """Waits for work already running (dropped calls' started pieces): the next call starts on idle
        streams."""

    def describe(self) -> dict[str, Any]:
        """What the backend actually runs (e.g. OpenVINO's effective precision and streams)."""
        return {}

    def warm_images(self, unit: int) -> int:
        """Images of a second warm-up call where a call of ``unit`` images meets shapes the first (one
        batch) did not; 0 where it does not."""
        return 0

    def fill_images(self, batch: int) -> int:
        """Images of one call that give every stream of the program work (a batch, where one batch does)."""
        return batch


class CpuBackend(ABC):
    """One way of running a model on a pinned CPU group. ``build`` runs on the executor's pinned thread
    (thread pools made there inherit its cores)."""

    name: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    # warmed up on a full batch: the backend plans its memory per input shape, and the first batch of a
    # new shape runs slow (eager PyTorch pays its first-call costs at any size: 8 images do)
    warm_full_batch: ClassVar[bool] = False
    # its programs are asynchronous (``CpuProgram.asynchronous``): the executor queues its next part ahead
    asynchronous: ClassVar[bool] = False

    def missing(self) -> str | None:
        """Why this backend cannot run on this machine (a package or a tool missing), or None."""
        return None

    def refuse(self, precision: str) -> str | None:
        """Why this backend should not run ``precision`` here, or None."""
        if precision not in self.precisions:
            return f"{self.name} runs {' or '.join(self.precisions)} on a CPU"
        return None

    def variant_key(self, spec: ExecutorSpec) -> tuple:
        """What makes two specs the same program (an executor keeps one program per key, so a trial
        that comes back to a variant pays nothing); backends whose program depends on more extend it."""
        return (self.name, spec.precision)

    @abstractmethod
    def build(self, source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...]) -> CpuProgram:
        """The program for ``spec`` on images of ``shape`` (C, H, W), warm for ``spec.batch``."""
