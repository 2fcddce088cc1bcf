"""Goal 4: `autohet tune --model M --trials N` wall time, and its best against a grid, in one run.

The grid (stated in the output): single (GPU or first executor); fast_split, hat, fifo at their
default parameters; fast_split (w_s=1, r=0.5, threshold=1) and fifo (c=4) with unit=batches
x GPU batch {128, 256, 512} x precision {fp16, bf16} (channels_last); CPU executors at the pool
file's batch and grouping. Both use the same pool, images and output check.

    python -m bench.tune_speed --model resnet18 --trials 30        # GPU machine
    python -m bench.tune_speed --smoke                             # CPU: lenet, 4 trials, tiny grid
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autohet.models import ModelSpec, input_shape
from autohet.pool import RayPool, load_pool
from autohet.ray_runtime import init_ray
from autohet.run import RunContext, run_strategy
from autohet.workload import Workload, WorkloadSpec
from bench._common import emit

REPO = Path(__file__).resolve().parents[1]
# the grid's strategy points: the seed's defaults, plus the per-executor sizing the tuner can pick
GRID_STRATEGIES: list[tuple[str, dict]] = [
    ("single", {}), ("fast_split", {}), ("hat", {}), ("fifo", {}),
    ("fast_split", {"w_s": 1, "r": 0.5, "threshold": 1, "unit": "batches"}),
    ("fifo", {"c": 4, "unit": "batches"}),
]


def run_grid(model: str, pool_path: str, images: int, gpu_grid: list[dict],
             strategies: list[tuple[str, dict]]) -> list[dict]:
    init_ray()
    spec = load_pool(pool_path)
    first = next((i for i, e in enumerate(spec.executors) if e.kind == "gpu"), 0)
    pool = RayPool(spec)
    rows = []
    try:
        workload = Workload.from_spec(WorkloadSpec(images, input_shape(model)))
        pool.start(ModelSpec(model), workload)
        ctx = RunContext(ModelSpec(model), workload, check_images=16, standalone_seconds=0.5)
        for exec_params in gpu_grid:
            pool.configure({"gpu": exec_params} if exec_params else {})
            for strategy, params in strategies:
                params = {"executor": first} if strategy == "single" else params
                m = run_strategy(strategy, params, pool, ctx)
                rows.append({"strategy": strategy, "params": params, "gpu": exec_params,
                             "throughput_ips": m.throughput_ips, "output_ok": m.output_ok})
                print("grid", rows[-1], flush=True)
    finally:
        pool.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--pool", default="actors/auto.yaml")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.trials, args.pool = "lenet", 4, "actors/cpu2.yaml"
        gpu_grid, strategies = [{}], [("single", {}), ("fast_split", {})]
    else:
        gpu_grid = [{"batch": b, "precision": p, "channels_last": True}
                    for b in (128, 256, 512) for p in ("fp16", "bf16")]
        strategies = GRID_STRATEGIES
    work = Path(tempfile.mkdtemp(prefix="autohet-tune-speed-"))
    shutil.copytree(REPO / "search_spaces", work / "search_spaces")
    shutil.copytree(REPO / "conf", work / "conf")
    experiment = f"tune-speed-{args.model}"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "autohet.cli", "tune", "--model", args.model, "--trials",
                           str(args.trials), "--pool", str(REPO / args.pool), "--experiment", experiment],
                          cwd=work, stdout=sys.stdout, stderr=subprocess.STDOUT, text=True)
    tune_s = time.time() - t0  # the tune's own progress lines went straight to this output
    if proc.returncode != 0:
        raise SystemExit(f"tune failed ({proc.returncode})")
    best = yaml.safe_load((work / "runs" / experiment / "best.yaml").read_text())
    images = int(best["workload"]["images"])
    grid = run_grid(args.model, str(REPO / args.pool), images, gpu_grid, strategies)
    grid_best = max((r for r in grid if r["output_ok"]), key=lambda r: r["throughput_ips"])
    tuned = float(best["measured"]["throughput_ips"])
    rows = [{"model": args.model, "trials": args.trials, "tune_wall_s": tune_s, "images": images,
             "tuned_best": f"{best['strategy']} {best['params']} {best['executor_params']}", "tuned_ips": tuned,
             "grid_best": f"{grid_best['strategy']} {grid_best['params']} {grid_best['gpu']}",
             "grid_ips": grid_best["throughput_ips"],
             "tuned_over_grid": tuned / grid_best["throughput_ips"], "grid_runs": len(grid)}]
    emit("tuning speed and quality", rows, ["model", "trials", "tune_wall_s", "images", "tuned_ips", "grid_ips",
                                           "tuned_over_grid", "grid_runs", "tuned_best", "grid_best"], args.out)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
