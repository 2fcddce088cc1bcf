"""Goal 4: `autohet tune --model M --trials N` wall time, and its best against a grid, in one run.

The grid (stated in the output): single (GPU or first executor); fast_split, hat, fifo at their
default parameters; fast_split (w_s=1, r=0.5, threshold=1) and fifo (c=4) with unit=batches
x GPU batch {128, 256, 512} x precision {fp16, bf16} (channels_last); CPU executors at the pool
file's batch and grouping. Both use the same pool, images and output check.

Goal 3 in the same call: the exported config (runs/<experiment>/best.yaml, its own pool topology)
and the grid's best `single` are each rerun --repeats times after the grid; the medians are
compared (tuned / best single executor).

    python -m bench.tune_speed --model resnet18 --trials 30        # GPU machine
    python -m bench.tune_speed --smoke                             # CPU: lenet, 1 trial, tiny grid, 4096 images

The grid measures standalone limits as the tune does (once per executor class and configuration).
``--phase tune`` / ``--phase grid`` with the same ``--work DIR`` split the two halves over two
commands (each under a time limit); the second prints the comparison. ``--grid singles`` keeps
only the `single` points (goal 3 alone: the tuned config against the best single executor).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autohet.config import load_config
from autohet.context import RunContext
from autohet.core.models import ModelSpec, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.platform.ray_cluster import init_ray
from autohet.pool import RayPool, StandaloneCache, load_pool
from autohet.strategy_run import run_strategy
from bench._common import emit

REPO = Path(__file__).resolve().parents[1]
# the grid's strategy points: the seed's defaults, plus the per-executor sizing the tuner can pick
GRID_STRATEGIES: list[tuple[str, dict]] = [
    ("single", {}), ("fast_split", {}), ("hat", {}), ("fifo", {}),
    ("fast_split", {"w_s": 1, "r": 0.5, "threshold": 1, "unit": "batches"}),
    ("fifo", {"c": 4, "unit": "batches"}),
]


def _context(model: ModelSpec, workload: Workload) -> RunContext:
    """A run context whose limits are measured as the tune measures them (once per executor class)."""
    cache = StandaloneCache()
    return RunContext(model, workload, check_images=16, standalone_seconds=0.5,
                      standalone_provider=lambda pool, share, used: cache.measure(pool, 0.5, share, used=used))


def run_grid(model: str, pool_path: str, images: int, gpu_grid: list[dict],
             strategies: list[tuple[str, dict]], repeats: int = 0) -> tuple[list[dict], list[float]]:
    """The grid's rows, then ``repeats`` more runs of its best valid `single` point."""
    init_ray()
    spec = load_pool(pool_path)
    first = next((i for i, e in enumerate(spec.executors) if e.is_gpu), 0)
    pool = RayPool(spec)
    rows = []
    again: list[float] = []
    try:
        workload = Workload.from_spec(WorkloadSpec(images, input_shape(model)))
        pool.start(ModelSpec(model), workload)
        ctx = _context(ModelSpec(model), workload)
        for exec_params in gpu_grid:
            pool.configure({"gpu": exec_params} if exec_params else {})
            for strategy, params in strategies:
                params = {"executor": first} if strategy == "single" else params
                m = run_strategy(strategy, params, pool, ctx)
                rows.append({"strategy": strategy, "params": params, "gpu": exec_params,
                             "throughput_ips": m.throughput_ips, "output_ok": m.output_ok})
                print("grid", rows[-1], flush=True)
        singles = [r for r in rows if r["strategy"] == "single" and r["output_ok"]]
        if singles and repeats:
            best = max(singles, key=lambda r: r["throughput_ips"])
            pool.configure({"gpu": best["gpu"]} if best["gpu"] else {})
            again = [run_strategy("single", best["params"], pool, ctx).throughput_ips for _ in range(repeats)]
            print(f"best single {best['params']} {best['gpu']} again: {[round(x) for x in again]}", flush=True)
    finally:
        pool.shutdown()
    return rows, again


def rerun_config(path: Path, repeats: int, images: int) -> list[float]:
    """The exported config run ``repeats`` times over ``images`` on its own pool (as `autohet run --config`
    does)."""
    config = load_config(path)
    pool = RayPool(config.pool)
    try:
        workload = Workload.from_spec(WorkloadSpec(images, input_shape(config.model.name)))
        ctx = _context(config.model, workload)
        out = []
        for _ in range(repeats):
            m = run_strategy(config.strategy, config.params, pool, ctx)
            if not m.output_ok:
                raise SystemExit(f"the exported config failed its output check: {m.failures}")
            out.append(m.throughput_ips)
    finally:
        pool.shutdown()
    print(f"tuned config {config.strategy} {config.params} again: {[round(x) for x in out]}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--pool", default="actors/auto.yaml")
    parser.add_argument("--repeats", type=int, default=3, help="reruns of the tuned config and of the best single")
    parser.add_argument("--work", help="working folder (kept); default: a temporary one, removed at the end")
    parser.add_argument("--phase", choices=["all", "tune", "grid"], default="all")
    parser.add_argument("--time-budget", type=float, default=600.0, help="the tune's wall budget (s)")
    parser.add_argument("--grid", choices=["full", "singles"], default="full",
                        help="singles: only `single` over the batch x precision grid (goal 3's best single "
                             "executor, without goal 4's strategy points)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.trials, args.pool, args.repeats = "lenet", 1, "actors/cpu2.yaml", 1
        gpu_grid, strategies = [{}], [("single", {}), ("fast_split", {})]
    else:
        gpu_grid = [{"batch": b, "precision": p, "channels_last": True}
                    for b in (128, 256, 512) for p in ("fp16", "bf16")]
        strategies = GRID_STRATEGIES if args.grid == "full" else [("single", {})]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="autohet-tune-speed-"))
    experiment = f"tune-speed-{args.model}"
    if args.phase in ("all", "tune"):
        work.mkdir(parents=True, exist_ok=True)
        for folder in ("search_spaces", "conf"):
            shutil.copytree(REPO / folder, work / folder, dirs_exist_ok=True)
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "autohet.cli", "tune", "--model", args.model, "--trials",
                               str(args.trials), "--pool", str(REPO / args.pool), "--experiment", experiment,
                               "--time-budget", str(args.time_budget)],
                              cwd=work, stdout=sys.stdout, stderr=subprocess.STDOUT, text=True)
        tune_s = time.time() - t0  # the tune's own progress lines went straight to this output
        (work / "tune_wall_s").write_text(f"{tune_s:.1f}")
        if proc.returncode != 0:
            raise SystemExit(f"tune failed ({proc.returncode})")
        print(f"tune wall: {tune_s:.1f} s", flush=True)
        if args.phase == "tune":
            return
    tune_s = float((work / "tune_wall_s").read_text())
    best = yaml.safe_load((work / "runs" / experiment / "best.yaml").read_text())
    images = int(best["workload"]["images"])
    if args.smoke:  # the grid and the reruns over fewer images than the tune sized (32768 lenet images on
        images = min(images, 4096)  # the 2-core box: 9 s a single run): the script's path, not its figures
    grid, single_again = run_grid(args.model, str(REPO / args.pool), images, gpu_grid, strategies, args.repeats)
    grid_best = max((r for r in grid if r["output_ok"]), key=lambda r: r["throughput_ips"])
    tuned = float(best["measured"]["throughput_ips"])
    tuned_again = rerun_config(work / "runs" / experiment / "best.yaml", args.repeats, images)
    rows = [{"model": args.model, "trials": args.trials, "tune_wall_s": tune_s, "images": images,
             "tuned_best": f"{best['strategy']} {best['params']} {best['executor_params']}", "tuned_ips": tuned,
             "grid_best": f"{grid_best['strategy']} {grid_best['params']} {grid_best['gpu']}",
             "grid_ips": grid_best["throughput_ips"],
             "tuned_over_grid": tuned / grid_best["throughput_ips"], "grid_runs": len(grid),
             "tuned_rerun_median": statistics.median(tuned_again),
             "best_single_rerun_median": statistics.median(single_again) if single_again else None,
             "tuned_over_best_single": (statistics.median(tuned_again) / statistics.median(single_again)
                                        if single_again else None)}]
    emit("tuning speed and quality", rows, ["model", "trials", "tune_wall_s", "images", "tuned_ips", "grid_ips",
                                           "tuned_over_grid", "grid_runs", "tuned_rerun_median",
                                           "best_single_rerun_median", "tuned_over_best_single", "tuned_best",
                                           "grid_best"], args.out)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
