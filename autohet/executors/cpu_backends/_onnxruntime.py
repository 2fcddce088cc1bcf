"""ONNX Runtime's CPU provider: the model exported to ONNX once (batch dimension dynamic), one session
per executor with its graph optimisations, made on the executor's pinned thread.

With ``intra_op_num_threads`` set, the session's worker threads inherit the mask of the thread that
makes the session (left at 0, ORT pins a thread per physical core, outside the group), and each
worker is bound to one core of the group, so its spinning (ORT's default, kept) burns none of another
executor's cores. ORT's CPU kernels have no bf16: fp32 only.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.executors.cpu_backends._base import CpuBackend, CpuProgram, ModelSource
from autohet.executors.cpu_backends._cache import converted

if TYPE_CHECKING:
    from autohet.executors.base import ExecutorSpec

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeProgram", "export_onnx", "in_batches", "ort_session"]


def export_onnx(module: Any, shape: tuple[int, ...], path: Any, legacy_first: bool = False) -> None:
    """``module`` as ONNX with a dynamic batch: torch's exporter, the TorchScript one where it fails
    (``legacy_first``: the TorchScript one first, the faster of the two: docs/why.md,
    executors/cpu_backends/_onnxruntime.py)."""
    import torch

    example = (torch.zeros((1, *shape)),)

    def dynamo() -> None:
        torch.onnx.export(module.eval(), example, str(path), input_names=["input"], output_names=["output"],
                          dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=65536)},),
                          external_data=False, verbose=False)

    def torchscript() -> None:
        torch.onnx.export(module.eval(), example, str(path), dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})

    first, then = (torchscript, dynamo) if legacy_first else (dynamo, torchscript)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            first()
        except Exception:  # the dynamo exporter is new and refuses some graphs; the old one traces them
            then()


def in_batches(call: Any, x: np.ndarray, batch: int) -> np.ndarray:
    """``call`` on float32 ``x`` ``batch`` images at a time, the outputs in order."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    chunks = [call(x[o : o + batch]) for o in range(0, len(x), batch)]
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def ort_session(path: Any, cores: tuple[int, ...]) -> Any:
    """An ONNX Runtime CPU session of the file at ``path`` with its graph optimisations, its intra-op
    threads one per core of ``cores`` (made on the pinned thread that calls this)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, len(cores))  # explicit: see the module doc
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # spinning stays on (ORT's default): the workers are bound to the group's own cores (below), so a
    # spinning one burns no other executor's core; off, resnet18 ran slower (docs/why.md,
    # executors/cpu_backends/_onnxruntime.py)
    if len(cores) > 1:  # the workers (all but the calling thread), one per further core, 1-based
        options.add_session_config_entry("session.intra_op_thread_affinities",
                                         ";".join(str(c + 1) for c in cores[1:]))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxRuntimeProgram(CpuProgram):
    def __init__(self, session: Any) -> None:
        self.session = session
        self.input = session.get_inputs()[0].name

    def run(self, x: np.ndarray, batch: int) -> np.ndarray:
        return in_batches(lambda part: self.session.run(None, {self.input: part})[0], x, batch)

    def describe(self) -> dict[str, Any]:
        options = self.session.get_session_options()
        return {"onnxruntime_threads": options.intra_op_num_threads}


class OnnxRuntimeBackend(CpuBackend):
    name = "onnxruntime"
    precisions = ("fp32",)
    warm_full_batch = True

    def missing(self) -> str | None:
        for package in ("onnxruntime", "onnx"):
            try:
                __import__(package)
            except ImportError:
                return f"{package} is not installed (pip install onnxruntime onnx onnxscript)"
        return None

    def build(self, source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...]) -> CpuProgram:
        import torch

        started = time.perf_counter()
        path = converted("onnx", source, shape, f"torch-{torch.__version__}", (".onnx",),
                         lambda p: export_onnx(source.module(), shape, p))
        session = ort_session(path, spec.cores)
        program = OnnxRuntimeProgram(session)
        program.compile_s = time.perf_counter() - started
        return program
