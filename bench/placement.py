"""Issue 4 on a CPU+GPU machine: per-block times on each device and the placed model's batch-1
latency next to the whole model on each device, measured in one run per model (PyTorch blocks).

    python -m bench.placement --models vgg16,resnet18,googlenet      # GPU machine
    python -m bench.placement --smoke                                # CPU: lenet, cpu only
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

from autohet.models import ModelSpec, input_shape
from autohet.strategies.placement import PlacementJob
from autohet.workload import Workload, WorkloadSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--models", default="vgg16,resnet18,googlenet")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--backend", default="torch", choices=["torch", "tvm", "per_block"],
                        help="tvm/per_block need MetaSchedule databases (autohet compile, bench.tvm_gpu)")
    parser.add_argument("--out")
    args = parser.parse_args()
    devices = ["cpu"] if args.smoke or not torch.cuda.is_available() else ["cpu", "cuda:0"]
    models = ["lenet"] if args.smoke else args.models.split(",")
    results = []
    for name in models:
        images = Workload.from_spec(WorkloadSpec(args.requests, input_shape(name))).rows(0, args.requests)
        out = PlacementJob(os.cpu_count() or 1).run(ModelSpec(name), np.ascontiguousarray(images), devices,
                                                     {"x": 2, "backend": args.backend, "runs": 10,
                                                      "start": "greedy", "assignment": None})
        p50 = float(np.median(out["times_s"])) * 1e3
        best = min(out["baselines_p50_ms"].values())
        print(f"\n{name}: per-block mean ms (10 runs after warm-up)")
        for block in out["blocks"]:
            cells = "  ".join(f"{key.split('@')[1]} {ms:.3f}" for key, ms in out["block_times_ms"].items()
                              if key.split("@")[0] == block)
            print(f"  {block:28s} {cells}  -> {out['assignment'][block]} ({out['block_backend'][block]})")
        base = "  ".join(f"{k} {v:.3f}" for k, v in out["baselines_p50_ms"].items())
        print(f"  batch-1 p50 ms: placed {p50:.3f} | whole model {base} | placed/best-single {p50 / best:.3f}"
              f" | greedy {out['greedy']}")
        results.append({"model": name, "placed_p50_ms": p50, "baselines_p50_ms": out["baselines_p50_ms"],
                        "assignment": out["assignment"], "block_times_ms": out["block_times_ms"],
                        "placed_over_best_single": p50 / best})
    if args.out:
        Path(args.out).write_text(json.dumps({"devices": devices, "results": results}, indent=1))


if __name__ == "__main__":
    main()
