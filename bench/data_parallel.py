"""Goals 2 and 3: GPU + CPU groups together, measured side by side in one run per model.

For each model: the best single executor over a grid of GPU batch x precision ("tuned" single),
then fast_split, hat and fifo over a small parameter grid at that batch/precision. Prints each
multi-device run's efficiency (throughput / the limit measured in the same run), the ratio of
the best multi-device throughput to the best single executor, and the run's profile: where the
gap to the limit went (``Measurement.losses``, summed per executor kind, shares of the limit):
idle before the first unit / between units / after the last, and ``slow`` (images short of the
standalone speed while busy). Each point runs with and without lookahead (the GPU's next unit
queued while its current one drains), one after the other, so the two compare side by side.

    python -m bench.data_parallel                    # GPU machine
    python -m bench.data_parallel --max-cpu-groups 2 # leave the other cores to the host
    python -m bench.data_parallel --smoke            # CPU: lenet on two 1-core groups, 0.5 s runs
"""

from __future__ import annotations

import argparse

from autohet.context import RunContext
from autohet.core.models import ModelSpec, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.platform.ray_cluster import init_ray
from autohet.pool import RayPool, load_pool
from autohet.strategy_run import run_strategy
from bench._common import emit

# Sized for a GPU ~100-1000x faster than one CPU group. The seed's rules count fixed sizes in images
# (the same probe/chunk for every executor); `unit: batches` counts them in each executor's batches.
SMALL_GRIDS = {
    "fast_split": [{"w_s": 1, "r": 0.5, "threshold": 1, "unit": "batches"},
                   {"w_s": 1, "r": 0.9, "threshold": 64, "unit": "batches"},
                   {"w_s": 2, "r": 0.8, "threshold": 1, "unit": "batches"}],
    "hat": [{"s": 32}],
    "fifo": [{"c": 4, "unit": "batches"}],
}
GRIDS = {
    "fast_split": [{"w_s": 32, "r": 0.5},
                   {"w_s": 1, "r": 0.5, "threshold": 1, "unit": "batches"},
                   {"w_s": 1, "r": 0.9, "threshold": 64, "unit": "batches"},
                   {"w_s": 2, "r": 0.8, "threshold": 1, "unit": "batches"}],
    "hat": [{"s": 32}],
    "fifo": [{"c": 64}, {"c": 4, "unit": "batches"}, {"c": 16, "unit": "batches"}],
}


def losses_by_kind(m, pool_spec) -> dict[str, dict[str, float]]:
    """``Measurement.losses`` summed over the executors of each kind (gpu, cpu)."""
    kinds = {e.name: e.kind for e in pool_spec.executors}
    out: dict[str, dict[str, float]] = {}
    for name, parts in m.losses().items():
        agg = out.setdefault(kinds.get(name, "?"), {})
        for key, value in parts.items():
            agg[key] = agg.get(key, 0.0) + value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--models", default="resnet18,vgg16,mobilenet_v2")
    parser.add_argument("--cpu-group-size", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="target seconds per run")
    parser.add_argument("--gpu-batches", default="256")
    parser.add_argument("--precisions", default="fp16")
    parser.add_argument("--cpu-batch", type=int, default=8)
    parser.add_argument("--max-cpu-groups", type=int, help="use at most this many CPU groups (the rest of the "
                        "cores stay free for the driver, Ray and the GPU's feeding thread)")
    parser.add_argument("--grid", choices=["full", "small"], default="full",
                        help="small: only the per-executor-sized (unit=batches) points, hat and fifo")
    parser.add_argument("--lookahead", default="on,off", help="on, off or on,off (both, side by side)")
    parser.add_argument("--out")
    args = parser.parse_args()
    init_ray()
    if args.smoke:
        models, pool_spec = ["lenet"], load_pool("actors/cpu2.yaml")
        args.seconds = 0.5  # runs of at least 1024 images: the script's path, not its figures
        gpu_grid = [{}]
        grids = {"fast_split": [{"w_s": 64}], "hat": [{"s": 128}], "fifo": [{"c": 256}]}
    else:
        models = args.models.split(",")
        overrides = {"cpu_group_size": args.cpu_group_size, "cpu": {"batch": args.cpu_batch}}
        if args.max_cpu_groups is not None:
            overrides["max_cpu_groups"] = args.max_cpu_groups
        pool_spec = load_pool("actors/auto.yaml", auto_overrides=overrides)
        gpu_grid = [{"batch": int(b), "precision": p, "channels_last": True}
                    for b in args.gpu_batches.split(",") for p in args.precisions.split(",")]
        grids = GRIDS if args.grid == "full" else SMALL_GRIDS
    print("pool:", ", ".join(f"{e.name} {e.device}" for e in pool_spec.executors), flush=True)
    modes = [{"on": True, "off": False}[v] for v in args.lookahead.split(",")]
    gpu_index = next((i for i, e in enumerate(pool_spec.executors) if e.is_gpu), 0)
    rows = []
    for name in models:
        model = ModelSpec(name)
        pool = RayPool(pool_spec)
        try:
            probe = Workload.from_spec(WorkloadSpec(4096, input_shape(name)))
            pool.start(model, probe)
            speed = sum(pool.standalone_ips(0.5))
            images = max(1024, int(speed * args.seconds))
            workload = Workload(probe.bank, images)
            ctx = RunContext(model, workload, check_images=8, standalone_seconds=0.3)
            best_single, best_exec = None, {}
            for exec_params in gpu_grid:
                pool.configure({"gpu": exec_params})
                m = run_strategy("single", {"executor": gpu_index}, pool, ctx)
                print(f"ROW {name} single {exec_params} ips {m.throughput_ips:.0f} ok {m.output_ok}", flush=True)
                if m.output_ok and (best_single is None or m.throughput_ips > best_single.throughput_ips):
                    best_single, best_exec = m, exec_params
            assert best_single is not None
            pool.configure({"gpu": best_exec})
            best_multi = None
            points = [(s, p, a) for s, grid in grids.items() for p in grid for a in modes]
            for strategy, params, ahead in points:
                ctx.lookahead = ahead
                m = run_strategy(strategy, params, pool, ctx)
                loss = losses_by_kind(m, pool_spec)
                rows.append({"model": name, "strategy": strategy, "params": params, "gpu": best_exec,
                             "lookahead": ahead,
                             "throughput_ips": m.throughput_ips, "limit_ips": m.limit_ips,
                             "efficiency": m.efficiency, "output_ok": m.output_ok,
                             "vs_best_single": m.throughput_ips / best_single.throughput_ips,
                             "wall_s": m.wall_s, "standalone": [e.standalone_ips for e in m.executors],
                             "loss": loss})
                print(f"ROW {name} {strategy} {params} lookahead {'on' if ahead else 'off'} "
                      f"eff {m.efficiency:.3f} ips {m.throughput_ips:.0f} "
                      f"limit {m.limit_ips:.0f} vs_single {rows[-1]['vs_best_single']:.3f} ok {m.output_ok} "
                      f"wall {m.wall_s:.2f}s", flush=True)
                print("     loss " + "  ".join(f"{kind}: " + " ".join(f"{k} {v:.3f}" for k, v in parts.items())
                                              for kind, parts in loss.items()), flush=True)
                if m.output_ok and (best_multi is None or m.throughput_ips > best_multi["throughput_ips"]):
                    best_multi = rows[-1]
            rows.append({"model": name, "strategy": "BEST single", "params": best_exec, "gpu": best_exec,
                         "throughput_ips": best_single.throughput_ips, "limit_ips": best_single.limit_ips,
                         "efficiency": best_single.efficiency, "output_ok": best_single.output_ok,
                         "vs_best_single": 1.0})
            if best_multi:
                rows.append({**best_multi, "strategy": f"BEST {best_multi['strategy']}"})
        finally:
            pool.shutdown()
    emit("data-parallel efficiency and never-worse", rows,
         ["model", "strategy", "params", "lookahead", "throughput_ips", "limit_ips", "efficiency", "vs_best_single",
          "output_ok"],
         args.out)


if __name__ == "__main__":
    main()
