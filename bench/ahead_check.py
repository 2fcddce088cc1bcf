"""A tune's compiles ahead (``autohet.tuning.ahead``) on real hardware where only one GPU is lent: the one
GPU stands in for two. SIMULATED second GPU: both GPU executors run on GPU 0, so the compile ahead shares
the GPU of the trial measured meanwhile and the figures of the GPUs together mean nothing; what this
checks is the path (the plan, the idle executor's compile on the cores no GPU feeds, the warm cache the
next trial finds) and what each trial spent acquiring, with the plan and without it, each from a cold
compile cache in a fresh process and Ray:

    python -m bench.ahead_check --model resnet18 --time-budget 150 --out results/ahead_check.json

(``--plan on``: the tune with the plan only.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import compile_cache_env, emit

SIMULATED_GPUS = 2


def two_on_one() -> None:
    """Ray's worker set-up hook (and the driver's): the auto pool finds two GPUs (SIMULATED: both GPU 0)."""
    import autohet.pool.spec as spec
    from autohet.executors.green import equal_share

    spec._local_gpus = lambda: SIMULATED_GPUS
    spec._local_sm_shares = lambda parts: [equal_share(0, parts)] * SIMULATED_GPUS


def child(model: str, budget: float, ahead: bool) -> None:
    """One tune in this process: Ray started with two GPU slots over the one GPU, then ``autohet tune``."""
    import ray

    two_on_one()
    if not ahead:
        from autohet.tuning.initial import FirstPoints

        FirstPoints.ahead = lambda self: []  # the plan left empty: every compile on the trial's own path
    ray.init(address="local", num_cpus=(os.cpu_count() or 1) + 1, num_gpus=SIMULATED_GPUS, include_dashboard=False,
             log_to_driver=False, namespace="autohet",
             runtime_env={"worker_process_setup_hook": "bench.ahead_check.two_on_one",
                          "env_vars": {"CUDA_VISIBLE_DEVICES": "0"}})  # every executor's GPU: GPU 0
    from autohet.cli import main as cli

    raise SystemExit(cli(["tune", "--model", model, "--time-budget", str(budget), "--experiment", "ahead"]))


def trials(db: Path, experiment: str = "ahead") -> list[dict[str, Any]]:
    """Each trial's strategy, GPU setting and seconds acquiring and compiling, in the order they ran."""
    from autohet.tracking import experiment_runs

    _, _, runs = experiment_runs(experiment, f"sqlite:///{db}")
    rows = []
    for run in sorted(runs, key=lambda r: r.info.start_time):
        params, metrics = run.data.params, run.data.metrics
        rows.append({"strategy": params.get("strategy"), "executor": params.get("single.executor"),
                     "backend": params.get("exec.gpu.backend"), "batch": params.get("exec.gpu.batch"),
                     "groups": params.get("pool.max_cpu_groups"), "cpu_group": params.get("pool.cpu_group_size"),
                     "acquire_s": metrics.get("time.acquire_s"), "compile_s": metrics.get("time.compile_s"),
                     "standalone_s": metrics.get("time.standalone_s"), "ips": metrics.get("throughput_ips")})
    return rows


def one(model: str, budget: float, ahead: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        env = compile_cache_env(str(Path(work) / "cache"))
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray then takes the two GPU slots it is told; its workers see GPU 0
        env.update(RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES="1", AUTOHET_DEBUG="1")  # a failure's traceback
        proc = subprocess.run([sys.executable, "-m", "bench.ahead_check", "--child", "--model", model,
                               "--time-budget", str(budget)] + ([] if ahead else ["--no-ahead"]),
                              cwd=work, env=env, capture_output=True, text=True, timeout=budget + 600)
        breakdown = next((line for line in reversed(proc.stderr.splitlines()) if "trials in" in line), "")
        print(f"ahead={ahead}: exit {proc.returncode}\n{breakdown}", flush=True)
        if proc.returncode != 0 or not breakdown:
            print(proc.stdout[-2000:] + proc.stderr[-4000:], flush=True)
        db = Path(work) / "runs" / "mlflow.db"
        rows = trials(db) if db.is_file() else []
    for r in rows:
        print(json.dumps(r), flush=True)
    acquire = sum(r["acquire_s"] or 0.0 for r in rows)
    return {"model": model, "ahead": ahead, "exit": proc.returncode, "trials": len(rows), "acquire_s": acquire,
            "inductor_acquire_s": sum(r["acquire_s"] or 0.0 for r in rows if r["backend"] == "inductor"
                                      and r["strategy"] == "single" and r["cpu_group"] != "all"),
            "breakdown": breakdown, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--time-budget", type=float, default=150.0)
    parser.add_argument("--out")
    parser.add_argument("--plan", choices=("both", "on", "off"), default="both",
                        help="run the tune with the plan off, then on (both), or one of them")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-ahead", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.time_budget, not args.no_ahead)
        return
    rows = []
    for ahead in {"both": (False, True), "on": (True,), "off": (False,)}[args.plan]:
        rows.append(one(args.model, args.time_budget, ahead))
        if rows[-1]["exit"] != 0:
            break
    emit("ahead_check (SIMULATED second GPU: both on GPU 0)", rows,
         ["model", "ahead", "exit", "trials", "acquire_s", "inductor_acquire_s"], args.out)


if __name__ == "__main__":
    main()
