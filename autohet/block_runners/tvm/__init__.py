"""Apache TVM (Relax) as a block backend: ``TvmRunner`` compiles and runs a block, ``tune_blocks`` and
``TuneSession`` tune blocks with MetaSchedule in a child process, ``ensure_cuda`` makes TVM's CUDA
kernels compilable here. tvm itself is imported lazily, by the functions that need it.

``_runner``: targets, Relax import, compile and cache, ``TvmRunner``. ``_toolchain``: TVM's CUDA
runtime plugin and the CUDA C compiler (nvcc / NVRTC). ``_tune_parent``: the caller's side of tuning.
``_tune_child``: the tuning process (``python -m autohet.block_runners.tvm._tune_child``; not imported here).
"""

from __future__ import annotations

from autohet.block_runners.tvm._runner import TvmRunner, database_tag, to_relax, tune_dir, tvm_root, tvm_target
from autohet.block_runners.tvm._toolchain import cuda_worker_init, ensure_cuda
from autohet.block_runners.tvm._tune_parent import TuneResult, TuneSession, tune_blocks

__all__ = [
    "TuneResult", "TuneSession", "TvmRunner", "cuda_worker_init", "database_tag", "ensure_cuda", "to_relax",
    "tune_blocks", "tune_dir", "tvm_root", "tvm_target",
]
