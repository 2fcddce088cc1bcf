"""autohet's CPU executor at several backends, next to ONNX Runtime's bare session, on the same cores.

Why: on the 2-core box (AVX2, no bf16) the best peer of `bench.cpu_peers` is ONNX Runtime itself, and
an executor running the same session can only tie it. ``onnxruntime_nnpack`` cuts the wide 3x3 layers
that NNPACK's Winograd path computes faster out of the session; this measures whether that shows in
the executor's own throughput. Each executor is built once (its build time printed: for
``onnxruntime_nnpack`` the first build times each candidate layer both ways), then rounds interleave
the peer and the executors (``--images`` images per executor call, the way a ``single`` trial calls
it), so a machine's drift hits every one alike; it prints each one's median img/s and the ratio to
the peer's median. ``--batch`` may list several batches: each executor and the peer at each of them
(``name@b<batch>``), all by turns, ratios to the peer at ``--batch``'s first.

    python -m bench.cpu_backend_ab --model vgg16 --rounds 5
    python -m bench.cpu_backend_ab --model resnet18 --batch 16,64 --backends onnxruntime
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import describe_machine
from bench.cpu_peers import parse_cores, rate


def peer_session(model: str, threads: int, work: Path) -> Any:
    """ONNX Runtime as ``bench.cpu_peers`` runs it: the whole model, intra-op threads = the cores."""
    import onnxruntime as ort

    from autohet.core.models import build_model, input_shape
    from autohet.executors.cpu_backends._onnxruntime import export_onnx

    path = work / f"{model}.onnx"
    export_onnx(build_model(model), input_shape(model), path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def executor(model: str, cores: list[int], batch: int, backend: str, workload: Any) -> tuple[Any, float]:
    from autohet.core.models import ModelSpec
    from autohet.executors import ExecutorSpec, make_executor

    ex = make_executor(ExecutorSpec("ab", "cpu", tuple(cores), batch=batch, backend=backend), ModelSpec(model))
    start = time.perf_counter()
    ex.load(workload)
    return ex, time.perf_counter() - start


def executor_rate(ex: Any, images: int, min_s: float) -> float:
    ex.run(0, images)
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < min_s:
        ex.run(0, images)
        calls += 1
    return calls * images / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vgg16")
    parser.add_argument("--cores", help="e.g. 0-1 (default: all)")
    parser.add_argument("--batch", default="16", help="a batch, or several: 16,64")
    parser.add_argument("--backends", default="onnxruntime,onnxruntime_nnpack")
    parser.add_argument("--images", type=int, default=32, help="images per executor call (at least 2 batches)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="each measurement's length")
    parser.add_argument("--out")
    args = parser.parse_args()

    from autohet.core.models import input_shape
    from autohet.core.workload import Workload, WorkloadSpec

    cores = parse_cores(args.cores)
    os.sched_setaffinity(0, cores)
    batches = [int(b) for b in str(args.batch).split(",") if b.strip()]
    several = len(batches) > 1

    def label(name: str, batch: int) -> str:
        return f"{name}@b{batch}" if several else name

    images = {b: max(args.images, 2 * b) for b in batches}
    workload = Workload.from_spec(WorkloadSpec(max(images.values()), input_shape(args.model), seed=0))
    built = {(label(name, b), b): executor(args.model, cores, b, name, workload)
             for b in batches for name in args.backends.split(",")}
    for (name, _), (ex, seconds) in built.items():
        print(f"{name}: built in {seconds:.1f} s; {json.dumps(ex.describe())}", flush=True)
    peer = label("peer_onnxruntime", batches[0])
    figures: dict[str, list[float]] = {label("peer_onnxruntime", b): [] for b in batches}
    figures.update({name: [] for name, _ in built})
    with tempfile.TemporaryDirectory() as work:
        session = peer_session(args.model, len(cores), Path(work))
        rng = np.random.default_rng(0)
        feeds = {b: {session.get_inputs()[0].name: rng.standard_normal((b, *input_shape(args.model)),
                                                                        dtype=np.float32)} for b in batches}
        for r in range(args.rounds):
            for b in batches:
                figures[label("peer_onnxruntime", b)].append(
                    rate(lambda feed=feeds[b]: session.run(None, feed), b, args.seconds))
            for (name, b), (ex, _) in built.items():
                figures[name].append(executor_rate(ex, images[b], args.seconds))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in figures.items()), flush=True)
    peer_median = statistics.median(figures[peer])
    row = {"machine": describe_machine(), "model": args.model, "cores": cores, "batch": batches,
           "peer": peer, "images_per_call": images, "rounds": figures,
           "median_ips": {k: statistics.median(v) for k, v in figures.items()},
           "ratio_to_peer": {k: statistics.median(v) / peer_median for k, v in figures.items()},
           "round_ratios": {k: [x / p for x, p in zip(v, figures[peer], strict=True)]
                            for k, v in figures.items()}}
    for k in figures:
        print(f"{k}: median {row['median_ips'][k]:.3f} img/s = {row['ratio_to_peer'][k]:.3f}x {peer} "
              f"(rounds {', '.join(f'{x:.3f}' for x in row['round_ratios'][k])})")
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
