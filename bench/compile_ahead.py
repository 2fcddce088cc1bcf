"""What compiling a GPU's next inductor setting ahead would buy a tune, and what it would cost the trial
measured meanwhile, side by side in one run on one GPU:

1. the trial: a CUDA-graph single (fp16, channels_last, ``--batch``) on GPU 0 from core 0, its img/s over
   ``--seconds``, alone;
2. the same trial again while another process, pinned to the other cores, compiles the next inductor
   settings (``--ahead`` batches) into a fresh cache, then alone once more: its img/s meanwhile against
   the mean of the two alone;
3. each inductor setting's set-up in a fresh process (as a trial's executor) from that warm cache, against a
   cold compile of the same setting in a cache of its own (what a tune pays today).

    python -m bench.compile_ahead --models resnet18,efficientnet_b0 --batch 256 --ahead 256,512
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench._common import REPO, compile_cache_env


def compile_settings(model: str, batches: list[int]) -> None:
    """The side process: each batch's inductor program compiled (and run once) on GPU 0."""
    import torch

    from autohet.core.models import build_model, input_shape
    from autohet.executors.compiled import compile_module

    device = torch.device("cuda", 0)
    net = build_model(model).to(device, torch.float16).to(memory_format=torch.channels_last).eval()
    for batch in batches:
        x = torch.zeros((batch, *input_shape(model)), device=device, dtype=torch.float16)
        _, seconds = compile_module(net, "default", x.contiguous(memory_format=torch.channels_last))
        print(json.dumps({"batch": batch, "compile_s": seconds}), flush=True)


def trial_ips(net, x, seconds: float) -> float:
    """img/s of ``net`` on ``x`` replayed as one CUDA graph for ``seconds``."""
    import torch

    from autohet.executors.compiled import GraphedCall

    stream = torch.cuda.Stream(x.device)
    call = GraphedCall(net, [x], stream)
    done, start = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < seconds:
            with torch.cuda.stream(stream):
                for _ in range(10):
                    call(x)
            torch.cuda.synchronize(x.device)
            done += 10 * x.shape[0]
    return done / (time.perf_counter() - start)


def one_model(model: str, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from autohet.core.models import build_model, input_shape

    os.sched_setaffinity(0, {0})  # the trial's feeding core, as an executor pins it
    others = sorted(set(range(os.cpu_count() or 1)) - {0})
    device = torch.device("cuda", 0)
    net = build_model(model).to(device, torch.float16).to(memory_format=torch.channels_last).eval()
    x = torch.randn((args.batch, *input_shape(model)), device=device, dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last)
    alone = trial_ips(net, x, args.seconds)
    ahead = [int(b) for b in args.ahead.split(",")]
    row: dict[str, float] = {"trial_alone_ips": alone}
    with tempfile.TemporaryDirectory() as warm, tempfile.TemporaryDirectory() as cold:
        side = subprocess.Popen(["taskset", "-c", ",".join(map(str, others)), sys.executable, "-m",
                                 "bench.compile_ahead", "--side", model, "--ahead", args.ahead],
                                cwd=REPO, env=compile_cache_env(warm), stdout=subprocess.PIPE, text=True)
        started, during = time.perf_counter(), []
        while side.poll() is None:
            during.append(trial_ips(net, x, min(args.seconds, 2.0)))
        row["side_compile_wall_s"] = time.perf_counter() - started
        compiled = [json.loads(line) for line in side.stdout.read().splitlines() if line.startswith("{")]
        if side.returncode != 0 or len(compiled) != len(ahead):
            raise SystemExit(f"{model}: the side compile ended with {side.returncode}")
        after = trial_ips(net, x, args.seconds)  # alone again: the trial before and after brackets a drift
        row["trial_after_ips"] = after
        row["trial_during_ips_min"], row["trial_during_ips_median"] = min(during), sorted(during)[len(during) // 2]
        row["trial_during_over_alone"] = row["trial_during_ips_median"] / ((alone + after) / 2)
        for batch in ahead:  # each set-up in a fresh process, as a trial's executor: the warm cache, then cold
            for label, cache in (("warm", warm), ("cold", cold)):
                done = subprocess.run(["taskset", "-c", ",".join(map(str, others)), sys.executable, "-m",
                                       "bench.compile_ahead", "--side", model, "--ahead", str(batch)],
                                      cwd=REPO, env=compile_cache_env(cache), capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{model} b{batch} {label}: {done.stderr[-2000:]}")
                row[f"b{batch}_{label}_setup_s"] = json.loads(done.stdout.strip().splitlines()[-1])["compile_s"]
            row[f"b{batch}_side_compile_s"] = next(c["compile_s"] for c in compiled if c["batch"] == batch)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,efficientnet_b0")
    parser.add_argument("--batch", type=int, default=256, help="the trial's batch (a CUDA-graph single)")
    parser.add_argument("--ahead", default="256,512", help="the inductor batches compiled ahead")
    parser.add_argument("--seconds", type=float, default=4.0, help="the trial alone")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        compile_settings(args.side, [int(b) for b in args.ahead.split(",")])
        return
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        row = one_model(model, args)
        print(f"{model}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in
                                       row.items()), flush=True)
        for batch in args.ahead.split(","):
            warm, cold = row[f"b{batch}_warm_setup_s"], row[f"b{batch}_cold_setup_s"]
            print(f"{model} inductor b{batch}: set-up {cold:.1f} s cold, {warm:.1f} s after the side compile "
                  f"({warm / cold:.3f}x); the trial meanwhile ran {row['trial_during_over_alone']:.3f}x its "
                  f"speed alone, before and after (slowest 2 s: "
                  f"{row['trial_during_ips_min'] / max(row['trial_alone_ips'], row['trial_after_ips']):.3f}x)",
                  flush=True)


if __name__ == "__main__":
    main()
