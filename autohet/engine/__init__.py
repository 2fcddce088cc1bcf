"""The in-process engine: parts of one inference on several devices at once.

Devices are objects (a CPU core group with its own threads, a GPU or a partition of its SMs with
its own stream), programs are steps on devices with explicit transfers, joins and partial sums,
and one Ray actor runs any in-process strategy's job. Placement, intra-layer split, channel
partitioning and pipelining all run here, on one toolkit (``toolkit``: tensor to device, CUDA-graph
capture, timing loops, link fitting, the channels_last runner).
"""

from __future__ import annotations

from autohet.engine.devices import DTYPES, HOST, CpuDevice, Device, GpuDevice, Value
from autohet.engine.jobs import EngineActor, EngineJob, EngineResult, build_engine, device_for, run_job
from autohet.engine.program import Engine, FrameStream, Program, Step, StepTime, move, with_transfers
from autohet.engine.runs import (
    BatchOneServer,
    device_module,
    frames_through,
    pinned_host,
    request_example,
    request_latencies,
    served_request_latencies,
    stream_frames,
    timed_requests,
    whole_model_program,
)
from autohet.engine.toolkit import (
    ChannelsLast,
    fit_link,
    graphed,
    in_layout,
    mean_seconds,
    on_stream,
    seconds_each,
    step_seconds,
    time_each,
    to_device,
)

__all__ = [
    "DTYPES", "HOST", "BatchOneServer", "ChannelsLast", "CpuDevice", "Device", "Engine", "EngineActor", "EngineJob",
    "EngineResult", "FrameStream", "GpuDevice", "Program", "Step", "StepTime", "Value", "build_engine", "device_for",
    "device_module", "fit_link", "frames_through", "graphed", "in_layout", "mean_seconds", "move", "on_stream",
    "pinned_host", "request_example", "request_latencies", "run_job", "seconds_each", "served_request_latencies",
    "step_seconds", "stream_frames", "time_each", "timed_requests", "to_device", "whole_model_program",
    "with_transfers",
]
