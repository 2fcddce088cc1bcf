"""How an executor runs its model beyond eager PyTorch: CUDA graphs, torch.compile (inductor),
bf16 on CPUs that have the instructions, and the compile cache that makes compilation paid once.

Eager PyTorch pays a Python kernel launch per operator; at small batches that is most of a GPU's
time, and inductor's fused kernels lift batch throughput over eager (docs/why.md,
executors/compiled.py). A backend or precision the machine cannot run is refused in one line, never
silently replaced.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from autohet.core.errors import UserError
from autohet.executors.backends import BACKENDS
from autohet.executors.machine import compile_cache_dir, cpu_flags, native_cpu_bf16, use_compile_cache
from autohet.platform.cores import pin_descendants, process_cores

__all__ = ["GraphedCall", "check_backend", "compile_cache_dir", "compile_module", "compiling_on",
           "compiling_on_process_cores", "cpu_flags", "graph_call", "native_cpu_bf16", "unsupported",
           "use_compile_cache"]

MAX_COMPILE_THREADS = 32  # inductor's own cap on its compile workers
_compile_cores: frozenset[int] | None = None  # ``compiling_on``'s cores, while it holds


def unsupported(kind: str, param: str, value: object) -> str | None:
    """Why this machine should not search ``param = value`` for executors of ``kind`` (None: fine)."""
    if kind == "cpu" and param == "precision" and value == "bf16" and not native_cpu_bf16():
        return "no AVX512-BF16/AMX on this CPU (bf16 would be emulated, slower than fp32)"
    if kind == "cpu" and param == "backend":
        from autohet.executors.cpu_backends import CPU_BACKENDS, cpu_backend

        return cpu_backend(str(value)).missing() if value in CPU_BACKENDS else None
    if kind == "gpu" and param == "precision" and value == "bf16" and torch.cuda.is_available() \
            and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    return None


def check_backend(kind: str, backend: str, precision: str, name: str) -> None:
    """Refuses (one line, the fix named) what this machine cannot run for an executor."""
    if kind == "cpu":
        from autohet.executors.cpu_backends import CPU_BACKENDS, cpu_backend

        if backend not in CPU_BACKENDS:
            raise UserError(f"executor {name}: {backend} is a GPU backend; a CPU group runs "
                            f"{', '.join(CPU_BACKENDS)}")
        if precision not in ("fp32", "bf16"):
            raise UserError(f"executor {name}: a CPU runs fp32 or bf16; set precision: fp32 or bf16")
        chosen = cpu_backend(backend)
        why = chosen.missing() or chosen.refuse(precision)
        if why:
            raise UserError(f"executor {name}: backend {backend}: {why}")
    gpu_backends = [b for b, traits in BACKENDS.items() if "gpu" in traits.devices]
    if kind == "gpu" and backend not in gpu_backends:
        raise UserError(f"executor {name}: {backend} is a CPU backend; a GPU runs {', '.join(gpu_backends)}")
    if kind == "gpu" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise UserError(f"executor {name}: this GPU has no bf16 support; set precision: fp16 or fp32")


def compile_module(module: torch.nn.Module, mode: str, example: torch.Tensor) -> tuple[Callable[..., Any], float]:
    """``torch.compile`` for one input shape, compiled now on ``example``; returns it and the seconds
    compiling took (a warm cache turns minutes into seconds of tracing)."""
    use_compile_cache()
    compiled = torch.compile(module, mode=None if mode == "default" else mode, dynamic=False)
    start = time.perf_counter()
    with compiling_on_process_cores(), torch.inference_mode():
        compiled(example)
    if example.is_cuda:
        torch.cuda.synchronize(example.device)
    return compiled, time.perf_counter() - start


@contextmanager
def compiling_on(cores: frozenset[int]) -> Iterator[None]:
    """The compiles inside on ``cores`` instead of every core of the process: an idle GPU's executor
    compiling a setting ahead while another GPU's trial is measured (``autohet.tuning.ahead``) leaves
    that GPU's feeding core alone."""
    global _compile_cores
    before, _compile_cores = _compile_cores, frozenset(cores)
    try:
        yield
    finally:
        _compile_cores = before


@contextmanager
def compiling_on_process_cores() -> Iterator[None]:
    """The calling thread moved onto every core of the process while it compiles, and inductor told to
    compile on as many workers (up to ``MAX_COMPILE_THREADS``, unless ``TORCHINDUCTOR_COMPILE_THREADS``
    says otherwise); the thread's own pinning back afterwards.

    Inductor counts its compile workers from the calling thread's affinity, and its worker processes
    inherit that thread's pinning: an executor's thread pinned to its one feeder core compiled every
    kernel in turn. A new resnet18 batch took 11-13.5 s to set up on the H200x2 box, 5.7-7.6 s after
    (BENCHMARKS.md 33, 34). A compile runs while the executor is set up, when no run of its own is
    measured; inside ``compiling_on``, on those cores instead."""
    given = _compile_cores is not None  # ahead work's cores: kept to even where they are one
    cores = set(_compile_cores if given else process_cores())
    tid = threading.get_native_id()
    if not cores or (len(cores) < 2 and not given) or not hasattr(os, "sched_setaffinity"):
        yield
        return
    import torch._inductor.config as inductor_config

    pinned = os.sched_getaffinity(tid)
    workers = int(os.environ.get("TORCHINDUCTOR_COMPILE_THREADS") or min(MAX_COMPILE_THREADS, len(cores)))
    inductor_config.compile_threads = workers
    if given:
        pin_descendants(frozenset(cores))  # workers an earlier compile started keep their cores otherwise
    os.sched_setaffinity(tid, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(tid, pinned)


class GraphedCall:
    """``fn`` captured as a CUDA graph for inputs shaped like ``examples`` on ``stream``.

    A call copies its inputs into the graph's static buffers and replays it; the output is a static
    buffer overwritten by the next replay, so a consumer reads (or copies) it first: queued on the
    same stream, that order is the stream's.
    """

    def __init__(self, fn: Callable[..., Any], examples: Sequence[torch.Tensor], stream: Any,
                 warmup: int = 3) -> None:
        self.fn = fn  # the graph reads fn's weights by address: they must live as long as the graph
        self.static_in = [t.clone() for t in examples]
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(warmup):  # cuDNN picks its algorithms here, not inside the capture
                fn(*self.static_in)
        stream.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls during the capture (a partition next to this one
        # autotuning cuDNN, a CPU device waiting on an event) neither fail nor invalidate it
        with torch.inference_mode(), torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
            self.static_out = fn(*self.static_in)

    def __call__(self, *inputs: torch.Tensor) -> Any:
        for buffer, x in zip(self.static_in, inputs, strict=True):
            if buffer.data_ptr() != x.data_ptr():
                buffer.copy_(x, non_blocking=True)
        self.graph.replay()
        return self.static_out


def graph_call(fn: Callable[..., Any], examples: Sequence[torch.Tensor], stream: Any) -> Callable[..., Any]:
    """``fn`` as a CUDA graph where it can be captured, else ``fn`` itself (host syncs or data-dependent
    control flow inside make capture fail; eager still gives the right outputs)."""
    try:
        return GraphedCall(fn, examples, stream)
    except RuntimeError:
        torch.cuda.synchronize()
        return fn
