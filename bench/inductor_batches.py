"""What a GPU's other inductor batches cost to set up, side by side in one run: a static compile per batch
(what a tune's GPU executor does for each batch it tries) against one compile with a dynamic batch
dimension, then a static compile again from the warm cache (what a second GPU of the same box finds).

Each mode runs in a fresh process with an inductor cache of its own (cold: nothing compiled before) on
GPU 0: the model in fp16, channels_last, compiled on ``example`` as ``executors.compiled.compile_module``
does, then each batch's img/s over ``--iters`` calls replayed as one CUDA graph per batch
(``graph_call``, as the executor runs it). Printed per batch: the seconds to compile (or to
recompile/specialise) and img/s; then each mode's total set-up seconds and its img/s against the
static compile's at the same batch.

    python -m bench.inductor_batches --models resnet18,efficientnet_b0 --batches 256,512,128
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from bench._common import REPO, compile_cache_env


def one_mode(model: str, mode: str, batches: list[int], iters: int) -> list[dict[str, float]]:
    """In this process: each batch's set-up seconds and img/s for ``mode`` (static, dynamic)."""
    import torch

    from autohet.core.models import build_model, input_shape
    from autohet.executors.compiled import compiling_on_process_cores, graph_call

    device = torch.device("cuda", 0)
    net = build_model(model).to(device, torch.float16).to(memory_format=torch.channels_last).eval()
    compiled = torch.compile(net, dynamic=False if mode.startswith("static") else None)
    rows = []
    for batch in batches:
        x = torch.randn((batch, *input_shape(model)), device=device, dtype=torch.float16)
        x = x.contiguous(memory_format=torch.channels_last)
        if not mode.startswith("static"):
            torch._dynamo.mark_dynamic(x, 0)
        start = time.perf_counter()
        with compiling_on_process_cores(), torch.inference_mode():
            compiled(x)
        torch.cuda.synchronize(device)
        setup_s = time.perf_counter() - start
        stream = torch.cuda.Stream(device)
        with torch.inference_mode():
            call = graph_call(compiled, [x], stream)
            for _ in range(3):
                call(x)
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            with torch.cuda.stream(stream):
                for _ in range(iters):
                    call(x)
            torch.cuda.synchronize(device)
        rows.append({"batch": batch, "setup_s": setup_s, "ips": batch * iters / (time.perf_counter() - start)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,efficientnet_b0")
    parser.add_argument("--batches", default="256,512,128", help="in the order a tune tries them")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(one_mode(args.child[0], args.child[1], batches, args.iters)), flush=True)
        return
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        results = {}
        with tempfile.TemporaryDirectory() as static_cache, tempfile.TemporaryDirectory() as dynamic_cache:
            for mode, cache in (("static", static_cache), ("dynamic", dynamic_cache), ("static, warm cache",
                                                                                        static_cache)):
                done = subprocess.run([sys.executable, "-m", "bench.inductor_batches", "--child", model, mode,
                                       "--batches", args.batches, "--iters", str(args.iters)],
                                      cwd=REPO, env=compile_cache_env(cache), capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{model} {mode}: {done.stderr[-2000:]}")
                results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        static = {r["batch"]: r for r in results["static"]}
        for mode, rows in results.items():
            for r in rows:
                print(f"{model} {mode:18s} b{r['batch']:<4d} set-up {r['setup_s']:6.1f} s  {r['ips']:8.0f} img/s  "
                      f"/ static {r['ips'] / static[r['batch']]['ips']:.3f}", flush=True)
            print(f"{model} {mode:18s} all batches' set-up {sum(r['setup_s'] for r in rows):.1f} s", flush=True)


if __name__ == "__main__":
    main()
