"""One GPU (or a green-context partition of its SMs): the workload pinned once in host memory,
copies on their own stream overlapped with compute, eager / CUDA graphs / inductor.

Data path per work unit: slices of the pinned host bank (already in the compute dtype, so
fp16/bf16 halve the bytes) are copied host-to-device on a copy stream into one of two device
buffers while the compute stream runs the previous batch; outputs go device-to-host into a
pinned buffer on the compute stream; the host waits once per unit. ``launch`` queues a unit and
``collect`` waits for it; the actor announces a unit's next part (``run_ahead``), which is queued
before this part's outputs are handed back, so the GPU does not idle between parts.

Backends: ``eager``; ``cudagraphs`` (one graph per padded batch shape, captured once: no per-op
launch cost); ``inductor`` (torch.compile for the full batch shape; partial batches run padded to
it, so each variant compiles once; its kernels replayed as one CUDA graph where its mode has none,
falling back to the compiled call where capture fails). Variants (precision, layout, backend) and pinned banks (per
dtype) are kept across reconfigurations: a tune that revisits a configuration pays nothing.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from autohet.core.errors import UserError
from autohet.core.models import build_model
from autohet.core.workload import Workload
from autohet.executors.base import Executor, UnitResult
from autohet.executors.compiled import GraphedCall, check_backend, compile_module, graph_call
from autohet.executors.cpu import pin_thread
from autohet.executors.gpu_staging import PinnedStaging, _InPlaceParts
from autohet.executors.pixel_kernel import scale_pixels
from autohet.platform.cores import note_feeder_cores

__all__ = ["DTYPES", "GpuExecutor", "local_gpu_index", "padded_batch", "use_tf32"]

# inductor modes whose compiled kernels are launched one by one from Python: replayed as one CUDA graph
# instead. Launching them from Python takes nearly as long as the GPU's own work, so one busy Python thread
# beside the executor (a runtime's reader, stager, driver) slows the GPU (docs/why.md, executors/gpu.py); a
# replay costs microseconds of the GIL.
_INDUCTOR_WITHOUT_GRAPHS = ("default", "max-autotune-no-cudagraphs")

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def use_tf32(precision: str) -> None:
    """TF32 for matmuls and cuDNN exactly when ``precision`` is tf32. cuDNN convolutions default to
    TF32 on Ampere and later, so fp32 must switch it off (with TF32, vgg16's outputs fell outside fp32's
    tolerance: docs/why.md, executors/gpu.py)."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def padded_batch(n: int, batch: int) -> int:
    """The shape a partial batch of ``n`` runs at: the next power of two, at most ``batch``.

    cuDNN autotunes (cudnn.benchmark) once per input shape; schedulers make units of any size,
    so unpadded partial batches would trigger a fresh autotune on almost every unit.
    """
    return min(batch, 1 << max(0, n - 1).bit_length())


def local_gpu_index(requested: int) -> int:
    """The device index to use in this process: under Ray (CUDA_VISIBLE_DEVICES narrowed to the one
    GPU it assigned) that is 0, whatever index the pool file named."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and len([v for v in visible.split(",") if v.strip()]) == 1:
        return 0
    return requested


@dataclass
class _Launched:
    """A unit queued on the GPU: its pinned output rows and the events around its compute."""

    outputs: torch.Tensor
    begin: torch.cuda.Event
    end: torch.cuda.Event
    source: Any = None  # the host rows it copies (kept alive while it may still read them)


@dataclass
class _Variant:
    """The model in one precision, layout and backend; its graphs or compiled form; shapes warm."""

    model: Any
    graphs: dict[int, Any] = field(default_factory=dict)  # cudagraphs, inductor: the call per padded batch shape
    compiled: dict[int, Any] = field(default_factory=dict)  # inductor: per batch size
    warm: set[int] = field(default_factory=set)


class GpuExecutor(PinnedStaging, Executor):
    # a partition's stream (set by the group actor that hosts the partitions of one GPU)
    stream_override: Any = None

    def load(self, workload: Workload) -> None:
        index = local_gpu_index(self.spec.gpu or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise UserError(f"executor {self.spec.name} asks for GPU {self.spec.gpu} but this node has "
                            f"{torch.cuda.device_count()} CUDA GPUs; use actors/auto.yaml or a CPU pool")
        if self.spec.cores:
            pin_thread(self.spec.cores)
            note_feeder_cores(self.spec.cores)  # the host copy threads leave this thread its cores
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        torch.backends.cudnn.benchmark = True
        self.workload = workload
        self._base: torch.nn.Module | None = None
        self._variants: dict[tuple, _Variant] = {}
        self._banks: dict[torch.dtype, torch.Tensor] = {}
        self._converting: dict[torch.dtype, tuple[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]]] = {}
        self.copy_stream = torch.cuda.Stream(self.device)
        self.compute_stream = self.stream_override or torch.cuda.Stream(self.device)
        self.sms = self.spec.sms
        self._ahead: dict[tuple[int, int], _Launched] = {}
        self._activate()

    def _key(self) -> tuple:
        s = self.spec
        return (s.precision, s.channels_last, s.backend, s.inductor_mode if s.backend == "inductor" else None)

    def _activate(self) -> None:
        """Sets up the current spec: its variant (built once), bank, buffers; warms the shapes it runs."""
        check_backend("gpu", self.spec.backend, self.spec.precision, self.spec.name)
        use_tf32(self.spec.precision)
        self.dtype = DTYPES[self.spec.precision]
        self.memory_format = torch.channels_last if self.spec.channels_last else torch.contiguous_format
        self.compile_s = 0.0
        assert self.workload is not None
        self.bank = self._bank(self.dtype)
        batch, shape = self.spec.batch, self.workload.shape
        with torch.inference_mode():  # inference tensors, as every input the model gets (``_launch``): see below
            self.dev_in = [torch.empty((batch, *shape), dtype=self.dtype, device=self.device) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.consumed = [torch.cuda.Event() for _ in range(2)]
        self._slot = 0
        self._ahead = {}
        key = self._key()
        if key not in self._variants:
            if self._base is None:
                self._base = build_model(self.model_spec)
            model = copy.deepcopy(self._base).to(self.device, self.dtype).to(memory_format=self.memory_format).eval()
            self._variants[key] = _Variant(model)
        self.variant = self._variants[key]
        # outputs go back as fp32, converted on the GPU: numpy's fp16 -> fp32 cast runs at ~10 ns an
        # element, which for 1000 classes costs the driver more than the whole GPU run
        self.out_dtype = torch.float32
        if self.spec.backend == "inductor":
            if batch not in self.variant.compiled:
                # compiled on an inference tensor, as ``_launch`` calls it on one (its inputs and a graph's static
                # ones are made in inference mode): torch.compile guards on the flag, and a plain example compiled
                # a setting twice wherever its input was a copy (another layout, a CUDA graph's: every default
                # mode setting), the second at the warm-up (BENCHMARKS.md 43)
                with torch.inference_mode():
                    example = torch.zeros((batch, *shape), dtype=self.dtype, device=self.device)
                    example = example.contiguous(memory_format=self.memory_format)
                with torch.cuda.stream(self.compute_stream):
                    self.variant.compiled[batch], self.compile_s = compile_module(
                        self.variant.model, self.spec.inductor_mode, example)
            sizes = [batch]
        else:
            sizes = sorted({padded_batch(n, batch) for n in range(1, batch + 1)})
        for n in sizes:  # warm-up: cuDNN autotunes (and graphs capture) each shape a unit can run at, once
            if n not in self.variant.warm:
                self.run(0, min(n, self.workload.images))
                self.variant.warm.add(n)
        self.run(0, min(2 * batch, self.workload.images))

    def reconfigure(self) -> None:
        if self.spec.sms != self.sms:
            raise UserError(f"executor {self.spec.name}: its partition (sms: {self.sms}) is fixed when it starts; "
                            "a pool with another SM count starts new executors")
        self._activate()

    def _sources(self, bank: torch.Tensor | _InPlaceParts, start: int, n: int) -> list[tuple[int, torch.Tensor]]:
        """(dest_offset, host rows) pieces of images [start, start+n) of ``bank``: its slices, or those of
        the parts a window left in place."""
        out = []
        for row, dest, count in self._segments(bank, start, n):
            if isinstance(bank, _InPlaceParts):
                for rows in bank.rows(row, count):
                    out.append((dest, rows))
                    dest += int(rows.shape[0])
            else:
                out.append((dest, bank[row : row + count]))
        return out

    def _segments(self, bank: torch.Tensor | _InPlaceParts, start: int, n: int) -> list[tuple[int, int, int]]:
        """(bank_row, dest_offset, count) pieces of images [start, start+n) in the cyclic bank."""
        rows = bank.shape[0]
        out, done = [], 0
        while done < n:
            row = (start + done) % rows
            count = min(n - done, rows - row)
            out.append((row, done, count))
            done += count
        return out

    def _forward(self, x: torch.Tensor, padded: int) -> torch.Tensor:
        """The model on a padded batch, with the current backend (call on the compute stream)."""
        backend = self.spec.backend
        if backend == "cudagraphs":
            graph = self.variant.graphs.get(padded)
            if graph is None:
                graph = GraphedCall(self.variant.model, [x], self.compute_stream)
                self.variant.graphs[padded] = graph
            return graph(x)
        if backend == "inductor":
            call = self.variant.graphs.get(padded)
            if call is None:
                compiled = self.variant.compiled[self.spec.batch]
                graphed = self.spec.inductor_mode in _INDUCTOR_WITHOUT_GRAPHS
                call = self.variant.graphs[padded] = graph_call(compiled, [x], self.compute_stream) \
                    if graphed else compiled
            return call(x)
        return self.variant.model(x)

    def launch(self, start: int, size: int) -> _Launched:
        """Queues the unit's copies, forward passes and output copies on the GPU and returns at once.

        One caller thread at a time (the actor runs one call at once). Queuing the next unit before
        collecting this one (``run_ahead``, ``standalone_ips``) keeps the GPU busy through the
        end-of-call wait, the output copy and the actor's return.
        """
        return self._launch(self.bank, start, size)

    runs_staged = True

    def launch_staged(self, staged: torch.Tensor | _InPlaceParts, start: int, count: int) -> _Launched:
        """A stream lane's piece, copied from the pinned rows ``stage`` made (the workload's bank, which
        calls from other threads use, is left alone)."""
        return self._launch(staged, 0, count)

    def _launch(self, bank: torch.Tensor | _InPlaceParts, start: int, size: int) -> _Launched:
        batch = self.spec.batch
        fixed = self.spec.backend == "inductor"  # one compiled shape: every batch runs full
        with torch.inference_mode():
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record(self.compute_stream)
            outputs: torch.Tensor | None = None
            for offset in range(0, size, batch):
                n = min(batch, size - offset)
                padded = batch if fixed else padded_batch(n, batch)  # rows n..padded: stale inputs, dropped
                slot = self._slot
                self._slot ^= 1
                converts = bank.dtype != self.dtype
                landing = self._converting_buffers(bank.dtype)[0][slot] if converts else self.dev_in[slot]
                with torch.cuda.stream(self.copy_stream):
                    self.copy_stream.wait_event(self.consumed[slot])
                    for dest, rows in self._sources(bank, start + offset, n):
                        landing[dest : dest + int(rows.shape[0])].copy_(rows, non_blocking=True)
                    self.copied[slot].record(self.copy_stream)
                with torch.cuda.stream(self.compute_stream):
                    self.compute_stream.wait_event(self.copied[slot])
                    if converts:  # one kernel: the landed dtype in, the compute dtype out, in the model's layout
                        x = self._converting_buffers(bank.dtype)[1][slot][:padded]
                        if bank.dtype == torch.uint8:  # pixels: scaled per channel in one pass
                            scale_pixels(landing[:n], self._factor, self._shift, x[:n])
                        else:
                            x[:n].copy_(landing[:n])
                    else:
                        x = self.dev_in[slot][:padded].contiguous(memory_format=self.memory_format)
                    y = self._forward(x, padded)[:n]
                    self.consumed[slot].record(self.compute_stream)
                    if outputs is None:  # pinned, one per unit: freed to torch's host cache once returned
                        outputs = torch.empty((size, *y.shape[1:]), dtype=self.out_dtype, pin_memory=True)
                    outputs[offset : offset + n].copy_(y, non_blocking=True)
            end.record(self.compute_stream)
        assert outputs is not None
        return _Launched(outputs, begin, end, bank)

    def _converting_buffers(self, landed: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Two device buffers a bank in another dtype than the compute one lands in (uint8 pixels, or
        page-locked float32 inputs left where they lie), and two the model's inputs are written to from
        them in the compute dtype and the model's layout (channels_last: no further copy); for pixels,
        the scale's factors too."""
        pixels = landed == torch.uint8
        key = (tuple(self.dev_in[0].shape), self.dtype, self.memory_format, self.pixel_scale if pixels else None)
        kept = self._converting.get(landed)
        if kept is None or kept[0] != key:
            if pixels:
                assert self.pixel_scale is not None
                a, b = self.pixel_scale.factors()
                self._factor = torch.from_numpy(a).to(self.device)
                self._shift = torch.from_numpy(b).to(self.device)
            shape = key[0]
            kept = self._converting[landed] = (key, (
                [torch.empty(shape, dtype=landed, device=self.device) for _ in range(2)],
                [torch.empty(shape, dtype=self.dtype, device=self.device).contiguous(memory_format=self.memory_format)
                 for _ in range(2)]))
        return kept[1]

    def collect(self, handle: _Launched) -> UnitResult:
        """Waits for a launched unit; ``compute_s`` is the GPU's own time on it (CUDA events), so
        a unit queued behind another is not charged for the wait."""
        handle.end.synchronize()
        compute_s = handle.begin.elapsed_time(handle.end) / 1e3
        return UnitResult(handle.outputs.numpy(), compute_s)  # keeps the pinned rows alive while used

    def run(self, start: int, size: int) -> UnitResult:
        return self.run_ahead(start, size, None)

    def ready(self, handle: _Launched) -> bool:
        return bool(handle.end.query())

    def drain(self) -> None:
        for handle in self._ahead.values():
            handle.end.synchronize()
        self._ahead = {}

    def run_ahead(self, start: int, size: int, following: tuple[int, int] | None) -> UnitResult:
        """Runs [start, start+size) — already queued if the previous call announced it — and queues
        ``following`` before waiting, all on the caller's thread (no second thread fighting the GIL
        for kernel launches while this one returns its outputs)."""
        if size >= self.spec.batch:
            self.warm_units.add(self.standalone_unit())
        handle = self._ahead.pop((start, size), None)
        self._ahead.clear()  # an announced part that was not asked for: its results are dropped
        if handle is None:
            handle = self.launch(start, size)
        if following is not None:
            self._ahead[following] = self.launch(*following)
        return self.collect(handle)

    def standalone_unit(self) -> int:
        """Eight batches: a per-call sync after every batch would understate the GPU."""
        return self.spec.batch * 8

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if torch.cuda.is_available() and hasattr(self, "device"):
            out["gpu_name"] = torch.cuda.get_device_name(self.device)
        return out
