"""autohet against what a user could run instead, side by side in one run on one machine (issue 12).

Peers, each on the full host -> device -> host path (a pinned host batch in the compute dtype,
channels_last, fp32 outputs back in pinned host memory, one stream, synchronised at the end):

- ``eager``: the model as PyTorch runs it;
- ``compile``: ``torch.compile`` default mode;
- ``compile-max``: ``torch.compile(mode="max-autotune-no-cudagraphs")`` (``--max-mode`` picks another);
- ``graph``: the eager model captured as a CUDA graph (throughput at the batch, and batch-1 latency);
- ``autohet``: a fresh ``autohet tune`` of the model (``--time-budget``), its exported config rerun
  with ``autohet run --config`` (throughput); and a latency tune's best batch-1 p50 (``--latency``).

Batch-1 latency peers, input on the host, output back on the host: eager, the CUDA graph in the
run's precision and in fp32 (for some models fp32 is the faster graph), and ``torch.compile(mode=
"reduce-overhead")`` (inductor's kernels in CUDA graphs, the strongest a user gets from one line;
``--no-b1-compile`` skips it). Ratios printed: autohet / best peer (throughput), autohet / graph
and autohet / the best latency peer (lower is better).

    python -m bench.peers --models resnet18,vgg16,mobilenet_v2,efficientnet_b0 --time-budget 120   # GPU box
    python -m bench.peers --smoke                                                                  # CPU: lenet
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from autohet.core.models import build_model, input_shape
from autohet.executors.compiled import compile_module, use_compile_cache
from bench._common import emit

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def host_to_host(fn: Any, x_host: torch.Tensor, out_host: torch.Tensor, device: torch.device, iters: int) -> float:
    """Images per second of ``fn`` over ``iters`` batches: copy in, run, copy out, one stream."""
    for _ in range(3):
        out_host.copy_(fn(x_host.to(device, non_blocking=True)).float(), non_blocking=True)
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    start = time.perf_counter()
    for _ in range(iters):
        out_host.copy_(fn(x_host.to(device, non_blocking=True)).float(), non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return iters * x_host.shape[0] / (time.perf_counter() - start)


def latency_ms(fn: Any, x_host: torch.Tensor, device: torch.device, runs: int = 50) -> float:
    """Median batch-1 latency, host input to host output."""
    out = []
    for _ in range(5):
        fn(x_host.to(device, non_blocking=True)).float().cpu()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(x_host.to(device, non_blocking=True)).float().cpu()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def graphed(model: Any, example: torch.Tensor) -> Any:
    """The model as a CUDA graph for ``example``'s shape (a user's torch.cuda.graph recipe)."""
    static_in = example.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_in)

    def run(x: torch.Tensor) -> torch.Tensor:
        static_in.copy_(x)
        graph.replay()
        return static_out

    return run


def latency_peers(name: str, model: Any, one_host: torch.Tensor, device: torch.device, b1_compile: bool
                  ) -> dict[str, Any]:
    """The batch-1 peers beyond the graph in the run's precision: the graph in fp32 and, with
    ``b1_compile``, torch.compile's reduce-overhead mode (compiled for the one shape, then timed)."""
    out: dict[str, Any] = {}
    try:  # a peer that fails says so in the row; the run goes on to the tune
        fp32 = build_model(name).to(device).to(memory_format=torch.channels_last).eval()
        one32 = one_host.float().contiguous(memory_format=torch.channels_last).pin_memory()
        out["graph_b1_fp32_ms"] = latency_ms(graphed(fp32, one32.to(device)), one32, device)
        if b1_compile:
            compiled, out["compile_graph_b1_compile_s"] = compile_module(model, "reduce-overhead", one_host.to(device))
            out["compile_graph_b1_ms"] = latency_ms(compiled, one_host, device)
    except Exception as exc:  # noqa: BLE001 - any failure of a peer is reported, not raised
        out["latency_peer_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return out


def peers(name: str, batch: int, precision: str, iters: int, max_mode: str | None,
          latency_only: bool = False, b1_compile: bool = True) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[precision] if device.type == "cuda" else torch.float32
    layout = torch.channels_last
    model = build_model(name).to(device, dtype).to(memory_format=layout).eval()
    shape = input_shape(name)
    x_host = torch.randn((batch, *shape)).to(dtype).contiguous(memory_format=layout)
    one_host = x_host[:1].clone()
    if device.type == "cuda":
        x_host, one_host = x_host.pin_memory(), one_host.pin_memory()
    out_host = torch.empty((batch, 1000 if name not in ("lenet", "cifarnet") else 10))
    out_host = out_host.pin_memory() if device.type == "cuda" else out_host
    row: dict[str, Any] = {"model": name, "batch": batch, "precision": precision if device.type == "cuda" else "fp32"}
    with torch.inference_mode():
        row["eager_b1_ms"] = latency_ms(model, one_host, device)
        if latency_only:
            if device.type == "cuda":
                row["graph_b1_ms"] = latency_ms(graphed(model, one_host.to(device)), one_host, device)
                row.update(latency_peers(name, model, one_host, device, b1_compile))
            return row
        row["eager_ips"] = host_to_host(model, x_host, out_host, device, iters)
        example = x_host.to(device)
        compiled, row["compile_s"] = compile_module(model, "default", example)
        row["compile_ips"] = host_to_host(compiled, x_host, out_host, device, iters)
        if max_mode:
            best, row["compile_max_s"] = compile_module(model, max_mode, example)
            row["compile_max_ips"] = host_to_host(best, x_host, out_host, device, iters)
        if device.type == "cuda":
            row["graph_ips"] = host_to_host(graphed(model, example), x_host, out_host, device, iters)
            row["graph_b1_ms"] = latency_ms(graphed(model, one_host.to(device)), one_host, device)
            row.update(latency_peers(name, model, one_host, device, b1_compile))
    return row


def autohet(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autohet.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def tuned(name: str, work: Path, budget: float, pool: str, latency: bool, throughput: bool = True) -> dict[str, Any]:
    """A fresh tune (throughput, and latency when asked), the exported config rerun."""
    out: dict[str, Any] = {}
    if throughput:
        out.update(tuned_throughput(name, work, budget, pool))
    if latency:
        out.update(tuned_latency(name, work, budget, pool))
    return out


def tuned_throughput(name: str, work: Path, budget: float, pool: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    exp = f"peers-{name}"
    proc = autohet(["tune", "--model", name, "--pool", pool, "--time-budget", str(budget), "--experiment", exp],
                   work, budget + 600)
    (work / f"{exp}.log").write_text(proc.stdout + proc.stderr)
    best = work / "runs" / exp / "best.yaml"
    if proc.returncode != 0 or not best.is_file():
        out["autohet_error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return out
    rerun = autohet(["run", "--config", str(best), "--json"], work, 900)
    if rerun.returncode == 0:
        m = json.loads(rerun.stdout.strip().splitlines()[-1])
        out.update(autohet_ips=m["throughput_ips"], autohet_strategy=m["strategy"],
                   autohet_config=str(best.relative_to(work)))
    breakdown = [line for line in proc.stderr.splitlines() if "trials in" in line]
    out["tune_breakdown"] = breakdown[-1] if breakdown else ""
    return out


def tuned_latency(name: str, work: Path, budget: float, pool: str) -> dict[str, Any]:
    """A fresh batch-1 latency tune; its best trial's p50 (and that config rerun, its p50 too)."""
    import yaml

    out: dict[str, Any] = {}
    exp = f"peers-{name}-latency"
    proc = autohet(["tune", "--model", name, "--pool", pool, "--objective", "latency", "--time-budget",
                    str(budget), "--experiment", exp], work, budget + 600)
    (work / f"{exp}.log").write_text(proc.stdout + proc.stderr)
    best = work / "runs" / exp / "best.yaml"
    if not best.is_file():
        out["autohet_latency_error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return out
    config = yaml.safe_load(best.read_text())
    out["autohet_b1_ms"] = config["measured"]["latency_ms"]["p50"]
    out["autohet_latency_strategy"] = config.get("strategy")
    rerun = autohet(["run", "--config", str(best), "--json"], work, 900)
    if rerun.returncode == 0:
        m = json.loads(rerun.stdout.strip().splitlines()[-1])
        out["autohet_b1_rerun_ms"] = m.get("latency_ms", {}).get("p50")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18,vgg16,mobilenet_v2,efficientnet_b0")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--max-mode", default="max-autotune-no-cudagraphs",
                        help="the strongest torch.compile mode to try ('' skips it)")
    parser.add_argument("--time-budget", type=float, default=120.0, help="seconds for each autohet tune")
    parser.add_argument("--pool", default=str(REPO / "actors" / "auto.yaml"))
    parser.add_argument("--latency", action="store_true", help="also tune batch-1 latency")
    parser.add_argument("--latency-only", action="store_true",
                        help="batch-1 latency alone: the eager and graph peers and autohet's latency tune")
    parser.add_argument("--no-tune", action="store_true", help="peers only")
    parser.add_argument("--no-b1-compile", action="store_true", help="skip the reduce-overhead batch-1 peer")
    parser.add_argument("--work", help="folder for the tunes (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.smoke:
        args.models, args.batch, args.iters, args.max_mode, args.time_budget = "lenet", 32, 5, "", 40.0
        args.pool = str(REPO / "actors" / "cpu2.yaml")
    use_compile_cache()
    work = Path(args.work or tempfile.mkdtemp(prefix="autohet-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    for folder in ("conf", "search_spaces", "actors"):  # the tunes run in ``work``, with the project's files
        if not (work / folder).exists():
            (work / folder).symlink_to(REPO / folder)
    rows = []
    for name in args.models.split(","):
        row = peers(name, args.batch, args.precision, args.iters, args.max_mode or None, args.latency_only,
                    not args.no_b1_compile)
        if not args.no_tune:
            row.update(tuned(name, work, args.time_budget, args.pool, args.latency or args.latency_only,
                             throughput=not args.latency_only))
        peer_ips = [v for k, v in row.items() if k.endswith("_ips") and k != "autohet_ips"]
        if peer_ips:
            row["best_peer_ips"] = max(peer_ips)
        if "autohet_ips" in row:
            row["autohet_over_best_peer"] = row["autohet_ips"] / row["best_peer_ips"]
        b1_peers = [v for k, v in row.items() if k in ("graph_b1_ms", "graph_b1_fp32_ms", "compile_graph_b1_ms")]
        if b1_peers:
            row["best_b1_peer_ms"] = min(b1_peers)
        if "autohet_b1_ms" in row and "graph_b1_ms" in row:
            row["autohet_b1_over_graph"] = row["autohet_b1_ms"] / row["graph_b1_ms"]
            row["autohet_b1_over_best_b1_peer"] = row["autohet_b1_ms"] / row["best_b1_peer_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    emit("peers", rows, ["model", "eager_ips", "compile_ips", "compile_max_ips", "graph_ips", "autohet_ips",
                         "autohet_over_best_peer", "graph_b1_ms", "graph_b1_fp32_ms", "compile_graph_b1_ms",
                         "autohet_b1_ms", "autohet_b1_rerun_ms", "autohet_b1_over_graph",
                         "autohet_b1_over_best_b1_peer", "autohet_strategy", "autohet_latency_strategy"], args.out)


if __name__ == "__main__":
    main()
