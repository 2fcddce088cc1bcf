"""Subgraph placement on the in-process engine: per-block times on each device and the placed model's
batch-1 latency next to the whole model on each device (same engine, CUDA graphs on the GPU where
``--graphs on``), measured in one run per model.

    python -m bench.placement --models vgg16,resnet18,googlenet      # GPU machine: GPU + one CPU group
    python -m bench.placement --smoke                                # CPU: lenet on two CPU groups
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from autohet.core.models import ModelSpec, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.engine import build_engine
from autohet.pool import detect_executors
from autohet.strategies.placement import PlacementJob


def devices() -> list:
    """Every GPU (fed by one core) and one CPU group of the other cores; two groups without a GPU."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    group = max(1, len(cores) - gpus) if gpus else max(1, len(cores) // 2)
    return detect_executors(cores, gpus, {"cpu_group_size": group, "max_cpu_groups": 1 if gpus else 2})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--models", default="vgg16,resnet18,googlenet")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--backend", default="torch", choices=["torch", "tvm", "per_block"],
                        help="tvm/per_block need MetaSchedule databases (autohet compile, bench.tvm_gpu)")
    parser.add_argument("--graphs", default="on", help="on, off or on,off: CUDA graphs for GPU segments")
    parser.add_argument("--out")
    args = parser.parse_args()
    specs = devices()
    names = [s.name for s in specs]
    models = ["lenet"] if args.smoke else args.models.split(",")
    results = []
    engine = build_engine(specs)
    try:
        for name in models:
            images = Workload.from_spec(WorkloadSpec(args.requests, input_shape(name))).rows(0, args.requests)
            for graphs in [g.strip() == "on" for g in args.graphs.split(",")]:
                params = {"x": 2, "backend": args.backend, "runs": 10, "start": "greedy", "assignment": None,
                          "graphs": graphs}
                result = PlacementJob(ModelSpec(name), np.ascontiguousarray(images), names, params).run(engine)
                out = result.report
                p50 = float(np.median(result.times_s)) * 1e3
                best = min(out["baselines_p50_ms"].values())
                print(f"\n{name} (graphs {'on' if graphs else 'off'}): per-block mean ms (10 runs after warm-up)")
                for block in out["blocks"]:
                    cells = "  ".join(f"{key.split('@')[1]} {ms:.3f}" for key, ms in out["block_times_ms"].items()
                                      if key.split("@")[0] == block)
                    print(f"  {block:28s} {cells}  -> {out['assignment'][block]} ({out['block_backend'][block]})")
                base = "  ".join(f"{k} {v:.3f}" for k, v in out["baselines_p50_ms"].items())
                print(f"  batch-1 p50 ms: placed {p50:.3f} | whole model {base} | placed/best-single "
                      f"{p50 / best:.3f}")
                results.append({"model": name, "graphs": graphs, "placed_p50_ms": p50,
                                "baselines_p50_ms": out["baselines_p50_ms"], "assignment": out["assignment"],
                                "block_times_ms": out["block_times_ms"], "links": out["links"],
                                "placed_over_best_single": p50 / best})
    finally:
        engine.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"devices": [s.to_dict() for s in specs], "results": results},
                                             indent=1))


if __name__ == "__main__":
    main()
