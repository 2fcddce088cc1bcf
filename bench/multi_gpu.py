"""autohet on one GPU and on every GPU of the host, next to N ``torch.compile`` processes at once (issue 46).

Per model, in one run on one machine:

- ``peer_1``, ``peer_n``: ``torch.compile`` (default mode) in one process on GPU 0, then one process per
  GPU started together (each compiles and warms up, then all time the same seconds): the host -> device
  -> host loop of ``bench.peers`` (a pinned batch in the compute dtype, channels_last, fp32 outputs back);
- ``autohet_1``: ``single`` on GPU 0 at the given executor settings, measured as a trial measures it
  (images from the host bank through the executor's copy stream, outputs back, checked);
- ``autohet_n``: a data-parallel strategy (``--strategy``, default fifo) over every GPU at the same
  settings, each GPU its own executor (in-process threads, or Ray actors with ``--ray``), checked;
- ``stream_n``: that N-GPU config through ``autohet.load``'s ``map`` (float32 inputs, then uint8 pixels),
  against ``autohet_n`` (issue 49);
- with ``--links``: host-to-device copy bandwidth per GPU alone and all at once, and GPU-to-GPU copies.

Ratios printed: autohet_n / autohet_1 (scaling), autohet_n / peer_n (against the N-process peer),
stream_n / autohet_n.

    python -m bench.multi_gpu --models resnet18,vgg16,efficientnet_b0 --links     # every GPU of the host
    python -m bench.multi_gpu --smoke     # no GPU: lenet, two 1-core CPU groups stand in for the GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import emit

REPO = Path(__file__).resolve().parents[1]


# --- the peer: one process per GPU --------------------------------------------------------------------

def peer_worker(model: str, gpu: int, batch: int, precision: str, seconds: float, barrier: Path, parties: int) -> None:
    """One peer process: compile and warm up on ``gpu``, wait for the others (files in ``barrier``), then
    run the host -> device -> host loop for ``seconds``; prints one JSON line."""
    import torch

    from autohet.core.models import build_model, input_shape
    from autohet.executors.compiled import compile_module
    from bench.peers import DTYPES

    device = torch.device("cuda", gpu)
    torch.cuda.set_device(device)
    dtype = DTYPES[precision]
    net = build_model(model).to(device, dtype).to(memory_format=torch.channels_last).eval()
    x_host = torch.randn((batch, *input_shape(model))).to(dtype).contiguous(memory_format=torch.channels_last)
    x_host = x_host.pin_memory()
    with torch.inference_mode():
        out = net(x_host[:1].to(device))
        out_host = torch.empty((batch, out.shape[1])).pin_memory()
        compiled, compile_s = compile_module(net, "default", x_host.to(device))

        def step() -> None:
            out_host.copy_(compiled(x_host.to(device, non_blocking=True)).float(), non_blocking=True)

        for _ in range(5):
            step()
        torch.cuda.synchronize(device)
        (barrier / f"ready{gpu}").touch()
        while len(list(barrier.glob("ready*"))) < parties:
            time.sleep(0.01)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(10):
                step()
            done += 10 * batch
            torch.cuda.synchronize(device)
        ips = done / (time.perf_counter() - start)
    print(json.dumps({"gpu": gpu, "ips": ips, "compile_s": compile_s}), flush=True)


def peer(model: str, gpus: list[int], batch: int, precision: str, seconds: float) -> list[dict[str, Any]]:
    """The peer on ``gpus`` at once, one process each; their JSON lines."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, "-m", "bench.multi_gpu", "--peer-worker", model, "--gpu", str(g),
                                   "--batch", str(batch), "--precision", precision, "--seconds", str(seconds),
                                   "--barrier", tmp, "--parties", str(len(gpus))], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for g in gpus]
        outs = [p.communicate(timeout=900) for p in procs]
    rows = []
    for p, (stdout, stderr) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"a peer process failed ({p.returncode}): {stderr[-2000:]}")
        rows.append(json.loads(stdout.strip().splitlines()[-1]))
    return rows


# --- autohet ------------------------------------------------------------------------------------------

def gpu_pool(gpus: list[int], settings: dict[str, Any], cpu_cores: list[int] | None = None, kind: str = "gpu") -> Any:
    """Each GPU an executor with its own feeding core (the first cores of this process), and optionally
    one CPU group of ``cpu_cores``. ``kind: cpu`` (the smoke): 1-core CPU groups stand in for the GPUs."""
    from autohet.executors import ExecutorSpec
    from autohet.pool import PoolSpec

    cores = sorted(os.sched_getaffinity(0))
    execs = []
    for k, g in enumerate(gpus):
        if kind == "gpu":
            execs.append(ExecutorSpec(f"gpu{g}", "gpu", (cores[k],), g, **settings))
        else:
            execs.append(ExecutorSpec(f"cpu{g}", "cpu", (cores[k],), **settings))
    if cpu_cores:
        execs.append(ExecutorSpec("cpu_group", "cpu", tuple(cpu_cores), batch=16, backend="onnxruntime"))
    return PoolSpec(f"{len(gpus)}x{kind}", execs)


def measured(model: str, spec: Any, strategy: str, params: dict[str, Any], seconds: float, ray: bool) -> Any:
    """A run of ``strategy`` on ``spec`` as a trial measures it, sized to about ``seconds`` at the pool's
    standalone speed."""
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec
    from autohet.core.workload import workload_for
    from autohet.pool import LocalPool, RayPool
    from autohet.strategy_run import run_strategy

    pool = RayPool(spec) if ray else LocalPool(spec)
    try:
        probe = workload_for(model, 4 * max(e.batch for e in spec.executors))
        pool.start(ModelSpec(model), probe)
        speed = sum(pool.standalone_ips(0.5))
        images = max(4 * sum(e.batch for e in spec.executors), int(speed * seconds))
        ctx = RunContext(ModelSpec(model), workload_for(model, images), check_images=16, standalone_seconds=1.0)
        m = run_strategy(strategy, params, pool, ctx)
    finally:
        pool.shutdown()
    if not m.output_ok:
        raise SystemExit(f"{model} {strategy} on {spec.name}: outputs failed the check: {m.failures}")
    return m


def streamed(model: str, spec: Any, strategy: str, params: dict[str, Any], images: int, ray: bool
             ) -> dict[str, Any]:
    """The config through ``autohet.load`` (its ``map``, batches of the largest executor batch)."""
    from autohet.config import RunConfig, write_config
    from autohet.core.models import ModelSpec
    from bench.runtime_load import streamed as load_stream

    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(RunConfig(ModelSpec(model), spec, strategy, params, images=images),
                            Path(tmp) / "n.yaml")
        if ray:
            raise SystemExit("--ray streams are not measured by this bench; use bench.runtime_load")
        ips, how = load_stream(str(path), images, None)
    return {"stream_ips": ips, "pixels_ips": how["pixels_ips"], "stream": how}


def tuned(model: str, budget: float, work: Path) -> dict[str, Any]:
    """A default ``autohet tune`` of ``model`` on the auto pool (every GPU, CPU groups from the cores left),
    its exported config rerun (``autohet run --config``, Ray actors), and the tune's best single trial
    (``autohet compare``): the tuned one GPU of the same run."""
    from bench.peers import autohet

    exp = f"multi-gpu-{model}"
    proc = autohet(["tune", "--model", model, "--time-budget", str(budget), "--experiment", exp], work, budget + 600)
    (work / f"{exp}.log").write_text(proc.stdout + proc.stderr)
    best = work / "runs" / exp / "best.yaml"
    if proc.returncode != 0 or not best.is_file():
        raise SystemExit(f"the tune of {model} failed: {(proc.stderr or proc.stdout)[-3000:]}")
    out: dict[str, Any] = {"tune_breakdown": next((line for line in reversed(proc.stderr.splitlines())
                                                   if "trials in" in line), "")}
    rerun = autohet(["run", "--config", str(best), "--json"], work, 900)
    if rerun.returncode != 0:
        raise SystemExit(f"the rerun of {best} failed: {rerun.stderr[-3000:]}")
    m = json.loads(rerun.stdout.strip().splitlines()[-1])
    out.update(tuned_ips=m["throughput_ips"], tuned_strategy=m["strategy"], tuned_efficiency=m["efficiency"],
               tuned_executors=[e["name"] for e in m["executors"] if e["images"]])
    compare = autohet(["compare", "--experiment", exp, "--json"], work, 300)
    rows = json.loads(compare.stdout.strip().splitlines()[-1])["strategies"]
    out["tune_best"] = {r["strategy"]: r["best"] for r in rows if r["best"] is not None}
    single = out["tune_best"].get("single")
    if single:
        out["tuned_single_ips"] = float(single)
        out["tuned_over_single"] = out["tuned_ips"] / float(single)
    (work / f"{exp}.yaml").write_text(best.read_text())
    return out


def host_copy_ceiling(model: str, precision: str, thread_counts: list[int], seconds: float = 2.0
                      ) -> dict[str, float]:
    """What the host alone can stage, in img/s of ``model``'s float32 inputs: a 1 GB float32 window
    copied into a pinned buffer in the compute dtype by ``copy_parts`` (a stream's staging, nothing on
    the GPUs), per copy-thread count. A float32 stream over N GPUs stages every image this way, so this
    bounds it at that thread count (issue 49)."""
    import torch

    from autohet.core.models import input_shape
    from autohet.platform.host_copy import copy_parts
    from bench.peers import DTYPES

    shape = tuple(input_shape(model))
    rows = max(1, (1 << 30) // (4 * int(torch.Size(shape).numel())))
    src = torch.randn((rows, *shape))
    dst = torch.empty((rows, *shape), dtype=DTYPES[precision], pin_memory=torch.cuda.is_available())
    out = {}
    given = os.environ.get("AUTOHET_COPY_THREADS")
    try:
        for threads in thread_counts:
            os.environ["AUTOHET_COPY_THREADS"] = str(threads)
            copy_parts(dst, [src])  # the pool started, the pages touched
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                copy_parts(dst, [src])
                done += rows
            out[f"host_stage_ips_{threads}t"] = done / (time.perf_counter() - start)
    finally:  # the caller's setting back
        os.environ.pop("AUTOHET_COPY_THREADS", None)
        if given is not None:
            os.environ["AUTOHET_COPY_THREADS"] = given
    return out


def links(gpus: list[int]) -> dict[str, Any]:
    """Host-to-device copy bandwidth (GB/s) per GPU alone and all at once; GPU-to-GPU copies."""
    import threading

    import torch

    size = 256 << 20
    host = torch.empty(size, dtype=torch.uint8).pin_memory()
    dev = {g: torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in gpus}

    def h2d(g: int, reps: int = 10) -> float:
        torch.cuda.synchronize(g)
        t0 = time.perf_counter()
        for _ in range(reps):
            dev[g].copy_(host, non_blocking=True)
        torch.cuda.synchronize(g)
        return reps * size / (time.perf_counter() - t0) / 1e9

    for g in gpus:
        h2d(g, 2)
    out: dict[str, Any] = {f"h2d_gpu{g}_gbps": h2d(g) for g in gpus}
    results: dict[int, float] = {}
    threads = [threading.Thread(target=lambda g=g: results.__setitem__(g, h2d(g))) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["h2d_all_at_once_gbps"] = sum(results.values())
    for a in gpus:
        for b in gpus:
            if a != b:
                out[f"p2p_{a}{b}"] = bool(torch.cuda.can_device_access_peer(a, b))
                dev[b].copy_(dev[a])
                torch.cuda.synchronize(a)
                torch.cuda.synchronize(b)
                t0 = time.perf_counter()
                for _ in range(10):
                    dev[b].copy_(dev[a], non_blocking=True)
                torch.cuda.synchronize(a)
                torch.cuda.synchronize(b)
                out[f"d2d_gpu{a}_to_gpu{b}_gbps"] = 10 * size / (time.perf_counter() - t0) / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18")
    parser.add_argument("--gpus", type=int, help="how many GPUs (default: every GPU of the host)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--backend", default="inductor", help="autohet's GPU executors: inductor, cudagraphs, eager")
    parser.add_argument("--strategy", default="fifo")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="strategy parameters")
    parser.add_argument("--seconds", type=float, default=5.0, help="each measurement's length")
    parser.add_argument("--cpu-group", type=int, default=0, help="also a run with a CPU group of this many cores")
    parser.add_argument("--ray", action="store_true", help="executors as Ray actors (default: threads)")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-stream", action="store_true")
    parser.add_argument("--links", action="store_true")
    parser.add_argument("--copy-threads", default="",
                        help="comma-separated copy-thread counts: the float32 stream again at each (an A/B of "
                             "AUTOHET_COPY_THREADS), and the host's staging ceiling at each")
    parser.add_argument("--tune", type=float, default=0.0, metavar="SECONDS",
                        help="also a default `autohet tune` of each model this long, its config rerun")
    parser.add_argument("--no-runs", action="store_true", help="no autohet_1/autohet_n runs (peers, tunes only)")
    parser.add_argument("--work", default="runs/multi_gpu", help="where the tunes keep their runs/")
    parser.add_argument("--smoke", action="store_true", help="no GPU needed: lenet, 1-core CPU groups as GPUs")
    parser.add_argument("--out")
    parser.add_argument("--peer-worker", help=argparse.SUPPRESS)
    parser.add_argument("--gpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    parser.add_argument("--parties", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_worker:
        peer_worker(args.peer_worker, args.gpu, args.batch, args.precision, args.seconds, Path(args.barrier),
                    args.parties)
        return
    from autohet.core.params import parse_set_options

    params = parse_set_options(args.set)
    if args.smoke:
        models, gpus, kind = ["lenet"], [0, 1], "cpu"
        settings: dict[str, Any] = {"batch": 64}
        args.no_peer, args.seconds = True, min(args.seconds, 1.0)
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU here; run with --smoke on a CPU")
        models, kind = args.models.split(","), "gpu"
        gpus = list(range(args.gpus or torch.cuda.device_count()))
        settings = {"batch": args.batch, "precision": args.precision, "channels_last": True, "backend": args.backend}
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if args.links and kind == "gpu":
        extra = links(gpus)
        print("links:", json.dumps(extra), flush=True)
    for model in models:
        row: dict[str, Any] = {"model": model, "gpus": len(gpus), "strategy": args.strategy}
        if not args.no_peer:
            one = peer(model, gpus[:1], args.batch, args.precision, args.seconds)
            every = peer(model, gpus, args.batch, args.precision, args.seconds)
            row.update(peer_1=one[0]["ips"], peer_n=sum(r["ips"] for r in every),
                       peer_each=[round(r["ips"]) for r in every])
            print(f"{model}: peer {row['peer_1']:.0f} img/s on one GPU, {row['peer_n']:.0f} on {len(gpus)}", flush=True)
        if args.tune:
            work = Path(args.work).resolve()
            work.mkdir(parents=True, exist_ok=True)
            row.update(tuned(model, args.tune, work))
            if "peer_n" in row:
                row["tuned_over_peer_n"] = row["tuned_ips"] / row["peer_n"]
            print(f"{model}: tuned {row['tuned_strategy']} {row['tuned_ips']:.0f} img/s "
                  f"({row.get('tuned_over_single', float('nan')):.3f}x its best single); {row['tune_breakdown']}",
                  flush=True)
        if args.no_runs:
            rows.append(row)
            continue
        single = measured(model, gpu_pool(gpus[:1], settings, kind=kind), "single", {"executor": 0}, args.seconds,
                          args.ray)
        spec = gpu_pool(gpus, settings, kind=kind)
        many = measured(model, spec, args.strategy, params, args.seconds, args.ray)
        row.update(autohet_1=single.throughput_ips, autohet_n=many.throughput_ips, efficiency_n=many.efficiency,
                   images_each=[e.images for e in many.executors])
        row["scaling"] = row["autohet_n"] / row["autohet_1"]
        if "peer_n" in row:
            row["over_peer_n"] = row["autohet_n"] / row["peer_n"]
        print(f"{model}: autohet {row['autohet_1']:.0f} img/s on one GPU, {row['autohet_n']:.0f} on {len(gpus)} "
              f"({row['scaling']:.3f}x)", flush=True)
        if not args.no_stream and not args.ray:
            got = streamed(model, spec, args.strategy, params, many.images, args.ray)
            row.update(stream_n=got["stream_ips"], pixels_n=got["pixels_ips"],
                       stream_over_run=got["stream_ips"] / row["autohet_n"],
                       pixels_over_run=got["pixels_ips"] / row["autohet_n"], stream_detail=got["stream"])
            print(f"{model}: stream over {len(gpus)} float32 {got['stream_ips']:.0f} img/s "
                  f"({row['stream_over_run']:.3f}x the run), pixels {got['pixels_ips']:.0f} "
                  f"({row['pixels_over_run']:.3f}x)", flush=True)
            counts = [int(c) for c in args.copy_threads.split(",") if c]
            if counts:
                row.update(host_copy_ceiling(model, args.precision, counts))
                print(f"{model}: host staging alone " + ", ".join(
                    f"{c} threads {row[f'host_stage_ips_{c}t']:.0f} img/s" for c in counts), flush=True)
            for c in counts:
                os.environ["AUTOHET_COPY_THREADS"] = str(c)
                got = streamed(model, spec, args.strategy, params, many.images, args.ray)
                row[f"stream_over_run_{c}t"] = got["stream_ips"] / row["autohet_n"]
                print(f"{model}: stream with {c} copy threads float32 {got['stream_ips']:.0f} img/s "
                      f"({row[f'stream_over_run_{c}t']:.3f}x), pixels {got['pixels_ips']:.0f}", flush=True)
            os.environ.pop("AUTOHET_COPY_THREADS", None)
        if args.cpu_group:
            cores = sorted(os.sched_getaffinity(0))[len(gpus):len(gpus) + args.cpu_group]
            mixed_spec = gpu_pool(gpus, settings, cores, kind=kind)
            mixed = measured(model, mixed_spec, args.strategy, params, args.seconds, args.ray)
            row.update(mixed_n=mixed.throughput_ips, mixed_efficiency=mixed.efficiency,
                       mixed_images_each=[e.images for e in mixed.executors])
            if not args.no_stream and not args.ray:
                got = streamed(model, mixed_spec, args.strategy, params, mixed.images, args.ray)
                row.update(mixed_stream=got["stream_ips"],
                           mixed_stream_over_run=got["stream_ips"] / mixed.throughput_ips,
                           mixed_pixels_over_run=got["pixels_ips"] / mixed.throughput_ips)
        rows.append({**row, **({"links": extra} if extra else {})})
    emit("multi_gpu", rows, ["model", "gpus", "peer_1", "peer_n", "autohet_1", "autohet_n", "scaling", "over_peer_n",
                             "efficiency_n", "stream_over_run", "pixels_over_run", "mixed_stream_over_run",
                             "tuned_strategy", "tuned_ips", "tuned_over_single", "tuned_over_peer_n"], args.out)


if __name__ == "__main__":
    main()
