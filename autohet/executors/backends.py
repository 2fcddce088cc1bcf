"""Every backend by name, and what it can do: the one place a caller asks instead of comparing names.

An executor's ``backend`` (how a CPU core group or a GPU runs its whole model) and a placement's block
runner (how a partition's block runs on a device) are both backends here. A caller asks what it needs
to know — which devices run it, whether it compiles the model, whether a GPU serves batch-1 requests
of it as one CUDA-graph replay, where it stands in the tune's first GPU points, whether a block runner
queues on its own stream or needs a tuning database — and never compares a backend's name. The CPU
backends' code lives in ``executors.cpu_backends`` (their ``module:class`` there), the block runners' in
``autohet.block_runners``; this module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from autohet.core.errors import unknown_name

__all__ = ["BACKENDS", "BLOCK_RUNNERS", "EXECUTOR_BACKENDS", "PER_BLOCK", "Backend", "backend", "block_runners_for",
           "engine_backends"]


@dataclass(frozen=True)
class Backend:
    """``devices``: the executor kinds it runs a whole model on (none: a block runner only);
    ``compiles``: it traces and compiles the model first (minutes; dynamo's tracing patches
    nn.Module.__call__ for the whole process, so such an executor loads alone); ``request_graph``: a GPU
    serves batch-1 requests of it as one CUDA-graph replay; ``gpu_first``: its place in the tune's first
    GPU points (the compiled backends first; None: after them); ``blocks``: it runs a partition's blocks
    (placement); ``own_stream``: as a block runner it queues on a CUDA stream of its own (its calls are
    ordered by synchronising); ``needs_tuning``: untuned it is 50-150x slower than PyTorch, so it runs only
    where a tuning database exists; ``device_format``: as a block runner it runs in the engine device's
    precision and memory layout (else in its own compiled format); ``engine_on``: the device kinds on which
    the engine families (pipeline, split, coedge, channels; placement with its torch block runner) run a
    model the way this backend runs it whole: eager PyTorch on a CPU, captured as a CUDA graph on a GPU (their
    default), so its standalone figure there is what they are measured against (``engine_backends``)."""

    name: str
    devices: frozenset[str] = frozenset()
    compiles: bool = False
    request_graph: bool = False
    gpu_first: int | None = None
    blocks: bool = False
    own_stream: bool = False
    needs_tuning: bool = False
    device_format: bool = False
    engine_on: frozenset[str] = frozenset()


_CPU, _GPU, _BOTH = frozenset({"cpu"}), frozenset({"gpu"}), frozenset({"cpu", "gpu"})

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("eager", _BOTH, engine_on=_CPU),
    Backend("inductor", _BOTH, compiles=True, request_graph=True, gpu_first=0),
    Backend("cudagraphs", _GPU, request_graph=True, gpu_first=1, engine_on=_GPU),
    Backend("openvino", _CPU),
    Backend("onnxruntime", _CPU),
    Backend("onnxruntime_nnpack", _CPU),
    Backend("torch", blocks=True, device_format=True),
    Backend("tvm", blocks=True, own_stream=True, needs_tuning=True),
)}
EXECUTOR_BACKENDS = tuple(name for name, b in BACKENDS.items() if b.devices)
BLOCK_RUNNERS = tuple(name for name, b in BACKENDS.items() if b.blocks)
PER_BLOCK = "per_block"  # a placement's choice: each (block, device) runs with the block runner measured faster


def backend(name: str) -> Backend:
    """The registered backend of that name; an unknown name is a UserError listing the valid ones."""
    if name not in BACKENDS:
        raise unknown_name("backend", name, list(BACKENDS))
    return BACKENDS[name]


def block_runners_for(choice: str) -> tuple[str, ...]:
    """The block runners a placement's ``backend`` choice names: one, or every one for ``per_block``."""
    return BLOCK_RUNNERS if choice == PER_BLOCK else (backend(choice).name,)


def engine_backends(kind: str) -> tuple[str, ...]:
    """The executor backends whose figure on a device of ``kind`` is the engine families' own way of running it."""
    return tuple(name for name, b in BACKENDS.items() if kind in b.engine_on)
