"""autohet's own CPU executor at each OpenVINO streams/batch setting, next to OpenVINO's THROUGHPUT peer.

Why: on the H200 box's 15 cores a CPU-only tune's best single (OpenVINO bf16) ran 0.83-0.91x the peer
that `bench.cpu_peers` measures (a static batch of 16 per request, one request per stream). This
sweeps what the executor can be set to (``streams``, ``batch``; a ``d`` suffix: the earlier
dynamic-batch model, ``OpenVinoBackend.dynamic_batch``) and runs each the way the pool calls it (parts
of ``batch * unit_batches`` images, the next part announced with each call, ``run_ahead``), rounds
interleaved so a machine's drift hits every setting alike; it prints each setting's median img/s and
its ratio to the peer's median, and the executor's own standalone figure.

    python -m bench.cpu_executor_sweep --model resnet18 --cores 1-15 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

import numpy as np

from bench._common import describe_machine
from bench.cpu_peers import parse_cores, rate


def peer(model: str, cores: list[int], batch: int, precision: str) -> Any:
    """OpenVINO's THROUGHPUT hint on a static batch, one batch per request, every request busy."""
    import openvino as ov
    import torch

    from autohet.core.models import build_model, input_shape

    shape = input_shape(model)
    core = ov.Core()
    net = ov.convert_model(build_model(model).eval(), example_input=torch.zeros((1, *shape)))
    net.reshape([batch, *shape])
    compiled = core.compile_model(net, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_PRECISION_HINT": precision,
                                               "INFERENCE_NUM_THREADS": len(cores)})
    requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    queue = ov.AsyncInferQueue(compiled, requests)
    x = np.random.default_rng(0).standard_normal((batch, *shape), dtype=np.float32)

    def call() -> None:
        for _ in range(requests):
            queue.start_async({0: x})
        queue.wait_all()

    return call, batch * requests, {"streams": int(compiled.get_property("NUM_STREAMS"))}


def executor(model: str, cores: list[int], batch: int, streams: int, precision: str, dynamic: bool) -> Any:
    """autohet's CPU executor, called as the pool's actor calls it: parts of ``max_unit_images``, each
    call announcing the next (``run_ahead``: an OpenVINO group queues it behind the current one)."""
    from autohet.core.models import ModelSpec, input_shape
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.executors import ExecutorSpec, make_executor
    from autohet.executors.cpu_backends import cpu_backend

    spec = ExecutorSpec("cpu", "cpu", tuple(cores), batch=batch, precision=precision, backend="openvino",
                        streams=streams)
    part = spec.max_unit_images
    ex = make_executor(spec, ModelSpec(model))
    backend = cpu_backend("openvino")
    backend.dynamic_batch = dynamic  # the program is built (and kept) in load
    try:
        ex.load(Workload.from_spec(WorkloadSpec(2 * part, input_shape(model), seed=0)))
    finally:
        backend.dynamic_batch = False

    def call() -> None:  # four parts, as an actor's calls: each queues the next before waiting
        for k in range(4):
            ex.run_ahead((k % 2) * part, part, (((k + 1) % 2) * part, part) if k < 3 else None)

    info = ex.describe()
    info["standalone_ips"] = ex.standalone_ips(3.0)
    return call, 4 * part, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--cores", help="e.g. 1-15 (default: all)")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--settings", default="0x16,0x16d,0x64,0x64d,1x64,4x16,4x16d,8x16",
                        help="streams x batch pairs (streams 0: OpenVINO's THROUGHPUT hint; d: dynamic batch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    cores = parse_cores(args.cores)
    os.sched_setaffinity(0, set(cores))  # the peer's threads on these cores; the executor pins its own
    ov_precision = "bf16" if args.precision == "bf16" else "f32"
    runs: dict[str, Any] = {"peer THROUGHPUT b16": peer(args.model, cores, 16, ov_precision)}
    for item in args.settings.split(","):
        dynamic = item.endswith("d")
        streams, batch = (int(v) for v in item.rstrip("d").split("x"))
        runs[f"streams {streams} batch {batch}{' dyn' if dynamic else ''}"] = executor(
            args.model, cores, batch, streams, args.precision, dynamic)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (call, images, _info) in runs.items():
            rates[name].append(rate(call, images, args.seconds))
    peer_ips = statistics.median(rates["peer THROUGHPUT b16"])
    rows = []
    print(f"cpu_executor_sweep on {describe_machine()}: {args.model}, {len(cores)} cores, {args.precision}")
    for name, (_call, images, info) in runs.items():
        ips = statistics.median(rates[name])
        streams = info.get("openvino_streams", info.get("streams"))
        alone = info.get("standalone_ips")
        rows.append({"setting": name, "images_per_call": images, "streams_ran": streams, "ips": ips,
                     "ips_rounds": rates[name], "over_peer": ips / peer_ips, "standalone_ips": alone})
        print(f"{name:26s} {images:5d} img/call  {streams!s:>3} streams  {ips:8.1f} img/s  {ips / peer_ips:6.3f}x peer"
              + (f"  standalone {alone:8.1f}" if alone else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bench": "cpu_executor_sweep", "machine": describe_machine(), "model": args.model,
                       "cores": cores, "precision": args.precision, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
