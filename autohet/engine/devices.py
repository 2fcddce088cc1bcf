"""Devices of the in-process engine: each runs its steps in order on its own worker thread.

A CPU device is a group of cores: its worker thread pins itself to them and sets its own
intra-op thread count (OpenMP keeps one thread team per calling thread), so two CPU devices of one
process compute side by side on disjoint cores. A GPU device owns a CUDA stream (or a stream of a
green-context partition of the GPU's SMs); its worker launches work and returns at once, and a
value it produces carries an event that consumers on other devices wait for.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from autohet.core.errors import UserError
from autohet.executors.cpu import pin_thread
from autohet.executors.gpu import DTYPES, use_tf32
from autohet.pool.worker import Worker

__all__ = ["DTYPES", "HOST", "CpuDevice", "Device", "GpuDevice", "HostDevice", "Value"]

HOST = "host"  # where a program's inputs start and its output must end: this process's memory



@dataclass
class Value:
    """A tensor on a device; ``event`` (GPU producers) marks when it is ready."""

    tensor: Any
    device: str
    event: Any = None


class Device:
    """A worker thread running submitted callables in order. Subclasses set up the thread
    (``_setup``) and say how a value from elsewhere is consumed (``accept``) and a result published."""

    kind = "device"
    on_gpu: ClassVar[bool] = False  # a GPU (or partition): works on its own stream, launches return at once

    def __init__(self, name: str, precision: str = "fp32", channels_last: bool = False) -> None:
        if precision not in DTYPES:
            raise UserError(f"device {name}: precision must be one of {', '.join(DTYPES)}, got {precision!r}")
        self.name = name
        self.precision = precision
        self.dtype = DTYPES[precision]
        self.channels_last = channels_last
        self.torch_device = torch.device("cpu")
        self._worker: Worker | None = None

    def start(self) -> Device:
        """Starts the worker; raises what its set-up raised (a core that does not exist, no GPU)."""
        if self._worker is None:
            self._worker = Worker(f"engine-{self.name}", self._setup)
        return self

    def _setup(self) -> None:
        """Runs first on the worker thread."""

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Queues ``fn`` to run on this device's worker after everything queued before it."""
        assert self._worker is not None, "start() first"
        return self._worker.submit(fn)

    def call(self, fn: Callable[[], Any]) -> Any:
        return self.submit(fn).result()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    # --- data, run on this device's worker ---------------------------------------------------------

    def accept(self, value: Value) -> Any:
        """A value's tensor, usable by work of this device (waits for or orders after its producer)."""
        raise NotImplementedError

    def publish(self, tensor: Any) -> Value:
        """Wraps a result of this device for consumers elsewhere."""
        raise NotImplementedError

    def prepare(self, module: torch.nn.Module) -> torch.nn.Module:
        """A copy of ``module`` (or the module) in this device's memory, dtype and layout."""
        module = module.to(self.torch_device, self.dtype)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        return module.eval()

    def sync(self) -> None:
        """Waits until work queued on this device is done."""


class CpuDevice(Device):
    """A group of pinned cores with their own intra-op threads."""

    kind = "cpu"

    def __init__(self, name: str, cores: tuple[int, ...], precision: str = "fp32", channels_last: bool = False
                 ) -> None:
        if precision == "fp16":
            raise UserError(f"device {name}: a CPU runs fp32 or bf16; set precision: fp32 or bf16")
        super().__init__(name, "fp32" if precision == "tf32" else precision, channels_last)
        self.cores = tuple(cores)

    def _setup(self) -> None:
        pin_thread(self.cores, f"device {self.name}", yields=True)  # this thread and its OpenMP team

    def accept(self, value: Value) -> Any:
        if value.event is not None:
            value.event.synchronize()
        return value.tensor

    def publish(self, tensor: Any) -> Value:
        return Value(tensor, self.name)


class HostDevice(Device):
    """The calling process's memory: program inputs start here, the output ends here. It runs no
    steps (no worker thread); a value arriving from a GPU is waited for by whoever reads it."""

    kind = "host"

    def __init__(self) -> None:
        super().__init__(HOST)

    def start(self) -> Device:
        return self

    def submit(self, fn: Callable[[], Any]) -> Future:
        raise RuntimeError("the host device runs no steps")

    def accept(self, value: Value) -> Any:
        if value.event is not None:
            value.event.synchronize()
        return value.tensor

    def publish(self, tensor: Any) -> Value:
        return Value(tensor, HOST)


class GpuDevice(Device):
    """One GPU, or a green-context partition of its SMs (``stream`` from ``executors.green``)."""

    kind = "gpu"
    on_gpu: ClassVar[bool] = True

    def __init__(self, name: str, index: int, precision: str = "fp32", channels_last: bool = False,
                 stream_factory: Callable[[], Any] | None = None, sms: int | None = None) -> None:
        super().__init__(name, precision, channels_last)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise UserError(f"device {name} asks for GPU {index} but torch sees {torch.cuda.device_count()} "
                            "CUDA GPUs; use a CPU pool")
        self.index = index
        self.sms = sms
        self.torch_device = torch.device("cuda", index)
        self._stream_factory = stream_factory
        self.stream: Any = None
        self.copy_stream: Any = None

    def _setup(self) -> None:
        torch.cuda.set_device(self.torch_device)
        use_tf32(self.precision)
        torch.backends.cudnn.benchmark = True
        self.stream = self._stream_factory() if self._stream_factory else torch.cuda.Stream(self.torch_device)
        # moves in on a stream of their own, so frame n+1's copy runs under frame n's compute instead of
        # adding to it (docs/why.md, engine/devices.py). A plain stream of the GPU even for a partition:
        # a copy uses the copy engines, not SMs
        self.copy_stream = torch.cuda.Stream(self.torch_device)

    def accept(self, value: Value) -> Any:
        if value.event is not None:
            self.stream.wait_event(value.event)
        return value.tensor

    def publish(self, tensor: Any) -> Value:
        event = torch.cuda.Event()
        event.record(self.stream)
        return Value(tensor, self.name, event)

    def run_here(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` with this device's stream current (call on the worker)."""
        with torch.cuda.stream(self.stream):
            return fn()

    def sync(self) -> None:
        for stream in (self.copy_stream, self.stream):
            if stream is not None:
                stream.synchronize()
