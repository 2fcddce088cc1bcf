"""How much of a GPU executor's time is Python launching its kernels, and what a busy Python thread
beside it costs (issue 27: why ``autohet.load``'s stream, whose reader, stager and driver are threads
of the executor's process, trailed the tune's actor). One process, the config's first executor:

- a chain of 2048-image units, each next one announced (``run_ahead``) or not, and one whole unit;
- the Python time to queue 20 batches (``launch``) against their GPU time;
- the announced chain again with a spinning Python thread in the process;
- ``--stream``: the config through ``autohet.load``'s ``map`` (float32 inputs and uint8 pixels), each
  window's host staging time, its GPU time (CUDA events) and the GPU's idle time between windows.

    python -m bench.gpu_launch_probe --config runs/resnet18/best.yaml [--stream]
"""

from __future__ import annotations

import argparse
import threading
import time


def main() -> None:
    import torch

    from autohet.config import load_config
    from autohet.core.workload import workload_for
    from autohet.executors import make_executor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--images", type=int, default=40000)
    parser.add_argument("--stream", action="store_true", help="only the stream's windows through autohet.load")
    parser.add_argument("--window", type=int, help="autohet.load(window=) for --stream")
    args = parser.parse_args()
    if args.stream:
        stream_windows(args.config, args.images, args.window)
        return
    cfg = load_config(args.config)
    spec = cfg.pool.executors[int(cfg.params.get("executor", 0))]
    ex = make_executor(spec, cfg.model)
    ex.load(workload_for(cfg.model.name, args.images, 0))
    n = args.images

    def chain(unit: int, ahead: bool) -> float:
        start, done = time.perf_counter(), 0
        while done < n:
            size = min(unit, n - done)
            following = (done + size, min(unit, n - done - size)) if ahead and done + size < n else None
            ex.run_ahead(done, size, following)
            done += size
        torch.cuda.synchronize()
        return n / (time.perf_counter() - start)

    for _ in range(2):
        print(f"units of 2048 announced {chain(2048, True):.0f} img/s, not announced {chain(2048, False):.0f}, "
              f"one unit {chain(n, False):.0f}", flush=True)
    batches = 20
    start = time.perf_counter()
    handle = ex.launch(0, spec.batch * batches)
    queued = time.perf_counter() - start
    ex.collect(handle)
    print(f"queuing {batches} batches: {1e3 * queued:.1f} ms of Python; with their GPU work "
          f"{1e3 * (time.perf_counter() - start):.1f} ms")
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        print(f"with a spinning Python thread: units of 2048 announced {chain(2048, True):.0f} img/s")
    finally:
        stop.set()
        thread.join()


def stream_windows(path: str, images: int, window: int | None) -> None:
    """Where a stream's time goes: per window, the host's staging, the GPU's own time, and the GPU idle
    between the end of one window and the start of the next (the executor's calls wrapped, not changed)."""
    import numpy as np

    import autohet
    from autohet.core.workload import workload_for

    with autohet.load(path, window=window) as runner:
        ex = runner.pool.executors[0]
        stage, launch = ex.stage, ex.launch
        record: dict[str, list] = {"stage_s": [], "handles": []}

        def timed_stage(parts):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            out = stage(parts)
            record["stage_s"].append(time.perf_counter() - start)
            return out

        def kept_launch(start, size):  # type: ignore[no-untyped-def]
            handle = launch(start, size)
            record["handles"].append((handle, size))
            return handle

        ex.stage, ex.launch = timed_stage, kept_launch
        size = max(e.batch for e in runner.config.pool.executors)
        bank = workload_for(runner.model.name, images, runner.config.workload_seed).bank
        for label, source in (("float32", bank),
                              ("pixels", np.random.default_rng(0).integers(0, 256, bank.shape, dtype=np.uint8))):
            starts = list(range(0, max(1, len(source) - size + 1), size))
            for turn in range(2):
                record["stage_s"].clear()
                record["handles"].clear()
                began = time.perf_counter()
                batches = (source[starts[k % len(starts)]:][: min(size, images - s)]
                           for k, s in enumerate(range(0, images, size)))
                done = sum(len(out) for out in runner.map(batches))
                wall = time.perf_counter() - began
                handles = [h for h, _ in record["handles"]]
                gpu = [h.begin.elapsed_time(h.end) / 1e3 for h in handles]
                gaps = [a.end.elapsed_time(b.begin) / 1e3 for a, b in zip(handles, handles[1:], strict=False)]
                sizes = [n for _, n in record["handles"]]
                print(f"{label} pass {turn}: {done / wall:.0f} img/s, {len(handles)} windows of "
                      f"{np.mean(sizes):.0f} images; stage {1e3 * np.mean(record['stage_s']):.1f} ms/window "
                      f"(max {1e3 * max(record['stage_s'], default=0):.1f}), GPU {1e3 * np.mean(gpu):.1f} "
                      f"ms/window ({np.sum(sizes) / np.sum(gpu):.0f} img/s of GPU time), GPU idle between "
                      f"windows {1e3 * sum(max(0.0, g) for g in gaps):.1f} ms of {1e3 * wall:.0f} ms wall "
                      f"(largest {1e3 * max(gaps, default=0):.1f})", flush=True)


if __name__ == "__main__":
    main()
