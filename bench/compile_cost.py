"""Where a GPU executor's inductor set-up spends its time, cold and warm, alone and two at once, on one GPU.

A two-GPU tune of efficientnet_b0 waited 27 s for its settings compiled ahead (BENCHMARKS.md 43); this says
what the set-up it waited for is made of. Each case starts fresh processes, each sets one setting up as a
tune's executor does (``make_executor`` and ``load`` on GPU 0, its compiles on ``--cores``), and reports: the
seconds from its start to its imports done, its set-up, the compile inside it, inductor's cache hits and
dynamo's phases, and where the set-up's own seconds went (``--steps``: the model built, the compile, each
warm-up run). Cases: each batch cold alone (a cache of its own), each again warm (its cache; ``--options``:
its img/s after, cuDNN without its benchmark, a cProfile of the set-up), the batches cold at once on the same
cores (one fresh cache), cold at once on halves of the cores, and ``second``: the first batch set up, then the
others in the same process from a warm cache, as a live executor's actor sets up a setting another process
compiled (``--cases`` picks some). BENCHMARKS.md 43 and 44.

    python -m bench.compile_cost --model efficientnet_b0 --batches 256,512 --cores 2-31
    python -m bench.compile_cost --batches 256,512 --cases warm,second --steps
    python -m bench.compile_cost --model resnet18 --batches 256 --cases warm --options "speed;speed,heuristics"

(The figures of BENCHMARKS.md 43 were taken with the feeding core among the compile cores.)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench._common import REPO, compile_cache_env
from bench.cpu_peers import parse_cores

CASES = ("cold", "warm", "at-once", "halves", "second")


def _timed_steps() -> list[tuple[str, float]]:
    """Wraps the GPU executor's set-up steps (the model built, the compile, each run) with timers; the list
    they append to, (step, seconds), in order."""
    import torch

    import autohet.executors.gpu as gpu

    steps: list[tuple[str, float]] = []

    def timed(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()
            steps.append((name if name != "run" else f"run {args[2]}", time.perf_counter() - start))
            return out
        return call

    gpu.build_model = timed("build_model", gpu.build_model)
    gpu.compile_module = timed("compile_module", gpu.compile_module)
    gpu.GpuExecutor.run = timed("run", gpu.GpuExecutor.run)
    return steps


def _cudnn_heuristics() -> None:
    """The executor's set-up with cuDNN choosing its algorithms by heuristics, not by timing each conv's
    candidates at its first run (``cudnn.benchmark``, which the GPU executor turns on)."""
    import torch

    import autohet.executors.gpu as gpu

    activate = gpu.GpuExecutor._activate

    def without_benchmark(self: Any) -> None:
        torch.backends.cudnn.benchmark = False
        activate(self)

    gpu.GpuExecutor._activate = without_benchmark


def child(model: str, batches: list[int], cores: list[int], began: float, steps: bool, options: str = "") -> None:
    """One set-up, as a tune's GPU executor does it, then the other ``batches`` on the same executor (an
    actor's next settings); the report of each is printed, one line each, last."""
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
    timed = _timed_steps() if steps else None
    if "heuristics" in options:
        _cudnn_heuristics()
    feeder = min(feeding) if feeding else cores[0]  # a feeding core as a tune gives one, off the compile cores
    spec = ExecutorSpec("gpu0", "gpu", (feeder,), gpu=0, batch=batches[0], precision="fp16", channels_last=True,
                        backend="inductor")
    executor = make_executor(spec, ModelSpec(model))
    reports = []
    for n, batch in enumerate(batches):
        hits, misses = _fx_cache()
        profile = cProfile.Profile() if "profile" in options else None
        start = time.perf_counter()
        with compiling_on(frozenset(cores)):
            if profile is not None:
                profile.enable()
            if n == 0:
                images = batch if "speed" in options else 1
                executor.load(Workload(np.zeros((images, *input_shape(model)), dtype=np.float32), images))
            else:
                executor.configure({"batch": batch})
            if profile is not None:
                profile.disable()
        set_up = time.perf_counter() - start
        if profile is not None:
            pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(45)
        speed = executor.standalone_ips(2.0) if "speed" in options else None
        phases = torch._dynamo.utils.compile_times(repr="str", aggregate=True)
        print(f"b{batch} (setting {n + 1} of the process):\n{phases}", file=sys.stderr)
        if timed is not None:
            print(f"b{batch} steps: " + ", ".join(f"{name} {s:.2f}s" for name, s in timed), file=sys.stderr)
            timed.clear()
        reports.append({"batch": batch, "import_s": imported, "set_up_s": set_up,
                        "compile_s": float(executor.compile_s),
                        "fx_hits": _fx_cache()[0] - hits, "fx_misses": _fx_cache()[1] - misses,
                        "wall_s": time.time() - began, "setting": n + 1, "img_s": speed})
    for report in reports:
        print(json.dumps(report))


def _fx_cache() -> tuple[int, int]:
    """Inductor's FX graph cache hits and misses so far (its counters are replaced as it resets them: read anew)."""
    import torch

    counters = torch._dynamo.utils.counters["inductor"]
    return int(counters.get("fxgraph_cache_hit", 0)), int(counters.get("fxgraph_cache_miss", 0))


def case(name: str, model: str, jobs: list[tuple[list[int], list[int]]], cache: str,
         steps: bool = False, options: str = "") -> list[dict[str, Any]]:
    """``jobs`` (batches, cores) set up at once, each in a fresh process (its batches one after the other),
    into ``cache``; their reports."""
    env = compile_cache_env(cache)
    began = time.time()
    # files, not pipes: a child is read after the ones before it ended, and must not block on a full pipe meanwhile
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in jobs]  # noqa: SIM115 (_read)
    procs = [subprocess.Popen([sys.executable, "-m", "bench.compile_cost", "--child", "--model", model,
                               "--batches", ",".join(map(str, batches)), "--cores", ",".join(map(str, cores)),
                               "--began", str(began), "--options", options] + (["--steps"] if steps else []),
                              cwd=REPO, env=env, stdout=out, stderr=err, text=True)
             for (batches, cores), (out, err) in zip(jobs, files, strict=True)]
    reports = []
    for proc, (batches, cores), (out_file, err_file) in zip(procs, jobs, files, strict=True):
        proc.wait(timeout=600)
        out, err = (_read(f) for f in (out_file, err_file))
        if proc.returncode != 0:
            raise SystemExit(f"{name} b{batches}: exit {proc.returncode}: {err.strip().splitlines()[-1:]}")
        for line in out.strip().splitlines()[-len(batches):]:
            report = json.loads(line)
            report.update(case=name, cores=f"{cores[0]}-{cores[-1]}")
            reports.append(report)
        lines = [line for line in err.splitlines() if line.strip() and "warn" not in line.lower()]
        print(f"{name} b{','.join(map(str, batches))}:\n  " + "\n  ".join(lines[-200:]), file=sys.stderr)
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
    parser.add_argument("--cases", default=",".join(CASES), help=f"some of {', '.join(CASES)}")
    parser.add_argument("--steps", action="store_true", help="time the set-up's steps (each synchronised: slower)")
    parser.add_argument("--options", default="", help="the warm set-ups' options, comma-separated, a set-up per "
                        "';'-separated set: speed (its img/s after), heuristics (cuDNN without benchmark mode), "
                        "profile (cProfile of the set-up)")
    parser.add_argument("--out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--began", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    cores = parse_cores(args.cores) if args.cores else sorted(os.sched_getaffinity(0))[2:] or [0]
    if args.child:
        child(args.model, batches, cores, args.began, args.steps, args.options)
        return
    cases = args.cases.split(",")
    if unknown := set(cases) - set(CASES):
        raise SystemExit(f"unknown case(s) {', '.join(sorted(unknown))}; valid: {', '.join(CASES)}")
    half = len(cores) // 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        for batch in batches:  # the warm cases read these caches
            if {"cold", "warm", "second"} & set(cases):
                rows += case("cold alone", args.model, [([batch], cores)], f"{work}/alone{batch}", args.steps)
        if "warm" in cases:
            for batch in batches:
                for options in args.options.split(";"):
                    rows += case(f"warm alone{' (' + options + ')' if options else ''}", args.model, [([batch], cores)],
                                 f"{work}/alone{batch}", args.steps, options)
        if "second" in cases and len(batches) > 1:
            for batch in batches[1:]:  # its cache: the first batch's compile, and this one's
                shutil.copytree(f"{work}/alone{batch}", f"{work}/second", dirs_exist_ok=True)
            shutil.copytree(f"{work}/alone{batches[0]}", f"{work}/second", dirs_exist_ok=True)
            rows += case("warm, after the first in one process", args.model, [(batches, cores)], f"{work}/second",
                         args.steps)
        if "at-once" in cases:
            rows += case("cold at once", args.model, [([b], cores) for b in batches], f"{work}/once", args.steps)
        if "halves" in cases and len(batches) == 2 and half:
            rows += case("cold at once, half the cores each", args.model,
                         [([batches[0]], cores[:half]), ([batches[1]], cores[half:])], f"{work}/halves", args.steps)
    print(f"\n{args.model}: inductor fp16 channels_last set-ups on GPU 0, each in a fresh process")
    print(f"{'case':<38} {'batch':>5} {'cores':>6} {'imports':>8} {'set-up':>7} {'compile':>8} {'fx hit/miss':>11} "
          f"{'ready after':>11} {'img/s':>7}")
    for r in rows:
        print(f"{r['case']:<38} {r['batch']:>5} {r['cores']:>6} {r['import_s']:>7.1f}s {r['set_up_s']:>6.1f}s "
              f"{r['compile_s']:>7.1f}s {r['fx_hits']:>5}/{r['fx_misses']:<5} {r['wall_s']:>10.1f}s "
              f"{r.get('img_s') or 0:>7.0f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bench": "compile_cost", "model": args.model, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
