"""How a CPU core group runs its model: a backend (name -> factory) builds one program per variant.

``eager`` and ``inductor`` are PyTorch (fp32/bf16, channels_last); ``openvino`` is OpenVINO's CPU plugin
(f32, or bf16 where the CPU computes it natively; several streams, asynchronous infer requests);
``onnxruntime`` is ONNX Runtime's CPU provider (fp32); ``onnxruntime_nnpack`` is ONNX Runtime with
the wide 3x3 convolutions that NNPACK (Winograd) computes faster on the group cut out and run by
PyTorch. On a CPU, OpenVINO and ONNX Runtime run far faster per core than eager PyTorch (docs/why.md,
executors/cpu_backends), so a tune that leaves them out leaves much of the CPU's speed unused. Heavy
packages are imported only by the backend that uses them.
"""

from __future__ import annotations

import importlib

from autohet.core.errors import unknown_name
from autohet.executors.cpu_backends._base import CpuBackend, CpuProgram, ModelSource
from autohet.executors.cpu_backends._registry import CPU_BACKENDS, CPU_REFINES

__all__ = ["CPU_BACKENDS", "CPU_REFINES", "CpuBackend", "CpuProgram", "ModelSource", "cpu_backend"]


_LOADED: dict[str, CpuBackend] = {}


def cpu_backend(name: str) -> CpuBackend:
    """The backend object for ``name`` (one per process)."""
    if name not in CPU_BACKENDS:
        raise unknown_name("CPU backend", name, list(CPU_BACKENDS))
    if name not in _LOADED:
        module, _, cls = CPU_BACKENDS[name].partition(":")
        _LOADED[name] = getattr(importlib.import_module(module), cls)()
    return _LOADED[name]
