"""The Apache TVM (Relax) runner: import a block, compile it per target, cache the library, run it.

A block is exported with ``torch.export`` and imported with
``tvm.relax.frontend.torch.from_exported_program(keep_params_as_input=True)``: weights are inputs of
the compiled function, not constants, so one compiled library serves every weight seed and is
cached by the block's weight-free signature. If a MetaSchedule database exists for the model and
target (``runs/tvm/<model>/<target-key>/``), compilation applies it (``compile_relax``);
otherwise TVM's default schedules are used, which are far slower than PyTorch on CPU.
Tensors cross between torch and TVM by DLPack without copies. tvm is imported lazily.

How CUDA kernels get compiled is ``_toolchain``'s business; ``export_so`` and ``warm_worker`` are here,
not in ``_tune_child``, because MetaSchedule's worker processes import them by module path, and the
tuning child runs as ``__main__``.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from autohet.block_runners._base import parse_device, parse_dtype
from autohet.block_runners.tvm._toolchain import _first_line, ensure_cuda
from autohet.core.errors import UserError
from autohet.core.settings import env
from autohet.partition import Block
from autohet.platform.fingerprint import usable_cores

__all__ = ["TvmRunner", "database_tag", "export_so", "fused_for_tuning", "import_tensor_intrin", "to_relax",
           "tune_dir", "tvm_root", "tvm_target", "warm_worker"]

_LOCK = threading.Lock()
# Bumped whenever the import/lowering recipe changes, so stale cached libraries are not loaded.
_RECIPE = "r2"


def tvm_root() -> Path:
    """Where tuning databases and compiled libraries live (AUTOHET_TVM_DIR, default runs/tvm)."""
    return Path(env("AUTOHET_TVM_DIR") or "runs/tvm")


def tvm_target(device: str) -> tuple[dict[str, Any], str]:
    """The TVM target dict for a torch device and a short key naming it in paths."""
    import tvm

    dev = parse_device(device)
    if dev.type == "cpu":
        mcpu = tvm.target.codegen.llvm_get_system_cpu()
        return {"kind": "llvm", "mcpu": mcpu, "num-cores": usable_cores()}, f"llvm-{mcpu}"
    major, minor = torch.cuda.get_device_capability(dev)
    arch = f"sm_{major}{minor}"
    props = torch.cuda.get_device_properties(dev)
    # MetaSchedule's CUDA rules read these (AutoBind fails without max_threads_per_block); the values
    # are those of TVM's "nvidia/nvidia-h100" tag, with the device's own where torch reports them.
    # 48 KiB is the static shared memory a block may use without opting in.
    target: dict[str, Any] = {
        "kind": "cuda", "arch": arch, "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152,
        "thread_warp_size": int(getattr(props, "warp_size", 32) or 32), "registers_per_block": 65536,
    }
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    if l2 > 0:
        target["l2_cache_size_bytes"] = l2
    return target, f"cuda-{arch}"


def tune_dir(model: str, target_key: str) -> Path:
    safe = model.replace(":", "_").replace("/", "_")
    return tvm_root() / safe / target_key


def database_tag(work_dir: Path | None) -> str:
    """'untuned', or a hash of the tuning records, so a library compiled before more tuning is not reused."""
    if work_dir is None:
        return "untuned"
    records = work_dir / "database_tuning_record.json"
    if not records.is_file() or records.stat().st_size == 0:
        return "untuned"
    return "db" + hashlib.sha256(records.read_bytes()).hexdigest()[:12]


def to_relax(block: Block, example: tuple[torch.Tensor, ...]) -> tuple[Any, list[Any]]:
    """(Relax IRModule with weights as inputs, the raw weights in the order
    ``main_transform_params`` takes them; its result is what ``main`` takes after the input)."""
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own pytree deprecation notes
        exported = torch.export.export(block.module, tuple(t.cpu().float() for t in example))
        mod = from_exported_program(exported, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    mod, params = relax.frontend.detach_params(mod)
    # Weight-only work (linear weight transposes, batch-norm scale/shift) moves to
    # main_transform_params, run once per runner instead of on every call.
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.LiftTransformParams()(mod)
    return mod, list(params.get("main", []))


def fused_for_tuning(mod: Any, target: dict[str, Any]) -> Any:
    """The module lowered to fused TIR exactly as ``compile_relax`` does before it applies the
    database, so the tuned workloads' hashes match those looked up at compile time."""
    import tvm
    from tvm import relax

    tvm_tgt = tvm.target.Target(target)
    try:
        dispatch = relax.pipeline.library_dispatch_passes(tvm_tgt)
    except (ValueError, AttributeError):
        dispatch = []
    seq = tvm.transform.Sequential([
        *dispatch, relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])
    with tvm_tgt, tvm.transform.PassContext(opt_level=3):
        return seq(mod)


def _compile(mod: Any, target: dict[str, Any], work_dir: Path | None) -> Any:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    tvm_tgt = tvm.target.Target(target)
    if database_tag(work_dir) == "untuned":
        return tvm.compile(mod, tvm_tgt)
    database = ms.database.JSONDatabase(work_dir=str(work_dir), module_equality="structural")
    with tvm_tgt:
        return ms.relax_integration.compile_relax(database, mod, tvm_tgt, params=None)


def export_so(mod: Any) -> str:
    """MetaSchedule builder export for CUDA: a linked shared library rather than TVM's default tar, so the
    linking happens in the parallel builder workers and the one runner process only loads it."""
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="autohet_ms_"), "tvm_tmp_mod.so")
    mod.export_library(path)
    return path


def import_tensor_intrin() -> None:
    """``import tvm.s_tir.tensor_intrin``, which MetaSchedule's tune contexts and builds need, without its
    one waste: each of its ~500 ``T.prim_func`` calls ``inspect.stack()``, whose ``inspect.getmodule``
    scans all of ``sys.modules`` (~2000 with torch) for every frame of the frozen import machinery, only
    to return None for it (a frame has no ``__module__`` or ``__name__``, and no module's file is
    ``<frozen ...>``). Here such a frame's None comes at once, which makes the import several times
    faster (docs/why.md, block_runners/tvm); every other lookup, and everything after the import, is
    inspect's own."""
    import inspect
    import sys

    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    real = inspect.getmodule

    def getmodule(obj: Any, _filename: str | None = None) -> Any:
        code = getattr(obj, "f_code", None)
        name = _filename or (code.co_filename if code is not None else "")
        if code is not None and name.startswith("<frozen ") and name.endswith(">"):
            return None
        return real(obj, _filename)

    inspect.getmodule = getmodule
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.getmodule = real


def warm_worker() -> None:
    """Run once in each builder worker at the start of tuning: the import every build needs
    (``import_tensor_intrin``)."""
    import_tensor_intrin()


def _export(lib: Any, path: Path) -> None:
    """Writes the library to the cache; a failure (no C compiler to link it, say) only costs the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.so")
    try:
        lib.export_library(str(tmp))
        tmp.replace(path)
    except Exception as err:  # noqa: BLE001
        tmp.unlink(missing_ok=True)
        warnings.warn(f"TVM library not cached ({_first_line(err)})", RuntimeWarning, stacklevel=3)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """TVM takes DLPack tensors only at 64-byte aligned addresses; a torch view (e.g. a slice that a
    torch block returned) can start anywhere, so such inputs are copied once (aligned ones are not)."""
    if t.data_ptr() % 64 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


class TvmRunner:
    """A block compiled by TVM for one device; the library is cached under ``runs/tvm/cache``."""

    backend = "tvm"

    def __init__(self, block: Block, device: str = "cpu", dtype: str | torch.dtype | None = None, *,
                 model: str | None = None, tuned: bool = True, cache: bool = True) -> None:
        import tvm
        from tvm import relax

        if parse_dtype(dtype) != torch.float32:
            raise UserError("the tvm backend compiles float32 blocks; use --backend torch for fp16/bf16")
        self.block = block
        self._dev = parse_device(device)
        self.device = str(self._dev)
        self.target, self.target_key = tvm_target(self.device)
        self.cuda_compiler = ensure_cuda(self.target) if self._dev.type == "cuda" else None
        model = model or "model"
        work_dir = tune_dir(model, self.target_key) if tuned else None
        self.tag = database_tag(work_dir)
        self.tuned = self.tag != "untuned"
        example = block.example_inputs()
        mod, params = to_relax(block, example)
        path = tvm_root() / "cache" / model.replace(":", "_") / (
            f"{block.signature}-{self.target_key}-{self.tag}-{_RECIPE}-tvm{tvm.__version__}.so")
        self.library = path
        self.from_cache = cache and path.is_file()
        with _LOCK:
            if self.from_cache:
                lib = tvm.runtime.load_module(str(path))
            else:
                lib = _compile(mod, self.target, work_dir)
                if cache:
                    _export(lib, path)
        self._tvm_dev = tvm.cpu() if self._dev.type == "cpu" else tvm.cuda(self._dev.index or 0)
        self.vm = relax.VirtualMachine(lib, self._tvm_dev)
        self._main = self.vm["main"]
        weights = [tvm.runtime.tensor(p.numpy(), self._tvm_dev) for p in params]
        self._params = list(self.vm["main_transform_params"](weights))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        import tvm

        args = [tvm.runtime.from_dlpack(_aligned(t.to(device=self._dev, dtype=torch.float32).contiguous()))
                for t in inputs]
        out = self._main(*args, *self._params)
        if isinstance(out, tvm.runtime.Tensor):
            return torch.from_dlpack(out)
        return tuple(torch.from_dlpack(o) for o in out)

    def sync(self) -> None:
        self._tvm_dev.sync()
