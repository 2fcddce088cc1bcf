"""Block runners: a block of a partitioned model on one device, run by PyTorch or by Apache TVM.

``make_runner(graph, block, device, backend)`` gives a callable on torch tensors (placed models run
on ``autohet.engine``); ``tune_blocks`` tunes blocks with MetaSchedule in a child process,
``TuneSession`` keeps that process for several jobs (tvm imported lazily).
"""

from __future__ import annotations

from autohet.block_runners._base import BlockRunner, parse_device, parse_dtype, time_runner
from autohet.block_runners._make import BACKENDS, backend_of, make_runner
from autohet.block_runners._torch import TorchRunner

__all__ = [
    "BACKENDS", "BlockRunner", "TorchRunner", "TvmRunner", "TuneResult", "TuneSession", "backend_of", "make_runner",
    "parse_device", "parse_dtype", "time_runner", "tune_blocks", "tvm_target",
]


def __getattr__(name: str) -> object:
    """TvmRunner, tune_blocks, TuneSession, TuneResult and tvm_target load tvm-side modules only when asked for."""
    if name == "TvmRunner":
        from autohet.block_runners.tvm import TvmRunner

        return TvmRunner
    if name == "tvm_target":
        from autohet.block_runners.tvm import tvm_target

        return tvm_target
    if name in ("tune_blocks", "TuneResult", "TuneSession"):
        from autohet.block_runners import tvm as tvm_backend

        return getattr(tvm_backend, name)
    raise AttributeError(name)
