"""How fast this host stages float32 images into fp16 rows (pinned where a GPU is there) by the size of the
source it reads: a source within the last-level cache stages faster than one from DRAM, as a real stream's
freshly decoded images are (BENCHMARKS.md 39). Prints ``lscpu``'s cache lines, then img/s per source size.

    AUTOHET_COPY_THREADS=16 python -m bench.host_source
"""

from __future__ import annotations

import subprocess
import time

import numpy as np
import torch

from autohet.platform.host_copy import copy_parts, copy_threads

SHAPE = (3, 224, 224)  # resnet18's input
WINDOW = 1792  # a stream's float32 window of 1 GiB, in whole batches of 256
SOURCES_MB = (64, 128, 308, 1024, 4096)  # 128: the bench's bank until BENCHMARKS 37; 308: until 39


def staged_ips(bank: torch.Tensor, dst: torch.Tensor, seconds: float) -> float:
    """img/s of windows of batches of 256 (views of ``bank``, one after another, wrapping) copied into ``dst``."""
    views = [bank[s:][:256] for s in range(0, max(1, len(bank) - 255), 256)]
    done, k, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        parts, rows = [], 0
        while rows < WINDOW:
            view = views[k % len(views)][: WINDOW - rows]
            parts.append(view)
            rows += len(view)
            k += 1
        copy_parts(dst, parts)
        done += rows
    return done / (time.perf_counter() - t0)


def main() -> None:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print("\n".join(line for line in lscpu.splitlines() if line.startswith(("Model:", "L2", "L3"))), flush=True)
    print("copy threads", copy_threads(), flush=True)
    dst = torch.empty((WINDOW, *SHAPE), dtype=torch.float16, pin_memory=torch.cuda.is_available())
    per_image = int(np.prod(SHAPE)) * 4
    for source_mb in SOURCES_MB:
        n = max(256, source_mb * (1 << 20) // per_image)
        bank = torch.from_numpy(np.random.default_rng(0).standard_normal((n, *SHAPE), dtype=np.float32))
        for _ in range(2):
            print(f"source {source_mb:5d} MB ({n} images): {staged_ips(bank, dst, 1.0):8.0f} img/s staged", flush=True)
        del bank


if __name__ == "__main__":
    main()
