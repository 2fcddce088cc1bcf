"""autohet on CPU cores against what a user could run on the same cores instead, in one run (issue 26).

Peers, each pinned to the same cores with as many threads, images in batches of ``--batch``:

- PyTorch eager and inductor (``torch.compile``), fp32 and bf16, NCHW and channels_last;
- ONNX Runtime's CPU provider (fp32, its graph optimisations, intra-op threads = the cores);
- OpenVINO f32 and bf16, with the THROUGHPUT hint (a request per stream, all kept busy) and the
  LATENCY hint (one request at a time).

bf16 peers run only where the CPU computes bf16 (AVX512-BF16 or AMX); elsewhere PyTorch emulates it,
many times slower than fp32, and OpenVINO silently runs f32: they are listed as skipped with why.
Then autohet: a tune (``--readme``: exactly the README's main job, ``autohet tune --model vgg16``
with the default budget and the auto pool; otherwise ``--pool``/``--time-budget``), its exported
config rerun with ``autohet run --config``, and the ratio to the best peer; then (``--ab-rounds``) the
best peer and the rerun again by turns, each round's ratio and their median (the figure to quote on a
machine whose speed drifts). The tune's end-of-tune breakdown (cut trials' share of the budget,
acquire share) is kept in the row.

    python -m bench.cpu_peers --models vgg16,resnet18 --readme            # 2-core box: the issue's figure
    python -m bench.cpu_peers --models resnet18,mobilenet_v2 --cores 1-15 --time-budget 300   # H100 box's CPU
    python -m bench.cpu_peers --smoke                                        # lenet, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import emit

REPO = Path(__file__).resolve().parents[1]


def parse_cores(text: str | None) -> list[int]:
    """``1-15`` or ``0,1``; default: every core this process may use."""
    if not text:
        return sorted(os.sched_getaffinity(0))
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def rate(fn: Callable[[], Any], images: int, min_s: float) -> float:
    """Images per second of ``fn`` (``images`` per call): one untimed call, then calls until ``min_s``
    have passed and at least two ran."""
    fn()
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < min_s:
        fn()
        calls += 1
    return calls * images / (time.perf_counter() - start)


def torch_peers(name: str, batch: int, threads: int, min_s: float, bf16: bool, compile_: bool) -> dict[str, Any]:
    import torch

    from autohet.core.models import build_model, input_shape
    from autohet.executors.compiled import compile_module

    torch.set_num_threads(threads)
    out: dict[str, Any] = {}
    base = build_model(name).eval()
    x32 = torch.randn((batch, *input_shape(name)))
    for precision in ("fp32", "bf16"):
        if precision == "bf16" and not bf16:
            out["torch_bf16"] = "skipped: no AVX512-BF16/AMX (PyTorch would emulate bf16)"
            continue
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        for layout in ("nchw", "cl"):
            fmt = torch.channels_last if layout == "cl" else torch.contiguous_format
            model = build_model(name).eval().to(dtype).to(memory_format=fmt)
            x = x32.to(dtype).contiguous(memory_format=fmt)
            with torch.inference_mode():
                out[f"eager_{precision}_{layout}_ips"] = rate(lambda m=model, x=x: m(x), batch, min_s)
            if compile_:
                compiled, seconds = compile_module(model, "default", x)
                out[f"inductor_{precision}_{layout}_compile_s"] = seconds
                with torch.inference_mode():
                    out[f"inductor_{precision}_{layout}_ips"] = rate(lambda c=compiled, x=x: c(x), batch, min_s)
    del base
    return out


def onnxruntime_peer(name: str, batch: int, threads: int, min_s: float, work: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from autohet.core.models import build_model, input_shape
    from autohet.executors.cpu_backends._onnxruntime import export_onnx

    path = work / f"{name}.onnx"
    export_onnx(build_model(name), input_shape(name), path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # the same cores (left at 0, ORT runs a thread per physical core)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((batch, *input_shape(name)), dtype=np.float32)
    return {"onnxruntime_fp32_ips": rate(lambda: session.run(None, {session.get_inputs()[0].name: x}), batch, min_s)}


def openvino_peers(name: str, batch: int, threads: int, min_s: float, bf16: bool,
                   only: tuple[str, str] | None = None) -> dict[str, Any]:
    """OpenVINO at f32 and bf16 with each hint (``only``: one (precision, hint) pair)."""
    import openvino as ov
    import torch

    from autohet.core.models import build_model, input_shape

    shape = input_shape(name)
    core = ov.Core()
    model = ov.convert_model(build_model(name).eval(), example_input=torch.zeros((1, *shape)))
    model.reshape([batch, *shape])
    x = np.random.default_rng(0).standard_normal((batch, *shape), dtype=np.float32)
    out: dict[str, Any] = {}
    for precision in ("f32", "bf16"):
        if only is not None and precision != only[0]:
            continue
        if precision == "bf16" and not bf16:
            out["openvino_bf16"] = "skipped: no AVX512-BF16/AMX (OpenVINO would run f32)"
            continue
        for hint in ("THROUGHPUT", "LATENCY"):
            if only is not None and (precision, hint) != only:
                continue
            config = {"PERFORMANCE_HINT": hint, "INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads}
            compiled = core.compile_model(model, "CPU", config)
            requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
            queue = ov.AsyncInferQueue(compiled, requests)

            def batches(q: Any = queue, n: int = requests) -> None:  # one batch per request, all busy
                for _ in range(n):
                    q.start_async({0: x})
                q.wait_all()

            key = f"openvino_{precision}_{hint.lower()}"
            out[f"{key}_ips"] = rate(batches, batch * requests, min_s)
            out[f"{key}_streams"] = int(compiled.get_property("NUM_STREAMS"))
    return out


def peer_again(name: str, key: str, args: argparse.Namespace, threads: int, bf16: bool, work: Path,
               batch: int | None = None) -> float:
    """The peer ``key`` (a row key less ``_ips``) measured once more (at ``batch``, default ``--batch``)."""
    batch = batch or args.batch
    if key.startswith("openvino_"):
        _, precision, hint = key.split("_")
        got = openvino_peers(name, batch, threads, args.seconds, bf16, (precision, hint.upper()))
    elif key.startswith("onnxruntime"):
        got = onnxruntime_peer(name, batch, threads, args.seconds, work)
    else:
        got = torch_peers(name, batch, threads, args.seconds, bf16, key.startswith("inductor"))
    return float(got[f"{key}_ips"])


def rerun(best: Path, images: int, work: Path, in_process: bool = False) -> dict[str, Any]:
    """``autohet run --config`` of the exported config over ``images``: its measurement as JSON. ``in_process``
    (the smoke): its executors in the command's process, no Ray start (``autohet run`` through Ray is
    ``tests/test_cli.py``'s)."""
    flags = ["--in-process"] if in_process else []
    proc = subprocess.run([sys.executable, "-m", "autohet.cli", "run", "--config", str(best), "--json", "--images",
                           str(images), *flags], cwd=work, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alternate(name: str, row: dict[str, Any], args: argparse.Namespace, threads: int, bf16: bool, work: Path
              ) -> dict[str, Any]:
    """The best peer and autohet's rerun measured by turns, ``--ab-rounds`` times, back to back: a
    machine whose speed drifts (the H200 box's CPU: OpenVINO bf16 at 983-1210 img/s in one hour) then
    moves both alike. Each round's ratio, and the median. With ``--peer-batches``, each round also
    measures the best peer at those batches (``ab_peer_b<B>``, ``ab_ratio_median_b<B>``): the issue's
    peers run batch 16, and a user could pick another."""
    best = work / "runs" / f"cpu-peers-{name}" / "best.yaml"
    extra = peer_batches(args)
    ratios, peers, ours = [], [], []
    at: dict[int, list[float]] = {b: [] for b in extra}
    for _ in range(args.ab_rounds):
        peer = peer_again(name, row["best_peer"], args, threads, bf16, work)
        for b in extra:
            at[b].append(peer_again(name, row["best_peer"], args, threads, bf16, work, b))
        m = rerun(best, row["autohet_images"], work, args.smoke)
        if "throughput_ips" not in m:
            return {"ab_error": m.get("error")}
        peers.append(peer)
        ours.append(m["throughput_ips"])
        ratios.append(ours[-1] / peer)
    out: dict[str, Any] = {"ab_peer": peers, "ab_autohet": ours, "ab_ratios": ratios,
                           "ab_ratio_median": float(np.median(ratios))}
    for b, figures in at.items():
        out[f"ab_peer_b{b}"] = figures
        out[f"ab_ratio_median_b{b}"] = float(np.median([o / p for o, p in zip(ours, figures, strict=True)]))
    return out


def peer_batches(args: argparse.Namespace) -> list[int]:
    """``--peer-batches`` as numbers, ``--batch`` left out."""
    return [int(b) for b in (args.peer_batches or "").split(",") if b.strip() and int(b) != args.batch]


def autohet_tune(name: str, work: Path, args: argparse.Namespace, pool: str | None, peer_ips: float
                 ) -> dict[str, Any]:
    """A fresh tune, its exported config rerun over as many images as the best peer runs in ``--rerun-s``
    (the tune's own trials may be a few seconds each); the tune's breakdown line kept."""
    exp = f"cpu-peers-{name}"
    cmd = ["tune", "--model", name, "--experiment", exp]
    if not args.readme:
        cmd += ["--time-budget", str(args.time_budget)] + (["--pool", pool] if pool else [])
    if args.trials:
        cmd += ["--trials", str(args.trials)]
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "autohet.cli", *cmd], cwd=work, capture_output=True, text=True,
                          timeout=args.time_budget + 900)
    out: dict[str, Any] = {"tune_s": time.perf_counter() - started, "tune_command": "autohet " + " ".join(cmd)}
    (work / f"{exp}.log").write_text(proc.stdout + proc.stderr)
    breakdown = [line for line in proc.stderr.splitlines() if "trials in" in line]
    out["tune_breakdown"] = breakdown[-1] if breakdown else ""
    best = work / "runs" / exp / "best.yaml"
    if proc.returncode != 0 or not best.is_file():
        out["autohet_error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return out
    images = max(64, int(peer_ips * args.rerun_s))
    batch = max((int(e.get("batch") or 1) for e in (yaml_executors(best))), default=1)
    images = -(-images // batch) * batch  # whole batches, as the peers are timed
    m = rerun(best, images, work, args.smoke)
    out["autohet_images"] = images
    if "throughput_ips" in m:
        executors = m.get("extra", {}).get("pool", {}).get("executors", [])
        out.update(autohet_ips=m["throughput_ips"], autohet_strategy=m["strategy"],
                   autohet_executors=[{k: e.get(k) for k in ("name", "cores", "backend", "precision", "batch",
                                                              "streams", "channels_last", "openvino_streams",
                                                              "openvino_requests") if k in e}
                                      for e in executors])
    else:
        out["autohet_error"] = m["error"]
    return out


def yaml_executors(config: Path) -> list[dict[str, Any]]:
    """The executors of an exported config (its pool's)."""
    import yaml

    return list((yaml.safe_load(config.read_text()).get("pool") or {}).get("executors") or [])


def pool_file(cores: list[int], work: Path) -> str:
    """One CPU group of ``cores`` (the tune's first points try its backends; no GPU)."""
    path = work / "cpu_cores.yaml"
    path.write_text(json.dumps({"version": 1, "executors": [{"name": "cpu", "kind": "cpu", "cores": cores,
                                                             "batch": 16}]}))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vgg16,resnet18")
    parser.add_argument("--cores", help="cores for the peers and autohet, e.g. 1-15 (default: all of them)")
    parser.add_argument("--batch", type=int, default=16, help="images per peer call")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per peer (at least two calls)")
    parser.add_argument("--readme", action="store_true",
                        help="autohet is the README's main job: `autohet tune --model M` (auto pool, default budget)")
    parser.add_argument("--time-budget", type=float, default=600.0, help="autohet tune budget (without --readme)")
    parser.add_argument("--pool", help="autohet's pool (default: one group of --cores; auto with --readme)")
    parser.add_argument("--no-inductor", action="store_true", help="skip the torch.compile peers (minutes on 2 cores)")
    parser.add_argument("--rerun-s", type=float, default=20.0,
                        help="the tuned config's rerun: as many images as the best peer runs in this many seconds")
    parser.add_argument("--no-tune", action="store_true", help="peers only")
    parser.add_argument("--work", help="folder for the tunes (default: a temporary one, removed at the end)")
    parser.add_argument("--trials", type=int, help="end autohet's tune after this many trials (default: its budget)")
    parser.add_argument("--smoke", action="store_true", help="lenet, short peers, a 1-trial tune")
    parser.add_argument("--ab-rounds", type=int, default=3,
                        help="then the best peer and autohet's rerun by turns, this many rounds (0: none)")
    parser.add_argument("--peer-batches", help="e.g. 64: the A/B rounds also time the best peer at these batches")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.smoke:
        # one trial ends the tune (its first point: the group's first backend); the budget is a backstop
        # (its set-up took 30 s of a 45 s budget on the 2-core box, which left no trial)
        args.models, args.seconds, args.time_budget, args.no_inductor, args.readme = "lenet", 0.2, 150.0, True, False
        args.trials = 1
        args.rerun_s = 1.0
        args.ab_rounds = min(args.ab_rounds, 1)
    from autohet.executors.compiled import native_cpu_bf16, use_compile_cache

    cores = parse_cores(args.cores)
    os.sched_setaffinity(0, set(cores))  # every peer thread on these cores (the tunes pin their own)
    use_compile_cache()
    bf16 = native_cpu_bf16()
    work = Path(args.work or tempfile.mkdtemp(prefix="autohet-cpu-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    for folder in ("conf", "search_spaces", "actors"):
        if not (work / folder).exists():
            (work / folder).symlink_to(REPO / folder)
    pool = None if args.readme else (args.pool or pool_file(cores, work))
    print(f"cores {cores} (bf16 native: {bf16}), batch {args.batch}, {args.seconds:g} s per peer; work {work}",
          flush=True)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        row: dict[str, Any] = {"model": name, "cores": len(cores), "batch": args.batch}
        row.update(torch_peers(name, args.batch, len(cores), args.seconds, bf16, not args.no_inductor))
        print(json.dumps(row), flush=True)
        row.update(onnxruntime_peer(name, args.batch, len(cores), args.seconds, work))
        row.update(openvino_peers(name, args.batch, len(cores), args.seconds, bf16))
        peers = {k[:-4]: v for k, v in row.items() if k.endswith("_ips")}
        row["best_peer"] = max(peers, key=peers.get)
        row["best_peer_ips"] = peers[row["best_peer"]]
        print(json.dumps(row), flush=True)
        if not args.no_tune:
            row.update(autohet_tune(name, work, args, pool, row["best_peer_ips"]))
            if "autohet_ips" in row:
                row["autohet_over_best_peer"] = row["autohet_ips"] / row["best_peer_ips"]
                if args.ab_rounds > 0:
                    row.update(alternate(name, row, args, len(cores), bf16, work))
        rows.append(row)
        print(json.dumps(row), flush=True)
    emit("cpu_peers", rows, ["model", "cores", "eager_fp32_nchw_ips", "eager_fp32_cl_ips", "eager_bf16_cl_ips",
                             "inductor_fp32_cl_ips", "inductor_bf16_cl_ips", "onnxruntime_fp32_ips",
                             "openvino_f32_throughput_ips", "openvino_f32_latency_ips", "openvino_bf16_throughput_ips",
                             "best_peer", "best_peer_ips", "autohet_ips", "autohet_over_best_peer", "autohet_strategy",
                             "ab_ratio_median"],
         args.out)
    if not args.work:  # a run that ended in an error keeps its folder (the tunes' logs) for a look
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
