"""The CPU backends by name (name -> ``module:class``), apart from their code: the executor's own
parameter list reads the names without importing any backend."""

from __future__ import annotations

__all__ = ["CPU_BACKENDS"]

CPU_BACKENDS: dict[str, str] = {
    "eager": "autohet.executors.cpu_backends._torch:EagerBackend",
    "inductor": "autohet.executors.cpu_backends._torch:InductorBackend",
    "openvino": "autohet.executors.cpu_backends._openvino:OpenVinoBackend",
    "onnxruntime": "autohet.executors.cpu_backends._onnxruntime:OnnxRuntimeBackend",
    "onnxruntime_nnpack": "autohet.executors.cpu_backends._nnpack:NnpackBackend",
}
