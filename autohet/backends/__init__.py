"""Block runners: a block of a partitioned model on one device, run by PyTorch or by Apache TVM.

``make_runner(graph, block, device, backend)`` gives a callable on torch tensors;
``PlacedModel(graph, assignment)`` runs a whole model with blocks on several devices;
``tune_blocks`` tunes blocks with MetaSchedule in a child process, ``TuneSession`` keeps that process for
several jobs (tvm imported lazily).
"""

from __future__ import annotations

from autohet.backends._base import BlockRunner, parse_device, parse_dtype, time_runner
from autohet.backends._placed import (
    BACKENDS,
    PlacedModel,
    PlacementMeasure,
    make_runner,
    measure_blocks,
    measure_links,
)
from autohet.backends._torch import TorchRunner

__all__ = [
    "BACKENDS", "BlockRunner", "PlacedModel", "PlacementMeasure", "TorchRunner", "TvmRunner", "TuneResult",
    "TuneSession", "make_runner", "measure_blocks", "measure_links", "parse_device", "parse_dtype", "time_runner",
    "tune_blocks", "tvm_target",
]


def __getattr__(name: str) -> object:
    """TvmRunner, tune_blocks, TuneSession, TuneResult and tvm_target load tvm-side modules only when asked for."""
    if name == "TvmRunner":
        from autohet.backends._tvm import TvmRunner

        return TvmRunner
    if name == "tvm_target":
        from autohet.backends._tvm import tvm_target

        return tvm_target
    if name in ("tune_blocks", "TuneResult", "TuneSession"):
        from autohet.backends import _tvm_tune

        return getattr(_tvm_tune, name)
    raise AttributeError(name)
