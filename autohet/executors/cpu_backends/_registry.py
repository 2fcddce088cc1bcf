"""The CPU backends by name (name -> ``module:class``), apart from their code: the executor's own
parameter list reads the names without importing any backend."""

from __future__ import annotations

__all__ = ["CPU_BACKENDS", "CPU_REFINES"]

CPU_BACKENDS: dict[str, str] = {
    "eager": "autohet.executors.cpu_backends._torch:EagerBackend",
    "inductor": "autohet.executors.cpu_backends._torch:InductorBackend",
    "openvino": "autohet.executors.cpu_backends._openvino:OpenVinoBackend",
    "onnxruntime": "autohet.executors.cpu_backends._onnxruntime:OnnxRuntimeBackend",
    "onnxruntime_nnpack": "autohet.executors.cpu_backends._nnpack:NnpackBackend",
}

# backend -> the backend whose program it refines: the same program with parts replaced only where the
# build timed them faster on the executor's own cores at its batch, so it is not slower by construction
# and a trial that cannot tell the two apart keeps the refinement. ``onnxruntime_nnpack`` swaps in
# NNPACK's convolution for each layer it measured faster (docs/why.md, executors/cpu_backends/_registry.py);
# its gain is the sum of those layers' and is easily lost in one short trial's noise
CPU_REFINES: dict[str, str] = {"onnxruntime_nnpack": "onnxruntime"}
