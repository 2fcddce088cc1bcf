"""Imports torchvision, working around PyPI's CUDA-only torchvision wheel on a CPU torch.

PyPI's torchvision 0.28 registers kernels for ``torchvision::nms`` and ``torchvision::qnms``
at import time; on a CPU-only torch build those operators' schemas do not exist and the
import fails with ``operator torchvision::nms does not exist``. Defining the two schemas
first (once, only when the plain import fails) lets it import. Nothing in autohet calls nms.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["torchvision"]  # noqa: F822 -- provided lazily by __getattr__

_SHIM_LIB = None  # keeps the torch.library.Library alive for the life of the process


def _define_missing_schemas() -> None:
    global _SHIM_LIB
    import torch

    _SHIM_LIB = torch.library.Library("torchvision", "DEF")  # noqa: TOR901
    _SHIM_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _SHIM_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _import() -> ModuleType:
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc) or _SHIM_LIB is not None:
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _define_missing_schemas()
    return importlib.import_module("torchvision")


def __getattr__(name: str) -> ModuleType:
    if name == "torchvision":
        module = _import()
        globals()["torchvision"] = module
        return module
    raise AttributeError(name)
