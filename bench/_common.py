"""Shared bits of the benchmarks: machine description, result tables, a child's environment."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["compile_cache_env", "describe_machine", "emit"]

REPO = Path(__file__).resolve().parent.parent


def compile_cache_env(cache: str) -> dict[str, str]:
    """This environment for a child process that imports this checkout and compiles into ``cache`` alone
    (inductor's and Triton's caches, and autohet's own)."""
    return dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=str(Path(cache) / "triton"),
                AUTOHET_COMPILE_CACHE=cache,
                PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))


def describe_machine() -> str:
    import torch

    from autohet.platform.fingerprint import cpu_model

    cpu = cpu_model()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu} x{os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


def emit(name: str, rows: list[dict[str, Any]], columns: list[str], out: str | None) -> None:
    """Prints the table (last, so it ends the output) and writes JSON when ``out`` is given."""
    machine = describe_machine()
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"bench": name, "machine": machine, "rows": rows}, indent=1))
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print(f"\n{name} on {machine}")
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    sys.stdout.flush()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return "-" if v is None else str(v)
