"""Where a GPU executor's inductor set-up spends its time, cold and warm, alone and two at once, on one GPU.

A two-GPU tune of efficientnet_b0 waited 27 s for its settings compiled ahead (BENCHMARKS.md 43); this says
what the set-up it waited for is made of. Each case starts fresh processes, each sets one setting up as a
tune's executor does (``make_executor`` and ``load`` on GPU 0, its compiles on ``--cores``), and reports: the
seconds from its start to its imports done, its set-up, the compile inside it, inductor's cache hits and
dynamo's phases. Cases: each batch cold alone (a cache of its own), the first again warm (that cache), the
batches cold at once on the same cores (one fresh cache), and cold at once on halves of the cores.

    python -m bench.compile_cost --model efficientnet_b0 --batches 256,512 --cores 2-31

(The figures of BENCHMARKS.md 43 were taken with the feeding core among the compile cores.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench._common import REPO, compile_cache_env
from bench.cpu_peers import parse_cores


def child(model: str, batch: int, cores: list[int], began: float) -> None:
    """One set-up, as a tune's GPU executor does it; its report is the last line printed."""
    feeding = os.sched_getaffinity(0) - set(cores)
    os.sched_setaffinity(0, set(cores) | set(sorted(feeding)[:1]))
    imported = time.time()
    import numpy as np
    import torch

    from autohet.core.models import ModelSpec, input_shape
    from autohet.core.workload import Workload
    from autohet.executors import ExecutorSpec, make_executor
    from autohet.executors.compiled import compiling_on

    imported = time.time() - imported
    feeder = min(feeding) if feeding else cores[0]  # a feeding core as a tune gives one, off the compile cores
    spec = ExecutorSpec("gpu0", "gpu", (feeder,), gpu=0, batch=batch, precision="fp16", channels_last=True,
                        backend="inductor")
    start = time.perf_counter()
    executor = make_executor(spec, ModelSpec(model))
    with compiling_on(frozenset(cores)):
        executor.load(Workload(np.zeros((1, *input_shape(model)), dtype=np.float32), 1))
    set_up = time.perf_counter() - start
    counters = torch._dynamo.utils.counters["inductor"]
    phases = torch._dynamo.utils.compile_times(repr="str", aggregate=True)
    print(phases, file=sys.stderr)
    print(json.dumps({"batch": batch, "import_s": imported, "set_up_s": set_up, "compile_s": float(executor.compile_s),
                      "fx_hits": int(counters.get("fxgraph_cache_hit", 0)),
                      "fx_misses": int(counters.get("fxgraph_cache_miss", 0)), "wall_s": time.time() - began}))


def case(name: str, model: str, jobs: list[tuple[int, list[int]]], cache: str) -> list[dict[str, Any]]:
    """``jobs`` (batch, cores) set up at once, each in a fresh process, into ``cache``; their reports."""
    env = compile_cache_env(cache)
    began = time.time()
    # files, not pipes: a child is read after the ones before it ended, and must not block on a full pipe meanwhile
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in jobs]  # noqa: SIM115 (_read)
    procs = [subprocess.Popen([sys.executable, "-m", "bench.compile_cost", "--child", "--model", model,
                               "--batches", str(batch), "--cores", ",".join(map(str, cores)), "--began", str(began)],
                              cwd=REPO, env=env, stdout=out, stderr=err, text=True)
             for (batch, cores), (out, err) in zip(jobs, files, strict=True)]
    reports = []
    for proc, (batch, cores), (out_file, err_file) in zip(procs, jobs, files, strict=True):
        proc.wait(timeout=600)
        out, err = (_read(f) for f in (out_file, err_file))
        if proc.returncode != 0:
            raise SystemExit(f"{name} b{batch}: exit {proc.returncode}: {err.strip().splitlines()[-1:]}")
        report = json.loads(out.strip().splitlines()[-1])
        report.update(case=name, cores=f"{cores[0]}-{cores[-1]}")
        reports.append(report)
        phases = [line for line in err.splitlines() if line.strip() and "warn" not in line.lower()]
        print(f"{name} b{batch} dynamo phases:\n  " + "\n  ".join(phases[-12:]), file=sys.stderr)
    return reports


def _read(file: Any) -> str:
    file.seek(0)
    text = file.read()
    file.close()
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="efficientnet_b0")
    parser.add_argument("--batches", default="256,512")
    parser.add_argument("--cores", help="the cores compiles run on, as 2-31 (a tune's: those no GPU feeds; "
                        "default: this process's but its first two, the feeding cores of two GPUs)")
    parser.add_argument("--out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--began", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    cores = parse_cores(args.cores) if args.cores else sorted(os.sched_getaffinity(0))[2:] or [0]
    if args.child:
        child(args.model, batches[0], cores, args.began)
        return
    half = len(cores) // 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        for batch in batches:
            rows += case("cold alone", args.model, [(batch, cores)], f"{work}/alone{batch}")
        rows += case("warm alone", args.model, [(batches[0], cores)], f"{work}/alone{batches[0]}")
        rows += case("cold at once", args.model, [(b, cores) for b in batches], f"{work}/once")
        if len(batches) == 2 and half:
            rows += case("cold at once, half the cores each", args.model,
                         [(batches[0], cores[:half]), (batches[1], cores[half:])], f"{work}/halves")
    print(f"\n{args.model}: inductor fp16 channels_last set-ups on GPU 0, each in a fresh process")
    print(f"{'case':<36} {'batch':>5} {'cores':>6} {'imports':>8} {'set-up':>7} {'compile':>8} {'fx hit/miss':>11} "
          f"{'ready after':>11}")
    for r in rows:
        print(f"{r['case']:<36} {r['batch']:>5} {r['cores']:>6} {r['import_s']:>7.1f}s {r['set_up_s']:>6.1f}s "
              f"{r['compile_s']:>7.1f}s {r['fx_hits']:>5}/{r['fx_misses']:<5} {r['wall_s']:>10.1f}s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bench": "compile_cost", "model": args.model, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
