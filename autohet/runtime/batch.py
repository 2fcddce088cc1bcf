"""Batch files: a folder of images or an .npy through a loaded config (``autohet run --config
--input PATH --out FILE``), the outputs written to a temporary file renamed at the end, so a run
that fails leaves nothing that looks complete.

``FILE`` by suffix: ``.npy`` holds the logits (float32, N x classes, in input order); ``.jsonl`` one
line per input: its path (and index in an .npy), the top-5 class indices and their softmax scores.
Images are decoded on cores the config's devices leave free (``images.Decoders``) while the devices
run the batches before them.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from autohet.core.errors import UserError

__all__ = ["OUTPUT_SUFFIXES", "run_batch", "top_classes"]

OUTPUT_SUFFIXES = (".npy", ".jsonl")
TOP = 5


class _Outputs:
    """The output file, written under a temporary name next to it and renamed by ``commit``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        self.jsonl: IO[str] | None = open(self.tmp, "w") if out.suffix == ".jsonl" else None  # noqa: SIM115
        self.logits: list[np.ndarray] = []
        self.count = 0

    def add(self, logits: np.ndarray, inputs: list[dict[str, Any]]) -> None:
        self.count += len(logits)
        if self.jsonl is None:
            self.logits.append(logits)
            return
        top, scores = top_classes(logits)
        for row, where in enumerate(inputs):
            line = {**where, "top5": top[row], "scores": scores[row]}
            self.jsonl.write(json.dumps(line) + "\n")

    def commit(self, classes: int) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        else:
            with open(self.tmp, "wb") as f:
                np.save(f, np.concatenate(self.logits) if self.logits else np.zeros((0, classes), np.float32))
        self.tmp.replace(self.out)

    def discard(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        self.tmp.unlink(missing_ok=True)


def top_classes(logits: np.ndarray, k: int = TOP) -> tuple[list[list[int]], list[list[float]]]:
    """Per row of ``logits`` (N, classes): the ``k`` largest classes' indices (ties by index) and their
    softmax scores, rounded to 6 places."""
    k = min(k, logits.shape[1])
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    scores = np.exp(shifted)
    scores /= scores.sum(axis=1, keepdims=True)
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return ([[int(i) for i in row] for row in top],
            [[round(float(scores[r, i]), 6) for i in row] for r, row in enumerate(top)])


def _check_paths(source: Path, out: Path) -> None:
    if out.suffix not in OUTPUT_SUFFIXES:
        raise UserError(f"--out {out} must end in .npy (the logits) or .jsonl (top-5 classes per input)")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist; create it first")
    if not source.exists():
        raise UserError(f"--input {source} not found; give a folder of JPEG/PNG images or an .npy file")
    if not source.is_dir() and source.suffix != ".npy":
        raise UserError(f"--input {source} is neither a folder of JPEG/PNG images nor an .npy file")


def _npy_batches(source: Path, shape: tuple[int, ...], model: str, batch: int, inputs: deque[list[dict[str, Any]]]
                 ) -> tuple[int, Iterator[np.ndarray]]:
    try:
        array = np.load(source, mmap_mode="r")
    except ValueError as exc:
        raise UserError(f"{source} is not a readable .npy file ({exc}); save it with numpy.save") from None
    if array.ndim != 4 or tuple(array.shape[1:]) != tuple(shape):
        raise UserError(f"{source} holds an array of shape {tuple(array.shape)}; {model} takes (N, "
                        f"{', '.join(map(str, shape))}) float32 inputs or uint8 pixels: preprocess it to that shape")
    if array.dtype != np.uint8 and array.dtype.kind not in "f":
        raise UserError(f"{source} holds {array.dtype}; {model} takes float32 inputs or uint8 pixels: save it as "
                        "x.astype(numpy.uint8) (pixels) or x.astype(numpy.float32) (scaled inputs)")
    dtype = np.uint8 if array.dtype == np.uint8 else np.float32  # pixels stay pixels (the runner scales them)

    def batches() -> Iterator[np.ndarray]:
        for start in range(0, len(array), batch):
            rows = np.array(array[start : start + batch], dtype=dtype)  # a copy: not a view of the file
            inputs.append([{"path": str(source), "index": start + k} for k in range(len(rows))])
            yield rows

    return len(array), batches()


def run_batch(config: str | Path, source: str | Path, out: str | Path, *, skip_bad: bool = False,
              address: str | None = None, check: bool = True,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Runs every input of ``source`` through the config and writes ``out``; returns the summary
    (images written, skipped files, img/s, the cores that decoded, executor deaths)."""
    from autohet.runtime.images import Decoders, list_images, preprocessing_for
    from autohet.runtime.loader import load

    source, out = Path(source), Path(out)
    _check_paths(source, out)
    paths = list_images(source) if source.is_dir() else []
    if source.is_dir() and not paths:
        raise UserError(f"--input {source} holds no JPEG/PNG images (searched recursively for "
                        ".jpg, .jpeg, .png)")
    runner = load(config, address=address, check=check)
    inputs: deque[list[dict[str, Any]]] = deque()  # each batch's inputs, in the order its outputs come
    skipped: list[dict[str, str]] = []
    decoders: Decoders | None = None
    written: _Outputs | None = None
    try:
        summary: dict[str, Any] = {"config": str(config), "input": str(source), "out": str(out)}
        if paths:
            prep = preprocessing_for(runner.input_shape, runner.config.preprocess, str(config))
            decoders = Decoders(runner.cores)
            total = len(paths)
            summary.update(preprocess=prep.to_dict(), decode=decoders.describe())

            def images() -> Iterator[np.ndarray]:
                assert decoders is not None
                for rows, names in decoders.batches(paths, prep, max(1, runner.batch), skip_bad, skipped):
                    inputs.append([{"path": str(p)} for p in names])
                    yield rows

            stream: Iterator[np.ndarray] = images()
        else:
            total, stream = _npy_batches(source, runner.input_shape, runner.model.name, max(1, runner.batch), inputs)
        written = _Outputs(out)
        start = time.perf_counter()
        for logits in runner.map(stream):
            written.add(logits, inputs.popleft())
            if progress is not None:
                progress(written.count + len(skipped), total)
        wall = time.perf_counter() - start
        written.commit(runner.classes or 0)
        return {**summary, "images": written.count, "skipped": skipped, "wall_s": wall,
                "throughput_ips": written.count / wall if wall > 0 else 0.0, "strategy": runner.config.strategy,
                "served": runner.describe()["served"], "check": runner.check_result, "deaths": runner.deaths}
    except BaseException:
        if written is not None:
            written.discard()
        raise
    finally:
        if decoders is not None:
            decoders.close()
        runner.close()
