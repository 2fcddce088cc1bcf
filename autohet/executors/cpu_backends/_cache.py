"""Converted models on disk: one per (model, weights, input shape, converter), written atomically.

Converting a torchvision CNN to OpenVINO IR or ONNX takes seconds; loading the result takes a small
part of that (docs/why.md, executors/cpu_backends/_cache.py). Every executor, trial and later run on
the machine shares the file, under the compile cache (``runs/compile_cache/``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from autohet.executors.cpu_backends._base import ModelSource

__all__ = ["converted"]


def _weights_identity(source: ModelSource) -> dict[str, object]:
    """What changes the weights without changing the model's name: the seed, the checkpoint file, a
    user factory's source file (a stale file would still be caught: every trial checks its outputs)."""
    spec = source.spec
    out: dict[str, object] = {"name": spec.name, "seed": spec.seed}
    files = [spec.checkpoint] if spec.checkpoint else []
    if ":" in spec.name:
        found = importlib.util.find_spec(spec.name.split(":", 1)[0])
        if found is not None and found.origin:
            files.append(found.origin)
    for f in files:
        st = Path(f).stat()
        out[str(Path(f).resolve())] = [st.st_size, st.st_mtime_ns]
    return out


def converted(kind: str, source: ModelSource, shape: tuple[int, ...], tool: str, suffixes: tuple[str, ...],
              write: Callable[[Path], None]) -> Path:
    """The cached file of ``kind`` (its first suffix names it; the others travel with it, e.g. an IR's
    ``.bin``), made by ``write(path)`` in a temporary folder and moved in place when missing."""
    from autohet.executors.machine import compile_cache_dir

    ident = {**_weights_identity(source), "shape": list(shape), "tool": tool}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", source.spec.name) + "-" + digest
    folder = compile_cache_dir() / kind
    target = folder / (stem + suffixes[0])
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=folder))
    try:
        write(scratch / (stem + suffixes[0]))
        for suffix in (*suffixes[1:], suffixes[0]):  # the first suffix last: its presence means complete
            made = scratch / (stem + suffix)
            if made.exists():
                os.replace(made, folder / (stem + suffix))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
