"""Programs: the steps of one inference spread over devices, and the engine that runs them.

A program is a list of steps in topological order; each step runs on one device and reads and
writes named values. Moving a value between devices is an explicit ``transfer`` step (inserted by
``with_transfers``); joins (``concat``) and partial-sum reductions (``sum``) are ordinary steps on
the device that owns the result. The engine queues every step on its device's worker as soon as
the program is submitted: steps on different devices run at once, and frames submitted back to
back overlap (stage k of frame n beside stage k+1 of frame n-1). Queuing in topological order
cannot deadlock: a step only waits for steps queued before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from autohet.engine.devices import HOST, Device, HostDevice, Value
from autohet.platform.gc_control import let_go

__all__ = ["Engine", "FrameStream", "Program", "Step", "StepTime", "move", "transfer_worker", "with_transfers"]


@dataclass(frozen=True)
class Step:
    """``fn(*input tensors) -> tensor | tuple`` run on ``device``; a transfer step has no fn: it moves
    its one input to ``to`` (it runs on the worker that issues the copy), only rows ``rows`` of its
    dim 2 (image height) when given: a row slice or a halo, not the whole tensor."""

    name: str
    device: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fn: Callable[..., Any] | None = None
    kind: str = "compute"  # compute | transfer | join | sum
    to: str | None = None
    rows: tuple[int, int] | None = None


@dataclass
class Program:
    steps: list[Step]
    inputs: tuple[str, ...]
    output: str
    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        known = set(self.inputs)
        for step in self.steps:
            missing = [v for v in step.inputs if v not in known]
            if missing:
                raise ValueError(f"step {step.name} reads {missing[0]} before any step writes it")
            known.update(step.outputs)
        if self.output not in known:
            raise ValueError(f"no step writes the program output {self.output}")
        self.devices = tuple(dict.fromkeys(s.device for s in self.steps))


@dataclass
class StepTime:
    """Seconds a step took on its device (GPU steps by CUDA events) and when it started on the host."""

    step: str
    device: str
    kind: str
    seconds: float
    started: float


def with_transfers(steps: Sequence[Step], inputs: Sequence[str], output: str,
                   devices: Mapping[str, Device]) -> Program:
    """A program from compute steps: a transfer step is inserted wherever a step reads a value that
    lives on another device (once per value and destination), and the output is moved to the host.
    Transfers run on the GPU side of each copy (a CPU-to-CPU transfer is a reference, no copy)."""
    where: dict[str, str] = dict.fromkeys(inputs, HOST)
    copies: dict[tuple[str, str], str] = {}
    out: list[Step] = []

    def on(value: str, device: str) -> str:
        src = where[value]
        if src == device:
            return value
        key = (value, device)
        if key not in copies:
            copies[key] = f"{value}@{device}"
            worker = transfer_worker_name(devices, src, device)
            out.append(Step(f"move {value} {src}->{device}", worker, (value,), (copies[key],), kind="transfer",
                            to=device))
            where[copies[key]] = device
        return copies[key]

    for step in steps:
        moved = tuple(on(v, step.device) for v in step.inputs)
        out.append(Step(step.name, step.device, moved, step.outputs, step.fn, step.kind, step.to))
        where.update(dict.fromkeys(step.outputs, step.device))
    final = on(output, HOST)
    return Program(out, tuple(inputs), final)


def transfer_worker_name(devices: Mapping[str, Device], src: str, dst: str) -> str:
    """Which worker issues a copy: the GPU side (its stream orders the copy after the producer or
    before the consumer); between CPU devices and the host, the side that is not the host."""
    if devices[src].on_gpu:
        return src
    if devices[dst].on_gpu or dst != HOST:
        return dst
    return src


def transfer_worker(engine: Engine, src: str, dst: str) -> Device:
    return engine[transfer_worker_name(engine.devices, src, dst)]


def move(value: Value, src: Device, dst: Device, worker: Device) -> Value:
    """Copies a value between devices on ``worker`` (the GPU side of the copy)."""
    if not src.on_gpu and not dst.on_gpu:
        t = src.accept(value) if value.event is not None else value.tensor
        return Value(t, dst.name)
    if not src.on_gpu:  # host/CPU -> GPU from pinned memory, on the GPU's copy stream
        t = value.tensor
        if value.event is not None:
            value.event.synchronize()
        with torch.cuda.stream(dst.copy_stream):
            pinned = t if t.is_pinned() else torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
            moved = pinned.to(dst.torch_device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(dst.copy_stream)
        moved.record_stream(dst.stream)  # its memory is not reused before the compute that reads it is done
        return Value(moved, dst.name, ready)
    t = src.accept(value)
    with torch.cuda.stream(src.stream):
        if not dst.on_gpu:  # GPU -> host/CPU: into pinned memory, ready when the event fires
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            return Value(host, dst.name, src.publish(host).event)
        # GPU -> GPU (another GPU, or another partition of this one): a copy the source may not overwrite
        copy = t.to(dst.torch_device, non_blocking=True) if dst.torch_device != src.torch_device else t.clone()
        # its memory is not reused before the destination's compute has read it: allocated for another
        # GPU's current stream, freed after its consumer it was handed to the next frame's copy, which the
        # source's stream wrote while the consumer's stream still read it (a two-GPU pipeline failed its
        # output check: docs/why.md, engine/program.py)
        copy.record_stream(dst.stream)
        return Value(copy, dst.name, src.publish(copy).event)


class Engine:
    """The devices of one process and the runner of programs over them."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices: dict[str, Device] = {HOST: HostDevice()}
        for device in devices:
            if device.name in self.devices:
                raise ValueError(f"two devices named {device.name}")
            self.devices[device.name] = device.start()

    def __getitem__(self, name: str) -> Device:
        return self.devices[name]

    @property
    def compute_devices(self) -> list[Device]:
        return [d for n, d in self.devices.items() if n != HOST]

    def close(self) -> None:
        for device in self.compute_devices:
            device.close()
        let_go()  # the devices' models, for the next settle to free

    def submit(self, program: Program, feeds: Mapping[str, Any],
               timings: list[StepTime] | None = None) -> Future:
        """Queues every step of the program; the future gives the output tensor on the host."""
        values: dict[str, tuple[Future, int]] = {}
        for name in program.inputs:
            ready: Future = Future()
            ready.set_result((Value(feeds[name], HOST),))
            values[name] = (ready, 0)
        last: Future | None = None
        for step in program.steps:
            worker = self.devices[step.device]
            sources = [values[v] for v in step.inputs]
            last = worker.submit(lambda s=step, w=worker, src=sources: self._run(s, w, src, timings))
            for k, name in enumerate(step.outputs):
                values[name] = (last, k)
        future, index = values[program.output]
        result: Future = Future()

        def deliver(done: Future) -> None:
            try:
                value = done.result()[index]
                result.set_result(value)
            except BaseException as exc:  # the failing step's error reaches the caller
                result.set_exception(exc)

        future.add_done_callback(deliver)
        return result

    def run(self, program: Program, feeds: Mapping[str, Any], timings: list[StepTime] | None = None) -> Any:
        """Runs one frame to completion; the output tensor is in host memory."""
        value = self.submit(program, feeds, timings).result()
        return self.devices[HOST].accept(value)

    def output(self, future: Future) -> Any:
        return self.devices[HOST].accept(future.result())

    def _run(self, step: Step, worker: Device, sources: list[tuple[Future, int]],
             timings: list[StepTime] | None) -> tuple[Value, ...]:
        inputs = [f.result()[k] for f, k in sources]
        started = time.perf_counter()
        if worker.on_gpu and timings is not None:
            moving_in = step.kind == "transfer" and not self.devices[inputs[0].device].on_gpu
            timed_on = worker.copy_stream if moving_in else worker.stream  # the stream that carries the step
            begin = torch.cuda.Event(enable_timing=True)
            begin.record(timed_on)
        if step.kind == "transfer":
            src = self.devices[inputs[0].device]
            value = inputs[0]
            if step.rows is not None:  # a view: the copy below reads only these rows
                value = Value(value.tensor[:, :, step.rows[0]:step.rows[1]], value.device, value.event)
            outs: tuple[Value, ...] = (move(value, src, self.devices[step.to or HOST], worker),)
        else:
            tensors = [worker.accept(v) for v in inputs]
            if worker.on_gpu:
                with torch.cuda.stream(worker.stream), torch.inference_mode():
                    result = step.fn(*tensors)
            else:
                with torch.inference_mode():
                    result = step.fn(*tensors)
            results = result if isinstance(result, tuple) else (result,)
            if worker.on_gpu:
                event = worker.publish(results[0]).event
                outs = tuple(Value(r, worker.name, event) for r in results)
            else:
                outs = tuple(worker.publish(r) for r in results)
        if timings is not None:
            if worker.on_gpu:
                end = torch.cuda.Event(enable_timing=True)
                end.record(timed_on)
                end.synchronize()
                seconds = begin.elapsed_time(end) / 1e3
            else:
                seconds = time.perf_counter() - started
            timings.append(StepTime(step.name, worker.name, step.kind, seconds, started))
        return outs


@dataclass
class FrameStream:
    """Frames submitted back to back with at most ``depth`` in flight: a pipeline's steady state."""

    engine: Engine
    program: Program
    depth: int = 2
    pending: list[Future] = field(default_factory=list)

    def push(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Submits a frame; returns the outputs of frames that had to finish first (in order)."""
        done = []
        while len(self.pending) >= self.depth:
            done.append(self.engine.output(self.pending.pop(0)))
        self.pending.append(self.engine.submit(self.program, feeds))
        return done

    def drain(self) -> list[Any]:
        out = [self.engine.output(f) for f in self.pending]
        self.pending = []
        return out
