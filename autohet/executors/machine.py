"""What this machine offers executors: its CPU's instructions, and where compiled artefacts are kept."""

from __future__ import annotations

import os
from pathlib import Path

from autohet.core.errors import UserError
from autohet.core.settings import env

__all__ = ["compile_cache_dir", "cpu_flags", "native_cpu_bf16", "use_compile_cache"]


def compile_cache_dir() -> Path:
    """Where compiled artefacts live (``AUTOHET_COMPILE_CACHE``, default runs/compile_cache), shared by
    every executor, trial and later run on this machine."""
    return Path(env("AUTOHET_COMPILE_CACHE") or Path("runs").resolve() / "compile_cache")


def use_compile_cache() -> Path:
    """Points inductor's and Triton's on-disk caches into the compile cache (before first compile)."""
    root = compile_cache_dir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    return root


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where unreadable), adjusted by
    ``AUTOHET_CPU_FLAGS`` ("+avx512_bf16,-amx_bf16": flags added or removed). The development and CI
    machines have AVX512-BF16 on some days and not on others: the variable makes either day's
    behaviour reproducible on any machine (tests pin it; an operator can rule an instruction out)."""
    flags: set[str] = set()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    for item in filter(None, (f.strip() for f in (env("AUTOHET_CPU_FLAGS") or "").split(","))):
        if item[0] not in "+-" or len(item) < 2:
            raise UserError(f"AUTOHET_CPU_FLAGS: {item!r} must be +flag or -flag, e.g. +avx512_bf16,-amx_bf16")
        (flags.add if item[0] == "+" else flags.discard)(item[1:])
    return flags


def native_cpu_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX); without it PyTorch converts,
    correct but slower than fp32, so a tune leaves CPU bf16 out of its space."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
