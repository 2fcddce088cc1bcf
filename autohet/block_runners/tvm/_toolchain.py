"""How TVM turns generated CUDA C into kernels in this process, its workers and its children.

Kept apart from the runner because it is toolchain plumbing, not TVM usage: TVM 0.27 turns the
generated CUDA C into a cubin through the Python callback ``tvm_callback_cuda_compile``
(``tvm/support/nvcc.py``: NVRTC through the ``cuda-bindings`` package by default, ``nvcc`` with
``TVM_CUDA_COMPILE_MODE=nvcc``), which needs the CUDA headers of a toolkit. ``ensure_cuda`` checks that
TVM's CUDA runtime plugin loaded, probes that callback once and, where it fails, registers a callback
that calls libnvrtc directly (``ctypes``, no headers), then nvcc; the choice is kept in
``AUTOHET_TVM_CUDA_COMPILER`` so child processes (``cuda_child_env``) and MetaSchedule's workers
(``cuda_worker_init``) make the same one without probing. tvm is imported lazily.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from autohet.core.errors import UserError
from autohet.core.settings import env

__all__ = ["cuda_child_env", "cuda_worker_init", "ensure_cuda"]

_MODE_ENV = "AUTOHET_TVM_CUDA_COMPILER"  # "tvm", "nvcc:<bin dir>" or "nvrtc:<libnvrtc path>"
_ARCH_ENV = "AUTOHET_TVM_CUDA_ARCH"
_CUDA_FIX = ("make CUDA kernels compilable: put a CUDA toolkit's nvcc on PATH, or `pip install nvidia-cuda-nvrtc` "
             "(or set AUTOHET_NVRTC_LIB=/path/to/libnvrtc.so)")
_APPLIED: dict[str, str] = {}

# What TVM's CUDA codegen puts in front of every kernel file, and a kernel: compiling it shows that a
# compiler works the way TVM calls it (headers included).
_PROBE = r"""
#ifdef __CUDACC_RTC__
  #include <cuda/std/cstdint>
  #include <cuda/std/type_traits>
  using cuda::std::int64_t;
#else
  #include <cstdint>
  #include <type_traits>
  #include <cuda.h>
#endif
extern "C" __global__ void __launch_bounds__(32) autohet_probe(float* __restrict__ out) {
  int64_t i = (int64_t)threadIdx.x;
  float2 v = make_float2(1.0f, 2.0f);
  out[i] = fmaxf(v.x, v.y) + expf(0.0f);
}
"""

# Stands in for the libcu++ headers (cuda/std/...) that TVM's generated code includes under NVRTC, so
# that libnvrtc alone compiles it: the fixed-width integers and the few type traits it names.
_CCCL_STUB = r"""
namespace cuda { namespace std {
typedef signed char int8_t; typedef unsigned char uint8_t; typedef short int16_t; typedef unsigned short uint16_t;
typedef int int32_t; typedef unsigned int uint32_t; typedef long long int64_t; typedef unsigned long long uint64_t;
template <class T, T v> struct integral_constant { static constexpr T value = v; };
template <class T, class U> struct is_same : integral_constant<bool, false> {};
template <class T> struct is_same<T, T> : integral_constant<bool, true> {};
template <class T, class U> constexpr bool is_same_v = is_same<T, U>::value;
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <bool B, class T, class F> struct conditional { typedef T type; };
template <class T, class F> struct conditional<false, T, F> { typedef F type; };
template <class T> struct is_floating_point
  : integral_constant<bool, is_same<T, float>::value || is_same<T, double>::value> {};
template <class T> struct is_integral : integral_constant<bool,
  is_same<T, bool>::value || is_same<T, char>::value || is_same<T, signed char>::value ||
  is_same<T, unsigned char>::value || is_same<T, short>::value || is_same<T, unsigned short>::value ||
  is_same<T, int>::value || is_same<T, unsigned int>::value || is_same<T, long>::value ||
  is_same<T, unsigned long>::value || is_same<T, long long>::value || is_same<T, unsigned long long>::value> {};
template <class T> struct is_signed
  : integral_constant<bool, (is_integral<T>::value || is_floating_point<T>::value) && T(-1) < T(0)> {};
template <class T> struct is_unsigned : integral_constant<bool, is_integral<T>::value && T(0) < T(-1)> {};
}}
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
"""
_CCCL_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<cuda/std/[\w/]+>[ \t]*$", re.M)


def _lib_dirs() -> list[Path]:
    """Where CUDA libraries may be: pip's nvidia/* packages on sys.path (torch's CUDA), torch/lib, the
    folders of CUDA libraries already loaded, CUDA_PATH / CUDA_HOME and /usr/local/cuda."""
    dirs: list[Path] = []
    for entry in sys.path:
        root = Path(entry or ".")
        dirs += sorted(root.glob("nvidia/*/lib")) + sorted(root.glob("nvidia/*/lib64"))
    torch_lib = Path(torch.__file__).parent / "lib"
    dirs.append(torch_lib)
    try:
        maps = Path("/proc/self/maps").read_text()
        dirs += [Path(m).parent for m in re.findall(r"(/\S+/lib(?:cudart|nvrtc)[\w.-]*\.so[\d.]*)", maps)]
    except OSError:
        pass  # no /proc: the other places below are searched
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            root = Path(os.environ[var])
            dirs += [root / "lib64", root / "lib", root / "targets" / "x86_64-linux" / "lib"]
    dirs += [Path("/usr/local/cuda/lib64"), Path("/usr/local/cuda/targets/x86_64-linux/lib")]
    seen: list[Path] = []
    for d in dirs:
        if d.is_dir() and d not in seen:
            seen.append(d)
    return seen


def _find_lib(stem: str) -> list[str]:
    """Paths of ``<stem>.so*`` in ``_lib_dirs`` (newest version first in each folder), then the loader's own."""
    found = []
    for d in _lib_dirs():
        for f in sorted(d.glob(f"{stem}.so*"), key=lambda p: p.name, reverse=True):
            if ".alt." not in f.name and f.is_file():
                found.append(str(f))
    name = ctypes.util.find_library(stem.removeprefix("lib"))
    if name:
        found.append(name)
    return found


class _Nvrtc:
    """libnvrtc through ctypes: CUDA C to a cubin for one architecture, in this process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        major, minor = ctypes.c_int(), ctypes.c_int()
        if self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            raise RuntimeError(f"nvrtcVersion failed in {path}")
        self.version = (major.value, minor.value)
        # libnvrtc dlopens libnvrtc-builtins.so.<major>.<minor> by name when it compiles; from a pip
        # wheel that folder is not on the loader's path, so load it first (found then by its soname).
        folder = Path(path).parent if os.sep in path else None
        builtins = folder / f"libnvrtc-builtins.so.{major.value}.{minor.value}" if folder else None
        if builtins is not None and builtins.is_file():
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        self.include_dirs = _cccl_include_dirs()

    def compile(self, code: str, arch: str) -> bytes:
        """The cubin for ``arch`` (sm_XY); TVM's libcu++ includes replaced by ``_CCCL_STUB`` first, and the
        code as it is, with libcu++ include folders, if that fails and such folders exist."""
        attempts = [(_CCCL_STUB + _CCCL_INCLUDE.sub("", code), [])]
        if self.include_dirs:
            attempts.append((code, [f"-I{d}" for d in self.include_dirs]))
        log = ""
        for source, extra in attempts:
            ok, out = self._compile_once(source, arch, extra)
            if ok:
                return out
            log = out.decode(errors="replace")
        raise RuntimeError(f"NVRTC {self.version[0]}.{self.version[1]} ({self.path}) could not compile the kernels "
                           f"for {arch}:\n{log[-3000:]}")

    def _compile_once(self, source: str, arch: str, extra: list[str]) -> tuple[bool, bytes]:
        lib = self.lib
        prog = ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"tvm_kernels.cu", 0, None, None)
        if rc != 0:
            return False, b"nvrtcCreateProgram: " + lib.nvrtcGetErrorString(rc)
        try:
            opts = [f"--gpu-architecture={arch}", "-default-device", "--std=c++17", "--use_fast_math", *extra]
            argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
            size = ctypes.c_size_t()
            if rc != 0:
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value + 1)
                lib.nvrtcGetProgramLog(prog, log)
                return False, lib.nvrtcGetErrorString(rc) + b"\n" + log.value
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, cubin)
            return True, cubin.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _cccl_include_dirs() -> list[str]:
    """Folders holding libcu++'s cuda/std/cstdint (a toolkit's, or pip's nvidia-cuda-cccl)."""
    roots = []
    for entry in sys.path:
        roots += sorted(Path(entry or ".").glob("nvidia/*/include"))
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]) / "include")
            roots.append(Path(os.environ[var]) / "targets" / "x86_64-linux" / "include")
    roots += [Path("/usr/local/cuda/include"), Path("/usr/local/cuda/targets/x86_64-linux/include")]
    out = []
    for root in roots:
        for d in (root, root / "cccl"):
            if (d / "cuda" / "std" / "cstdint").is_file() and str(d) not in out:
                out.append(str(d))
    return out


def _current_arch(default: str) -> str:
    """The arch of the CUDA target in scope when TVM calls the compile callback, else ``default``."""
    import tvm

    current = tvm.target.Target.current(allow_none=True)
    arch = getattr(current, "arch", None) if current is not None and current.kind.name == "cuda" else None
    return arch if isinstance(arch, str) and arch.startswith("sm_") else default


def _register_nvrtc(path: str, arch: str) -> None:
    import tvm_ffi

    nvrtc = _Nvrtc(path)

    def compile_cuda(code: str, *_: Any) -> bytes:
        return nvrtc.compile(code, _current_arch(arch))

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)


def _register_tvm_callback(arch: str) -> None:
    """TVM's own callback (NVRTC via cuda-bindings, or nvcc), called inside a CUDA target scope so that
    it knows the arch even where no GPU is visible and TVM calls it without one."""
    import tvm
    import tvm.support.nvcc as tvm_nvcc
    import tvm_ffi

    def compile_cuda(code: str, *_: Any) -> bytes:
        with tvm.target.Target({"kind": "cuda", "arch": _current_arch(arch)}):
            return tvm_nvcc.tvm_callback_cuda_compile(code)

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)


def _nvcc_dir() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return str(Path(found).parent)
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin")
    return None


def _apply_mode(mode: str, arch: str) -> None:
    """Makes this process compile CUDA the way ``mode`` says (see ``_MODE_ENV``)."""
    if _APPLIED.get(arch) == mode:
        return
    kind, _, where = mode.partition(":")
    if kind == "nvrtc":
        _register_nvrtc(where, arch)
    elif kind in ("tvm", "nvcc"):
        if kind == "nvcc":
            os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
            if where and where not in os.environ.get("PATH", "").split(os.pathsep):
                os.environ["PATH"] = where + os.pathsep + os.environ.get("PATH", "")
        _register_tvm_callback(arch)
    else:
        raise UserError(f"{_MODE_ENV}={mode!r} is not one of tvm, nvcc[:BIN_DIR], nvrtc:LIBNVRTC_PATH")
    _APPLIED[arch] = mode


def _probe() -> None:
    """Compiles ``_PROBE`` through the ``tvm_callback_cuda_compile`` registered now, as TVM calls it."""
    import tvm_ffi

    out = bytes(tvm_ffi.get_global_func("tvm_callback_cuda_compile")(_PROBE))
    if not out:
        raise RuntimeError("empty output")


def _first_line(err: BaseException | None) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


def _ensure_cuda_compiler(target: dict[str, Any]) -> str:
    arch = str(target["arch"])
    os.environ[_ARCH_ENV] = arch
    mode = os.environ.get(_MODE_ENV)
    if mode:  # chosen by a parent process (or by hand): no probing
        _apply_mode(mode, arch)
        return mode
    # 1. TVM's own callback as configured: NVRTC via cuda-bindings plus a toolkit's headers (found from
    #    CUDA_PATH or nvcc's folder), or nvcc with TVM_CUDA_COMPILE_MODE=nvcc. 2. libnvrtc alone, called
    #    by us (pip's nvidia-cuda-nvrtc, which torch installs, is enough). 3. nvcc through TVM's callback.
    own = env("AUTOHET_NVRTC_LIB")
    nvrtc_libs = [own] if own else _find_lib("libnvrtc")
    nvcc = _nvcc_dir()
    candidates = ["tvm", *(f"nvrtc:{p}" for p in nvrtc_libs), *([f"nvcc:{nvcc}"] if nvcc else [])]
    tried = [] if nvrtc_libs else ["libnvrtc (not found)"]
    if not nvcc:
        tried.append("nvcc (not on PATH, CUDA_PATH or /usr/local/cuda)")
    saved = os.environ.get("TVM_CUDA_COMPILE_MODE")
    for candidate in candidates:
        try:
            _apply_mode(candidate, arch)
            _probe()
            mode = candidate
            break
        except Exception as err:  # noqa: BLE001 - any failure means: try the next compiler
            label = f"TVM's {saved or 'nvrtc'}" if candidate == "tvm" else candidate.replace(":", " ", 1)
            tried.append(f"{label} ({_first_line(err)})")
            _APPLIED.pop(arch, None)
            if saved is None:
                os.environ.pop("TVM_CUDA_COMPILE_MODE", None)
            else:
                os.environ["TVM_CUDA_COMPILE_MODE"] = saved
    if mode is None:
        raise UserError(f"TVM cannot compile CUDA kernels for {arch}: {'; '.join(tried)}. Fix: {_CUDA_FIX}")
    os.environ[_MODE_ENV] = mode
    print(f"autohet: TVM compiles CUDA kernels for {arch} with {mode}"
          + (f" (not: {'; '.join(tried)})" if tried else ""), file=sys.stderr, flush=True)
    return mode


def _ensure_cuda_runtime() -> None:
    """TVM loads its CUDA runtime plugin (libtvm_runtime_cuda.so, which needs libcudart and the driver's
    libcuda) at import and stays silent when that fails; load it here, from torch's CUDA folders if need be."""
    import tvm

    if tvm.runtime.enabled("cuda"):
        return
    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    error: BaseException | None = None
    for _ in range(4):
        try:
            _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
                package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL")
            error = None
            break
        except (OSError, RuntimeError) as err:
            error = err
            missing = re.search(r"(lib[\w.+-]+?\.so[\d.]*): cannot open shared object", str(err))
            paths = _find_lib(missing.group(1).split(".so")[0]) if missing else []
            paths = [p for p in paths if Path(p).name == missing.group(1)] if missing else []
            if not paths:
                break
            ctypes.CDLL(paths[0], mode=ctypes.RTLD_GLOBAL)
    if not tvm.runtime.enabled("cuda"):
        why = _first_line(error) if error is not None else "device_api.cuda is not registered"
        raise UserError(f"TVM's CUDA runtime (libtvm_runtime_cuda.so) is not loaded: {why}; it needs libcudart "
                        "(pip nvidia-cuda-runtime, as torch installs it) and the NVIDIA driver's libcuda.so.1")


def ensure_cuda(target: dict[str, Any]) -> str:
    """Makes this process able to compile and run TVM CUDA modules for ``target``; returns how kernels
    are compiled ("tvm", "nvcc:<dir>" or "nvrtc:<libnvrtc>"). A UserError says what is missing."""
    _ensure_cuda_runtime()
    return _ensure_cuda_compiler(target)


def cuda_worker_init() -> None:
    """Initializer of MetaSchedule's builder and runner worker processes: the CUDA runtime plugin and the
    kernel compiler that the parent process chose (passed down in environment variables)."""
    with contextlib.suppress(UserError):  # a builder can do without it; a runner reports it per candidate
        _ensure_cuda_runtime()
    arch, mode = os.environ.get(_ARCH_ENV), os.environ.get(_MODE_ENV)
    if arch and mode:
        _apply_mode(mode, arch)


def cuda_child_env() -> dict[str, str]:
    """This process's environment, plus the folders of its CUDA libraries on LD_LIBRARY_PATH, for child
    processes (MetaSchedule's workers import tvm before anything loads libcudart)."""
    env = dict(os.environ)
    dirs = [str(d) for d in _lib_dirs() if any(d.glob("libcudart.so*")) or any(d.glob("libnvrtc.so*"))]
    old = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(dict.fromkeys(dirs + old))
    return env
