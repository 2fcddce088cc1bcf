"""autohet's CPU executor at several backends, next to ONNX Runtime's bare session, on the same cores.

Why: on the 2-core box (AVX2, no bf16) the best peer of `bench.cpu_peers` is ONNX Runtime itself, and
an executor running the same session can only tie it. ``onnxruntime_nnpack`` cuts the wide 3x3 layers
that NNPACK's Winograd path computes faster out of the session; this measures whether that shows in
the executor's own throughput. Each executor is built once (its build time printed: for
``onnxruntime_nnpack`` the first build times each candidate layer both ways), then rounds interleave
the peer and the executors (``--images`` images per executor call, the way a ``single`` trial calls
it), so a machine's drift hits every one alike; it prints each one's median img/s and the ratio to
the peer's median.

    python -m bench.cpu_backend_ab --model vgg16 --rounds 5
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

    from autohet.executors.cpu_backends._onnxruntime import export_onnx
    from autohet.models import build_model, input_shape

    path = work / f"{model}.onnx"
    export_onnx(build_model(model), input_shape(model), path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def executor(model: str, cores: list[int], batch: int, backend: str, workload: Any) -> tuple[Any, float]:
    from autohet.executors import ExecutorSpec, make_executor
    from autohet.models import ModelSpec

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
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--backends", default="onnxruntime,onnxruntime_nnpack")
    parser.add_argument("--images", type=int, default=32, help="images per executor call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="each measurement's length")
    parser.add_argument("--out")
    args = parser.parse_args()

    from autohet.models import input_shape
    from autohet.workload import Workload, WorkloadSpec

    cores = parse_cores(args.cores)
    os.sched_setaffinity(0, cores)
    workload = Workload.from_spec(WorkloadSpec(args.images, input_shape(args.model), seed=0))
    built = {b: executor(args.model, cores, args.batch, b, workload) for b in args.backends.split(",")}
    for name, (ex, seconds) in built.items():
        print(f"{name}: built in {seconds:.1f} s; {json.dumps(ex.describe())}", flush=True)
    figures: dict[str, list[float]] = {"peer_onnxruntime": [], **{b: [] for b in built}}
    with tempfile.TemporaryDirectory() as work:
        session = peer_session(args.model, len(cores), Path(work))
        x = np.random.default_rng(0).standard_normal((args.batch, *input_shape(args.model)), dtype=np.float32)
        feed = {session.get_inputs()[0].name: x}
        for r in range(args.rounds):
            figures["peer_onnxruntime"].append(rate(lambda: session.run(None, feed), args.batch, args.seconds))
            for name, (ex, _) in built.items():
                figures[name].append(executor_rate(ex, args.images, args.seconds))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in figures.items()), flush=True)
    peer_median = statistics.median(figures["peer_onnxruntime"])
    row = {"machine": describe_machine(), "model": args.model, "cores": cores, "batch": args.batch,
           "images_per_call": args.images, "rounds": figures,
           "median_ips": {k: statistics.median(v) for k, v in figures.items()},
           "ratio_to_peer": {k: statistics.median(v) / peer_median for k, v in figures.items()},
           "round_ratios": {k: [x / p for x, p in zip(v, figures["peer_onnxruntime"], strict=True)]
                            for k, v in figures.items()}}
    for k in figures:
        print(f"{k}: median {row['median_ips'][k]:.3f} img/s = {row['ratio_to_peer'][k]:.3f}x the peer "
              f"(rounds {', '.join(f'{x:.3f}' for x in row['round_ratios'][k])})")
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
