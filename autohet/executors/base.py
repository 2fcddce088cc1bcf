"""The Executor extension point: one device worker that holds a model and runs index ranges."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autohet.models import ModelSpec
from autohet.params import Param, validate_params
from autohet.workload import Workload

__all__ = ["Executor", "ExecutorSpec", "UnitResult", "EXECUTOR_PARAMS", "PRECISIONS"]

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

# Executor parameters that a pool file sets and a trial may vary.
EXECUTOR_PARAMS: dict[str, Param] = {
    "batch": Param("batch", "int", 64, 1, 4096, help="images per forward pass"),
    "precision": Param("precision", "choice", "fp32", choices=PRECISIONS),
    "channels_last": Param("channels_last", "bool", False),
}


@dataclass(frozen=True)
class ExecutorSpec:
    """Where an executor runs and how: kind cpu|gpu|sim, its cores, its GPU, batch and precision."""

    name: str
    kind: str
    cores: tuple[int, ...] = ()
    gpu: int | None = None
    batch: int = 64
    precision: str = "fp32"
    channels_last: bool = False
    node: str | None = None
    # simulated executors only (labelled simulated everywhere they appear)
    speed_ips: float = 0.0
    overhead_s: float = 0.0
    needs_gpu: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def device(self) -> str:
        if self.kind == "gpu":
            return f"cuda:{self.gpu}"
        if self.kind == "cpu":
            return "cpu[" + ",".join(map(str, self.cores)) + "]"
        return "simulated-gpu" if self.needs_gpu else "simulated"

    @property
    def max_unit_images(self) -> int:
        """Largest part of a work unit sent in one call: enough batches that a call's fixed cost
        (the end-of-call sync, the return) stays small next to its compute."""
        return self.batch * (16 if self.kind == "gpu" else 8)

    @property
    def threads(self) -> int:
        return max(1, len(self.cores))

    def with_params(self, params: dict[str, Any]) -> ExecutorSpec:
        """A copy with batch/precision/channels_last replaced (validated)."""
        given = {k: v for k, v in params.items() if v is not None}
        merged = validate_params(f"executor {self.name}", EXECUTOR_PARAMS,
                                 {**self.executor_params(), **given})
        return replace(self, **merged)

    def executor_params(self) -> dict[str, Any]:
        return {"batch": self.batch, "precision": self.precision, "channels_last": self.channels_last}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.cores:
            out["cores"] = list(self.cores)
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.node is not None:
            out["node"] = self.node
        out.update(self.executor_params())
        if self.kind == "sim":
            out.update(speed_ips=self.speed_ips, overhead_s=self.overhead_s, needs_gpu=self.needs_gpu)
        return out


@dataclass
class UnitResult:
    """A finished work unit: outputs in image order and the seconds the executor spent on it."""

    outputs: np.ndarray
    compute_s: float


class Executor(ABC):
    """A device worker. ``load`` places the model and workload once; ``run`` takes index ranges."""

    simulated = False

    def __init__(self, spec: ExecutorSpec, model: ModelSpec) -> None:
        self.spec = spec
        self.model_spec = model
        self.workload: Workload | None = None
        self.warm_units: set[int] = set()  # unit sizes run since the last (re)configuration

    @abstractmethod
    def load(self, workload: Workload) -> None:
        """Builds the model on the device, keeps the workload, warms up."""

    @abstractmethod
    def run(self, start: int, size: int) -> UnitResult:
        """Runs images [start, start + size) and returns their outputs in order."""

    def launch(self, start: int, size: int) -> Any:
        """Starts a unit and returns a handle for ``collect``; synchronous executors just run it."""
        return self.run(start, size)

    def collect(self, handle: Any) -> UnitResult:
        """Waits for a unit started by ``launch``."""
        return handle

    def run_ahead(self, start: int, size: int, following: tuple[int, int] | None) -> UnitResult:
        """Runs a unit, told which one comes next (asynchronous executors queue it before waiting)."""
        if size >= self.spec.batch:  # full batches of this shape ran: standalone needs no warm-up
            self.warm_units.add(self.standalone_unit())
        return self.run(start, size)

    def configure(self, params: dict[str, Any]) -> None:
        """Applies batch/precision/channels_last for the next runs (rebuilds what it must)."""
        new = self.spec.with_params(params)
        if new != self.spec:
            self.spec = new
            self.warm_units = set()
            if self.workload is not None:
                self.load(self.workload)

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None) -> float:
        """Throughput running alone: units of one batch until ``min_seconds`` pass or ``max_images`` ran.

        ``max_images`` (the executor's fair share of a run) keeps big models on slow devices from
        spending minutes here; at least one unit always runs. The untimed warm-up unit is skipped
        when units of this size already ran since the last (re)configuration (a trial's run just
        did), and a synchronous executor starts no further unit once ``min_seconds`` have passed.
        """
        assert self.workload is not None, "load() first"
        unit = max(1, min(self.standalone_unit(), max_images or self.standalone_unit()))
        if unit not in self.warm_units:
            self.collect(self.launch(0, unit))  # untimed: the first call at a new shape pays one-off costs
            self.warm_units.add(unit)
        done, launched = 0, unit
        start = time.perf_counter()
        pending = self.launch(0, unit)
        while pending is not None:
            # the next unit is queued before this one is collected, as two calls in flight on an actor
            # (a synchronous executor has already run ``pending`` by now, so its time counts here)
            elapsed = time.perf_counter() - start
            more = elapsed < min_seconds and (max_images is None or launched < max_images)
            following = self.launch(launched % self.workload.images, unit) if more else None
            launched += unit if more else 0
            self.collect(pending)
            done += unit
            pending = following
        return done / (time.perf_counter() - start)

    def standalone_unit(self) -> int:
        """Images per call when measuring standalone throughput (one batch; GPUs override)."""
        return self.spec.batch

    def describe(self) -> dict[str, Any]:
        return {"name": self.spec.name, "device": self.spec.device, "simulated": self.simulated,
                **self.spec.executor_params()}

    def ping(self) -> str:
        return self.spec.name
