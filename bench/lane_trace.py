"""Every piece of a multi-executor stream, in order: where ``autohet.load``'s lanes lose time (issue 49).

Streams ``--images`` synthetic images through a config's ``runner.map`` in batches of 256, as float32
inputs and then as uint8 pixels, each ``--repeat`` + 1 times (the first of each pays its warm-up), and
prints for each stream every window's split (its images, each piece's lane and images), every piece's
start and collection (seconds from the stream's start; a piece's own seconds on its device where the
executor times them), and garbage collections over 2 ms; then the lanes' figures and, where NVML
answers, GPU 0's SM clock and power over the stream and the reasons NVML gave for holding its clock
down: a stream slower than the run because the GPU ran slower shows there, not in the lanes. Reads the
lanes by wrapping their methods in this process only.

    python -m bench.lane_trace --config runs/resnet18/best.yaml --images 20000
    python -m bench.lane_trace --smoke       # lenet fast_split on actors/cpu2.yaml, 600 images in 64s
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="an exported config over several in-process executors")
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=1, help="steady streams of each input kind after its warm-up")
    parser.add_argument("--quiet", action="store_true", help="each stream's figures only, not its pieces")
    parser.add_argument("--smoke", action="store_true", help="lenet fast_split on actors/cpu2.yaml, 600 images")
    parser.add_argument("--out", help="write each stream's img/s and lanes as JSON")
    args = parser.parse_args()
    if args.smoke:
        import tempfile
        from pathlib import Path

        from bench.runtime_load import smoke_config

        args.config, args.images, args.batch = smoke_config(Path(tempfile.mkdtemp())), 600, 64
    if not args.config:
        raise SystemExit("give --config FILE or --smoke")

    import autohet
    from autohet.pool import lanes as lanes_module
    from autohet.runtime import runner as runner_module
    from bench._gpu_clock import GpuClock
    from bench.runtime_load import synthetic_batches

    log: list[tuple[Any, ...]] = []
    real_split, real_done, real_run = lanes_module.Lanes._split, lanes_module.Lanes._done, runner_module.Runner._run

    def split(self: Any, window: Any) -> Any:
        pieces = real_split(self, window)
        log.append(("split", time.perf_counter(), window.images,
                    [(p.lane.executor.spec.name, p.count) for p in pieces]))
        return pieces

    def done(self: Any, piece: Any, outputs: Any, started: float, error: Any, *rest: Any) -> Any:
        device = rest[1] if len(rest) > 1 else 0.0
        log.append(("done", time.perf_counter(), piece.lane.executor.spec.name, piece.count, started,
                    round(device, 4)))
        return real_done(self, piece, outputs, started, error, *rest)

    def run(self: Any, parts: list[np.ndarray]) -> Any:
        log.append(("call", time.perf_counter(), sum(len(p) for p in parts)))
        return real_run(self, parts)

    collecting: dict[str, float] = {}

    def collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting["t"] = time.perf_counter()
        elif time.perf_counter() - collecting.get("t", time.perf_counter()) > 0.002:
            log.append(("gc", collecting["t"], info["generation"], round(time.perf_counter() - collecting["t"], 4)))

    lanes_module.Lanes._split, lanes_module.Lanes._done, runner_module.Runner._run = split, done, run
    gc.callbacks.append(collection)
    with autohet.load(args.config) as runner:
        sources = [synthetic_batches(runner, args.images, args.batch, pixels) for pixels in (False, True)]
        rows = []
        kinds = [False] * (1 + args.repeat) + [True] * (1 + args.repeat)
        for k, pixels in enumerate(kinds):
            dtype = "uint8" if pixels else "float32"
            log.clear()
            with GpuClock() as clock:
                t0 = time.perf_counter()
                n = sum(len(o) for o in runner.map(sources[int(pixels)]()))
                t = time.perf_counter() - t0
            print(f"stream {k} ({dtype}): {n} images in {t:.3f} s = {n / t:.0f} img/s; {clock.summary()}")
            for kind, at, *rest in log:
                if args.quiet and kind != "gc":
                    continue
                shown = [f"{x - t0:.4f}" if kind == "done" and i == 2 else x for i, x in enumerate(rest)]
                print(f"   {kind} {at - t0:.4f}", *shown)
            lanes = runner.describe()["stream"].get("executors", {})
            print("lanes", lanes)
            rows.append({"stream": k, "dtype": dtype, "images": n, "ips": n / t,
                         "pieces": sum(1 for e in log if e[0] == "done"), "lanes": lanes, "gpu": clock.figures})
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
