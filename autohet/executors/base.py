"""The Executor extension point: one device worker that holds a model and runs index ranges."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autohet.core.models import ModelSpec
from autohet.core.params import BoolParam, ChoiceParam, IntParam, Param, validate_params
from autohet.core.workload import PixelScale, Workload
from autohet.executors.backends import EXECUTOR_BACKENDS, backend
from autohet.executors.kinds import ExecutorKind, executor_kind
from autohet.platform.gc_control import let_go

__all__ = ["BACKENDS", "EXECUTOR_PARAMS", "INDUCTOR_MODES", "PRECISIONS", "Executor", "ExecutorSpec", "UnitResult",
           "join_parts"]

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
BACKENDS = EXECUTOR_BACKENDS  # every backend an executor may name (``executors.backends``)
INDUCTOR_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")

# Executor parameters that a pool file sets and a trial may vary; each kind says which apply to it
# (autohet.executors.kinds) and refuses values its device cannot run.
EXECUTOR_PARAMS: dict[str, Param] = {
    "batch": IntParam("batch", 64, low=1, high=4096, help="images per forward pass"),
    "precision": ChoiceParam("precision", "fp32", choices=PRECISIONS),
    "channels_last": BoolParam("channels_last", False),
    "backend": ChoiceParam("backend", "eager", choices=BACKENDS,
                           help="eager, inductor (torch.compile), cudagraphs (GPU: a graph per batch shape), "
                                "openvino or onnxruntime (CPU)"),
    "inductor_mode": ChoiceParam("inductor_mode", "default", choices=INDUCTOR_MODES,
                                 help="torch.compile mode for backend inductor"),
    "sms": IntParam("sms", None, low=0, high=100000,
                    help="GPU: run on a green-context partition of this many SMs (unset or 0: the whole GPU)"),
    "streams": IntParam("streams", None, low=0, high=1024,
                        help="CPU openvino: parallel inference streams, at most one per core (unset or 0: "
                             "OpenVINO's THROUGHPUT hint picks)"),
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
    backend: str = "eager"
    inductor_mode: str = "default"
    sms: int | None = None
    streams: int | None = None
    node: str | None = None
    # simulated executors only (labelled simulated everywhere they appear)
    speed_ips: float = 0.0
    overhead_s: float = 0.0
    needs_gpu: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def kind_type(self) -> ExecutorKind:
        """The registered kind ``kind`` names (an unknown name is a UserError listing the valid ones)."""
        return executor_kind(self.kind)

    @property
    def is_cpu(self) -> bool:
        """A CPU core group: its cores are its device."""
        return self.kind_type.is_cpu

    @property
    def is_gpu(self) -> bool:
        """Runs on a real GPU (or a partition of one) of its own."""
        return self.kind_type.holds_gpu

    @property
    def simulated(self) -> bool:
        return self.kind_type.simulated

    @property
    def device(self) -> str:
        return self.kind_type.device_label(self.cores, self.gpu, self.sms, self.needs_gpu)

    @property
    def torch_device(self) -> str | None:
        """'cuda:N' or 'cpu'; None for a simulated executor."""
        return self.kind_type.torch_device(self.gpu)

    @property
    def uses_gpu(self) -> bool:
        """Holds a (real or simulated) GPU: Ray gives it a GPU share, the dispatcher queues ahead."""
        return self.kind_type.uses_gpu(self.needs_gpu)

    @property
    def pinned_cores(self) -> tuple[int, ...]:
        """The cores it occupies (Ray CPUs it claims): none for a simulated executor."""
        return self.kind_type.pinned_cores(self.cores)

    def ray_resources(self, reserve_cpus: bool = True) -> dict[str, int]:
        """Ray ``num_cpus`` and ``num_gpus`` of its actor (see ``ExecutorKind.ray_resources``)."""
        return self.kind_type.ray_resources(self.cores, self.needs_gpu, reserve_cpus)

    @property
    def compiles(self) -> bool:
        """Its backend traces and compiles the model (inductor): dynamo's tracing patches nn.Module.__call__
        for the whole process, so such an executor loads while no other model runs in its process."""
        return backend(self.backend).compiles

    @property
    def request_graph(self) -> bool:
        """A GPU serves its batch-1 requests as one CUDA-graph replay (``executors.backends``)."""
        return backend(self.backend).request_graph

    @property
    def max_unit_images(self) -> int:
        """Largest part of a work unit sent in one call: enough batches that a call's fixed cost
        (the end-of-call sync, the return) stays small next to its compute."""
        return self.batch * self.kind_type.unit_batches

    @property
    def threads(self) -> int:
        return max(1, len(self.cores))

    def with_params(self, params: dict[str, Any]) -> ExecutorSpec:
        """A copy with executor params replaced (validated; ``sms: 0`` clears a partition)."""
        given = {k: v for k, v in params.items() if v is not None}
        merged = validate_params(f"executor {self.name}", EXECUTOR_PARAMS, {**self.executor_params(), **given})
        merged["sms"] = merged["sms"] or None  # 0: the whole GPU (a searchable choice)
        merged["streams"] = merged["streams"] or None  # 0: the backend's own choice (a searchable choice)
        return replace(self, **merged)

    def executor_params(self) -> dict[str, Any]:
        return {"batch": self.batch, "precision": self.precision, "channels_last": self.channels_last,
                "backend": self.backend, "inductor_mode": self.inductor_mode, "sms": self.sms,
                "streams": self.streams}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.cores:
            out["cores"] = list(self.cores)
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.node is not None:
            out["node"] = self.node
        params = self.executor_params()
        if self.backend != "inductor":  # only what applies: a pool file stays as short as it was written
            params.pop("inductor_mode")
        if self.backend == "eager":
            params.pop("backend")
        if self.sms is None:
            params.pop("sms")
        if self.streams is None:
            params.pop("streams")
        out.update(params)
        if self.simulated:
            out.update(speed_ips=self.speed_ips, overhead_s=self.overhead_s, needs_gpu=self.needs_gpu)
        return out


@dataclass
class UnitResult:
    """A finished work unit: outputs in image order and the seconds the executor spent on it."""

    outputs: np.ndarray
    compute_s: float


def join_parts(parts: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """The parts one after another, in ``out`` when given (as many rows as they hold together): without
    ``out`` the only part itself, else copied on several threads (``host_copy``: numpy's concatenate
    copies on one, slow for a window of a gigabyte: docs/why.md, executors/base.py)."""
    if out is None and len(parts) == 1:
        return parts[0]
    import warnings

    import torch

    from autohet.platform.host_copy import copy_parts

    total = sum(len(p) for p in parts)
    if out is None:
        out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only parts: only read
        copy_parts(torch.from_numpy(out[:total]), [torch.from_numpy(p) for p in parts])
    return out


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

    def ready(self, handle: Any) -> bool:
        """Whether a launched unit is done (``collect`` would not wait); synchronous units are."""
        return True

    def set_workload(self, workload: Workload) -> None:
        """Gives a loaded executor new images (a served call's) without rebuilding its model: later
        units index into them (called between runs). Executors that stage the workload elsewhere (a
        GPU's pinned bank) override."""
        self.workload = workload

    def stage(self, parts: list[np.ndarray]) -> Any:
        """A stream's next call, made ready while units of the current one run (so it may run on any
        thread, and touches nothing the running units read): by default the parts as one array, which
        ``use_staged`` makes the workload. A GPU copies them straight into a pinned buffer instead."""
        return join_parts(parts)

    # Executors whose ``launch`` queues a unit and returns at once (a GPU): a stream of one such executor
    # queues the next window's units before collecting the current one's (``LocalPool.stream_windows``).
    launches_async = False

    # Executors that take uint8 pixels (N, C, H, W) as their workload and apply ``pixel_scale`` on the
    # device themselves (a GPU: a quarter of float32's bytes crosses to it); the others take float32.
    takes_pixels = False
    pixel_scale: PixelScale | None = None

    def stage_piece(self, parts: list[np.ndarray]) -> Any:
        """A stream lane's piece made ready for ``launch_staged`` (``autohet.pool.lanes``): by default as
        ``stage`` makes a call."""
        return self.stage(parts)

    def use_staged(self, staged: Any) -> None:
        """Makes what ``stage`` returned the images of the next units (called between runs)."""
        self.set_workload(Workload(staged, len(staged)))

    # Executors that run a stream's pieces straight from what ``stage`` made (``launch_staged``), leaving
    # the workload their units read alone: a multi-executor stream gives each such executor a lane of its
    # own (``autohet.pool.lanes``), and calls from other threads may run between its pieces.
    runs_staged = False

    def launch_staged(self, staged: Any, start: int, count: int) -> Any:
        """Starts a piece of ``count`` images that ``stage`` made (``start``: its first image's index in
        the caller's window); returns a handle for ``collect`` (a synchronous executor runs it now)."""
        raise NotImplementedError(f"{type(self).__name__} does not run staged pieces")

    def run_ahead(self, start: int, size: int, following: tuple[int, int] | None) -> UnitResult:
        """Runs a unit, told which one comes next (asynchronous executors queue it before waiting)."""
        if size >= self.spec.batch:  # full batches of this shape ran: standalone needs no warm-up
            self.warm_units.add(self.standalone_unit())
        return self.run(start, size)

    def configure(self, params: dict[str, Any]) -> bool:
        """Applies executor params for the next runs; rebuilds only what the change needs. Returns whether
        anything changed (unchanged params set nothing up)."""
        new = self.spec.with_params(params)
        self.compile_s = 0.0  # seconds compiling for this configuration (a kept variant: none)
        if new == self.spec:
            return False
        self.spec = new
        self.warm_units = set()
        if self.workload is not None:
            self.reconfigure()
            let_go()  # what the old setting held (a compiled model), for the next settle to free
        return True

    def release(self) -> None:
        """Drops what a later ``configure`` can build again (an idle executor short of memory); the
        default holds nothing worth dropping."""
        return None

    def reconfigure(self) -> None:
        """Optional hook: set up the new ``spec`` on the loaded executor (default: load again)."""
        assert self.workload is not None
        self.load(self.workload)

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None) -> float:
        """Throughput running alone: units of one batch until ``min_seconds`` pass or ``max_images`` ran.

        ``max_images`` (the executor's fair share of a run) keeps big models on slow devices from
        spending minutes here; at least one unit always runs. The untimed warm-up unit is skipped
        when units of this size already ran since the last (re)configuration (a trial's run just
        did), and a synchronous executor starts no further unit once ``min_seconds`` have passed.
        Time box: when the warm-up unit alone took longer than ``max(4 x min_seconds, 2 s)`` (a big batch
        on one core), its own rate is the figure instead of a second unit as long.
        """
        assert self.workload is not None, "load() first"
        self.drain()  # work queued ahead by an earlier caller would run inside the timed units
        unit = max(1, min(self.standalone_unit(), max_images or self.standalone_unit()))
        if unit not in self.warm_units:
            t0 = time.perf_counter()
            self.collect(self.launch(0, unit))  # untimed: the first call at a new shape pays one-off costs
            first = time.perf_counter() - t0
            self.warm_units.add(unit)
            if first > max(4 * min_seconds, 2.0):
                return unit / first
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
                "compile_s": getattr(self, "compile_s", 0.0), **self.spec.executor_params()}

    def drain(self) -> None:  # noqa: B027
        """Finishes and forgets work queued ahead (a part announced but never asked for, a cut run's):
        an executor kept after a cut starts its next run on an idle device. Synchronous: nothing."""

    def ping(self) -> str:
        return self.spec.name
