"""A config through ``autohet.load`` next to the run it was tuned from, side by side in one process
(issue 27):

- stream: the config's strategy and params measured as a trial measures them (``run_strategy``
  over ``--images`` synthetic images), then the same config through ``autohet.load``, those images
  streamed in batches of ``--batch`` (default: the executors' largest batch) through
  ``runner.map``, as float32 inputs and as uint8 pixels (scaled where the config's devices take
  them: on a GPU), and on a GPU both again from page-locked memory (read where they lie); img/s of
  each and their ratios to the run and to the tune's own figure (the config's
  ``measured.throughput_ips``);
- files (``--jpegs N``): N synthetic JPEGs (``--jpeg-size``) through ``run --input`` (``run_batch``,
  decoding on the cores the config leaves free) to an .npy: img/s with decoding, next to the
  stream's inference alone, and which cores decoded.

    python -m bench.runtime_load --config runs/resnet18/best.yaml --images 20000 --jpegs 20000
    python -m bench.runtime_load --smoke       # lenet fast_split on actors/cpu2.yaml, a few images
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import emit


def measured_run(config: Any, images: int) -> float:
    """The config's strategy as a trial runs it (in-process executors): its img/s (or 1/p50)."""
    from autohet.context import RunContext
    from autohet.core.objectives import ObjectiveSet
    from autohet.core.workload import workload_for
    from autohet.pool import LocalPool
    from autohet.strategy_run import run_strategy

    mode = ObjectiveSet.parse(config.objective).mode
    ctx = RunContext(config.model, workload_for(config.model.name, images, config.workload_seed), check_images=16,
                     mode=mode, standalone_seconds=0.5)
    from bench._gpu_clock import GpuClock

    pool = LocalPool(config.pool)
    try:
        with GpuClock() as clock:
            m = run_strategy(config.strategy, {**config.params, **config.plan}, pool, ctx)
    finally:
        pool.shutdown()
    if clock.figures:
        print(f"run {m.throughput_ips:.0f} img/s (its warm-up and check included in the clock): {clock.summary()}",
              flush=True)
    if not m.output_ok:
        raise SystemExit(f"the measured run failed its output check: {m.failures}")
    return m.throughput_ips


def streamed(path: str, images: int, batch: int | None, window: int | None = None,
             stacks: bool = False) -> tuple[float, dict[str, Any]]:
    """img/s of ``images`` synthetic images through ``autohet.load``'s ``map`` (``stream_ips``), in
    batches of ``batch`` (default: the executors' largest batch). ``stacks``: every thread's stacks
    sampled during each steady stream, printed."""
    import autohet

    with autohet.load(path, window=window) as runner:
        size = batch or max(e.batch for e in runner.config.pool.executors)
        steady, cold = stream_ips(runner, images, size, stacks=stacks)
        executors = _executor_shares(runner)
        ceiling = host_stage_ceiling(runner)
        pixels, pixels_cold = stream_ips(runner, images, size, pixels=True, stacks=stacks)
        how = {"batch": size, "window": runner.window, "stream_cold_ips": cold, "pixels_ips": pixels,
               "pixels_cold_ips": pixels_cold, "pixels_on_device": runner.device_pixels,
               "served": runner.describe()["served"], "executors": executors,
               "pixels_executors": _executor_shares(runner), **ceiling}
        if _has_cuda():  # float32 and pixels from page-locked memory: a GPU reads them where they lie
            how["pinned_ips"] = stream_ips(runner, images, size, stacks=stacks, pinned=True)[0]
            how["pinned_executors"] = _executor_shares(runner)
            how["pinned_pixels_ips"] = stream_ips(runner, images, size, pixels=True, stacks=stacks, pinned=True)[0]
            how["pinned_pixels_executors"] = _executor_shares(runner)
        return steady, how


def host_stage_ceiling(runner: Any) -> dict[str, float]:
    """What this process's host alone stages now, float32 into the GPUs' compute dtype on the default copy
    threads, with nothing on the GPUs (``bench.multi_gpu.host_copy_ceiling``): a float32 stream from pageable
    memory stages every image that way, so a stream near this is bound by the host, not by its lanes. Empty
    without a GPU executor."""
    from autohet.platform.host_copy import copy_threads
    from bench.multi_gpu import host_copy_ceiling

    gpus = [e for e in runner.config.pool.executors if e.is_gpu]
    if not gpus or not _has_cuda():
        return {}
    threads = copy_threads()
    got = host_copy_ceiling(runner.model.name, gpus[0].precision, [threads], seconds=1.0)
    return {"host_stage_ips": got[f"host_stage_ips_{threads}t"], "copy_threads": threads}


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _executor_shares(runner: Any) -> dict[str, dict[str, float]]:
    """Each executor's images and busy seconds in the streams so far, and its img/s while busy: where a
    stream's loss sits (an executor idle, or slow while it had work). Only streams over several
    in-process executors (their lanes) keep these."""
    out = {}
    for name, figures in runner.describe()["stream"].get("executors", {}).items():
        busy = figures["busy_s"]
        out[name] = {**figures, "busy_ips": figures["images"] / busy if busy > 0 else 0.0}
    return out


# A synthetic stream reads at least this many bytes of distinct memory, in its own dtype: more than the last-level
# cache of the GPU boxes' Xeons (300 MiB), as a real stream's freshly decoded images are. Staging float32 into
# fp16 pinned rows on 16 threads of the H200 box ran 127-134k img/s from a 128 MB source and 88-96k from 1-4 GB
# (BENCHMARKS.md 39): the bench's 128 MB and then 308 MB banks read partly from the cache.
SOURCE_BYTES = 1 << 30


def synthetic_batches(runner: Any, images: int, size: int, pixels: bool = False,
                      pinned: bool = False) -> Callable[[], Iterator[Any]]:
    """A stream of ``images`` synthetic images in batches of ``size``, made anew by each call of the
    function returned. Batches are views of the synthetic bank (its distinct images, ``MAX_DISTINCT_BYTES``
    of them, repeated to ``SOURCE_BYTES`` of memory, at least two batches, at most the stream's images), so
    producing them costs nothing; ``pixels``: a uint8 bank of as many bytes; ``pinned``: the bank in
    page-locked memory, as a ``DataLoader(pin_memory=True)`` hands its batches over (CUDA only)."""
    from autohet.core.workload import workload_for

    bank = workload_for(runner.model.name, images, runner.config.workload_seed).bank
    per_image = int(np.prod(bank.shape[1:])) * (1 if pixels else 4)
    # resnet18's 128 MB are 222 images: batches of 256 ran as 222 (BENCHMARKS.md 37)
    rows = max(2 * size, min(images, -(-SOURCE_BYTES // per_image)))
    if len(bank) < rows:
        bank = np.resize(bank, (rows, *bank.shape[1:]))
    if pixels:
        bank = np.random.default_rng(0).integers(0, 256, bank.shape, dtype=np.uint8)
    if pinned:
        import torch

        bank = torch.from_numpy(np.ascontiguousarray(bank)).pin_memory().numpy()  # the array keeps it alive
    starts = list(range(0, max(1, len(bank) - size + 1), size))  # views of the bank: the reader copies nothing
    return lambda: (bank[starts[k % len(starts)]:][: min(size, images - s)]
                    for k, s in enumerate(range(0, images, size)))


def stream_ips(runner: Any, images: int, size: int, pixels: bool = False, stacks: bool = False,
               pinned: bool = False) -> tuple[float, float]:
    """img/s of ``images`` synthetic images (``synthetic_batches``) through a loaded runner's ``map`` in
    batches of ``size``, after a warm-up pass of as many (a runner's first stream pays once what a
    long-running one does not: the first window is the checked call, a GPU's two pinned staging buffers of
    a gigabyte are allocated, torch's pinned-memory cache fills; on the H200 box a probe's first
    20000-image stream ran 15715 img/s and its second 41770). Returns (steady, first stream's) img/s."""
    batches = synthetic_batches(runner, images, size, pixels, pinned)
    kind = f"{'pixels' if pixels else 'float32'}{', page-locked,' if pinned else ''}"

    from contextlib import nullcontext

    from bench._gpu_clock import GpuClock
    from bench._stacks import StackSampler

    rates = []
    for steady in (False, True):
        with StackSampler() if stacks and steady else nullcontext() as sampler, GpuClock() as clock:
            start = time.perf_counter()
            done = sum(len(out) for out in runner.map(batches()))
            rates.append(done / (time.perf_counter() - start))
        if steady and clock.figures:
            print(f"{kind} stream {rates[1]:.0f} img/s: {clock.summary()}", flush=True)
        if sampler is not None:
            print(f"{kind} stream, {rates[1]:.0f} img/s:", flush=True)
            print("\n".join(sampler.report()), flush=True)
    return rates[1], rates[0]


def _write_jpeg(args: tuple[Path, int, int]) -> None:
    from PIL import Image

    path, seed, size = args
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size * 3 // 4, 0:size]
    base = (np.stack([x, y, x + y], axis=-1) * (255.0 / (2 * size)) + rng.integers(0, 40, 3)).astype(np.uint8)
    Image.fromarray(base).save(path, quality=90)


def files(path: str, count: int, size: int, folder: Path) -> dict[str, Any]:
    """``count`` JPEGs written to ``folder``, then run through the config to an .npy (``run_batch``)."""
    from autohet.runtime.batch import run_batch

    jobs = [(folder / f"{i // 1000:03d}" / f"{i:06d}.jpg", i, size) for i in range(count)]
    for sub in {p.parent for p, _, _ in jobs}:
        sub.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor() as pool:
        list(pool.map(_write_jpeg, jobs, chunksize=64))
    summary = run_batch(path, folder, folder / "out.npy")
    return {"files_ips": summary["throughput_ips"], "decode_cores": summary["decode"]["cores"],
            "decode_shared": summary["decode"]["shared_with_devices"], "files": summary["images"]}


def smoke_config(folder: Path) -> str:
    from autohet.config import RunConfig, write_config
    from autohet.core.models import ModelSpec
    from autohet.pool import load_pool

    config = RunConfig(ModelSpec("lenet"), load_pool("actors/cpu2.yaml"), "fast_split", {}, images=2000)
    return str(write_config(config, folder / "smoke.yaml"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="an exported config (runs/<experiment>/best.yaml)")
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batch", type=int, help="images per streamed batch (default: the largest executor batch)")
    parser.add_argument("--window", type=int, help="autohet.load(window=): images per stream window (default: "
                        "the tuned run's, at most 1 GiB of them)")
    parser.add_argument("--no-run", action="store_true", help="skip the in-process measured run (run_ips)")
    parser.add_argument("--rounds", type=int, default=1, help="the run and the stream by turns this many times; "
                        "the round of the median stream/run ratio is reported")
    parser.add_argument("--jpegs", type=int, default=0, help="also run this many synthetic JPEGs through run --input")
    parser.add_argument("--jpeg-size", type=int, default=500, help="JPEG width in pixels (height 3/4 of it)")
    parser.add_argument("--smoke", action="store_true", help="lenet on actors/cpu2.yaml, 2000 images, 40 JPEGs")
    parser.add_argument("--stacks", action="store_true", help="sample every thread's stacks in the steady streams "
                        "and print where each thread group spends its time")
    parser.add_argument("--out", help="write the rows as JSON")
    args = parser.parse_args()
    from autohet.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = smoke_config(folder) if args.smoke else args.config
        if not path:
            raise SystemExit("give --config FILE or --smoke")
        images, jpegs = (2000, 40) if args.smoke else (args.images, args.jpegs)
        config = load_config(path)
        rounds = []  # by turns: the run, then the stream, ``--rounds`` times (a box whose speed drifts)
        for k in range(max(1, args.rounds)):
            run_ips = float("nan") if args.no_run else measured_run(config, images)
            load_ips, how = streamed(path, images, args.batch, args.window, args.stacks)
            rounds.append((run_ips, load_ips, how))
            lanes = "".join(f"; {kind} {name} {f['images']} images, busy {f['busy_s']:.3f} s, staging "
                            f"{f['stage_s']:.3f} s, starting {f['launch_s']:.3f} s, device {f['device_s']:.3f} s, "
                            f"started {f['first_start_s'] or 0:.3f} s, last done {f['last_end_s'] or 0:.3f} s"
                            for kind, key in (("float32", "executors"), ("pixels", "pixels_executors"),
                                              ("page-locked", "pinned_executors"),
                                              ("page-locked pixels", "pinned_pixels_executors"))
                            for name, f in how.get(key, {}).items())  # where a slow round's loss sits
            pinned = f", float32 page-locked {how['pinned_ips']:.0f} ({how['pinned_ips'] / run_ips:.3f}x), pixels " \
                f"page-locked {how['pinned_pixels_ips']:.0f} ({how['pinned_pixels_ips'] / run_ips:.3f}x)" \
                if "pinned_ips" in how else ""
            host = f" (the host alone stages {how['host_stage_ips']:.0f} on {how['copy_threads']} copy threads: the " \
                f"stream at {load_ips / how['host_stage_ips']:.3f} of it)" if "host_stage_ips" in how else ""
            print(f"round {k + 1}: run {run_ips:.0f} img/s, float32 stream {load_ips:.0f} ({load_ips / run_ips:.3f}x)"
                  f"{host}{pinned}, pixels {how['pixels_ips']:.0f} ({how['pixels_ips'] / run_ips:.3f}x){lanes}",
                  flush=True)
        ratios = sorted(range(len(rounds)), key=lambda k: rounds[k][1] / rounds[k][0])
        run_ips, load_ips, how = rounds[ratios[len(ratios) // 2]]  # the round of the median stream/run ratio
        row: dict[str, Any] = {"model": config.model.name, "strategy": config.strategy, "images": images,
                               "window_given": args.window,
                               "run_ips": run_ips, "load_ips": load_ips, "load_over_run": load_ips / run_ips,
                               "pixels_over_run": how["pixels_ips"] / run_ips,
                               **{k: v for k, v in how.items() if k != "served"}}
        if "host_stage_ips" in how:
            row["load_over_host_stage"] = load_ips / how["host_stage_ips"]
        if "pinned_ips" in how:
            row["pinned_over_run"] = how["pinned_ips"] / run_ips
            row["pinned_pixels_over_run"] = how["pinned_pixels_ips"] / run_ips
        if len(rounds) > 1:
            row["rounds"] = [{"run_ips": r, "load_over_run": s / r, "pixels_over_run": h["pixels_ips"] / r,
                              "pinned_over_run": h.get("pinned_ips", float("nan")) / r,
                              "load_over_host_stage": s / h.get("host_stage_ips", float("nan")),
                              "pinned_pixels_over_run": h.get("pinned_pixels_ips", float("nan")) / r,
                              "executors": h["executors"]} for r, s, h in rounds]
            print("rounds (stream/run, pixels/run, page-locked float32/run, page-locked pixels/run): " + ", ".join(
                f"{x['load_over_run']:.3f}/{x['pixels_over_run']:.3f}/{x['pinned_over_run']:.3f}/"
                f"{x['pinned_pixels_over_run']:.3f}"
                for x in row["rounds"]), flush=True)
        for name, figures in how["executors"].items():
            print(f"stream: {name} ran {figures['images']} images in {figures['pieces']} pieces, busy "
                  f"{figures['busy_s']:.2f} s ({figures['busy_ips']:.1f} img/s while busy); staging "
                  f"{figures['stage_s']:.2f} s, starting {figures['launch_s']:.2f} s, on the device "
                  f"{figures['device_s']:.2f} s; first piece started at {figures['first_start_s'] or 0:.3f} s, "
                  f"last collected at {figures['last_end_s'] or 0:.3f} s of the {images / load_ips:.3f} s stream",
                  flush=True)
        tuned = config.measured.get("throughput_ips")
        if tuned:  # the tune's own figure for this config (its trial), as the issue compares
            row.update(tune_ips=tuned, load_over_tune=load_ips / tuned, pixels_over_tune=row["pixels_ips"] / tuned)
        if jpegs:
            row.update(files(path, jpegs, 64 if args.smoke else args.jpeg_size, folder / "jpegs"))
            row["files_over_load"] = row["files_ips"] / load_ips
    columns = ("model", "strategy", "images", "window_given", "batch", "run_ips", "tune_ips", "load_ips",
               "stream_cold_ips", "load_over_run", "host_stage_ips", "load_over_host_stage", "load_over_tune",
               "pixels_ips", "pixels_on_device",
               "pixels_over_run", "pinned_ips", "pinned_over_run", "pinned_pixels_ips", "pinned_pixels_over_run",
               "pixels_over_tune", "files", "files_ips", "files_over_load", "decode_cores")
    emit("runtime_load", [row], [c for c in columns if c in row], args.out)


if __name__ == "__main__":
    main()
