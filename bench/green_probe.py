"""Where two green-context partitions lose throughput (issue 12): one layer at a time, one process.

Rows, resnet18 fp16 channels_last, device-resident input unless said, images/s:
- ``whole``: the GPU's own stream, a plain loop (no host path);
- ``torch_green``: torch's ``GreenContext.create(n)`` stream, when this torch has it;
- ``part0`` / ``part0+1``: our driver-split partitions (``sm_partitions``), one alone, then both at
  once from two threads, plain and with each piece of the executor's data path added (copies in
  and out on the partition's stream or the primary context's, waits on events);
- ``executor_part0`` / ``executor_part0+1``: the GPU executor on a partition (host bank, copy stream,
  pinned outputs), loaded on the main thread: its ``standalone_ips`` alone there, alone on another
  thread, and both at once from two threads;
- ``executor_whole``: the same executor on the whole GPU;
- ``executor_part0 own thread`` / ``executor_part0+1 own threads``: each executor loaded and fed on
  its own long-lived thread (how the group actor hosts partitions).

    python -m bench.green_probe --sms 64            # GPU box, no Ray needed
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import torch

from autohet.core.models import ModelSpec, build_model, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec
from autohet.executors.gpu import GpuExecutor
from autohet.executors.green import sm_partitions
from autohet.pool.worker import Worker


def loop_ips(model: Any, x: torch.Tensor, stream: Any, seconds: float, h2d: str | None = None,
             d2h: str | None = None, sync: str = "stream") -> float:
    """Images/s of ``model(x)`` queued on ``stream`` for about ``seconds`` (synchronised per 8 batches).

    ``h2d``/``d2h``: also copy the batch in from pinned host memory / the outputs out to it, on the
    partition's own stream (``same``) or on a stream of the primary context (``primary``, joined by
    events, as the executor does); ``sync``: wait on the stream, or on an event (as the executor does).
    """
    copy = torch.cuda.Stream(x.device) if "primary" in (h2d, d2h) else None
    host_in = x.cpu().pin_memory() if h2d else None
    out_host = torch.empty((x.shape[0], 1000), dtype=torch.float32, pin_memory=True) if d2h else None

    def batch() -> None:
        inp = x
        if h2d == "same":
            inp = torch.empty_like(x)
            inp.copy_(host_in, non_blocking=True)
        elif h2d == "primary":
            with torch.cuda.stream(copy):
                inp = torch.empty_like(x)
                inp.copy_(host_in, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(copy)
            stream.wait_event(copied)
            inp.record_stream(stream)
        y = model(inp)
        if d2h == "same":
            out_host.copy_(y, non_blocking=True)
        elif d2h == "primary":
            done = torch.cuda.Event()
            done.record(stream)
            copy.wait_event(done)
            y.record_stream(copy)
            with torch.cuda.stream(copy):
                out_host.copy_(y, non_blocking=True)

    def wait() -> None:
        if sync == "event":
            end = torch.cuda.Event()
            end.record(copy if d2h == "primary" else stream)
            end.synchronize()
        else:
            stream.synchronize()
            if copy is not None:
                copy.synchronize()

    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(3):
            batch()
        wait()
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(8):
                batch()
            wait()
            done += 8 * x.shape[0]
        return done / (time.perf_counter() - start)


def together(fns: list[Any]) -> list[float]:
    """Each callable on its own thread at once; their results."""
    out: list[float] = [0.0] * len(fns)
    barrier = threading.Barrier(len(fns))

    def go(k: int) -> None:
        barrier.wait()
        out[k] = fns[k]()

    threads = [threading.Thread(target=go, args=(k,)) for k in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--sms", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    shape = input_shape(args.model)
    base = build_model(args.model).to(dev, torch.float16).to(memory_format=torch.channels_last).eval()
    x = torch.randn((args.batch, *shape), device=dev, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    rows: dict[str, Any] = {"model": args.model, "batch": args.batch, "sms": args.sms}

    def say(key: str, value: Any) -> None:
        rows[key] = value
        print(json.dumps({key: value}), flush=True)

    say("whole", loop_ips(base, x, torch.cuda.Stream(dev), args.seconds))
    green = getattr(getattr(torch.cuda, "green_contexts", None), "GreenContext", None)
    if green is not None:
        try:
            ctx = green.create(args.sms, 0)
            say("torch_green", loop_ips(base, x, ctx.Stream(), args.seconds))
        except Exception as exc:  # reported, the rest still runs
            say("torch_green", f"{type(exc).__name__}: {exc}")
    parts = sm_partitions(0, [args.sms, args.sms])
    say("sms_granted", [p.sms for p in parts])
    say("part0", loop_ips(base, x, parts[0].stream, args.seconds))
    second = build_model(args.model).to(dev, torch.float16).to(memory_format=torch.channels_last).eval()
    variants = {"": {}, " h2d=primary": {"h2d": "primary"}, " h2d=same": {"h2d": "same"},
                " d2h=same": {"d2h": "same"}, " d2h=primary": {"d2h": "primary"}, " sync=event": {"sync": "event"},
                " h2d=primary d2h=same sync=event": {"h2d": "primary", "d2h": "same", "sync": "event"}}
    for tag, kw in variants.items():
        say(f"part0+1{tag}", together([lambda kw=kw: loop_ips(base, x, parts[0].stream, args.seconds, **kw),
                                       lambda kw=kw: loop_ips(second, x, parts[1].stream, args.seconds, **kw)]))
    say("part0 alone h2d=primary d2h=same sync=event",
        loop_ips(base, x, parts[0].stream, args.seconds, h2d="primary", d2h="same", sync="event"))

    workload = Workload.from_spec(WorkloadSpec(4096, shape))
    model = ModelSpec(args.model)

    def executor(name: str, stream: Any, sms: int | None) -> GpuExecutor:
        spec = ExecutorSpec(name, "gpu", (), 0, batch=args.batch, precision="fp16", channels_last=True, sms=sms)
        e = GpuExecutor(spec, model)
        e.stream_override = stream
        t0 = time.perf_counter()
        e.load(workload)
        say(f"load_s_{name}", round(time.perf_counter() - t0, 2))
        return e

    e0 = executor("p0", parts[0].stream, args.sms)
    e1 = executor("p1", parts[1].stream, args.sms)
    whole = executor("whole", None, None)  # after the partitions (cuDNN caches algorithms per shape)
    say("executor_part0 on another thread", together([lambda: e0.standalone_ips(args.seconds)]))
    say("executor_whole", whole.standalone_ips(args.seconds))
    say("executor_part0", e0.standalone_ips(args.seconds))
    say("executor_part0+1", together([lambda: e0.standalone_ips(args.seconds),
                                      lambda: e1.standalone_ips(args.seconds)]))
    # each executor loaded and fed on its own long-lived thread (the group actor's way since this probe)
    workers = [Worker("p0"), Worker("p1")]
    own = [workers[k].call(lambda k=k: executor(f"own{k}", parts[k].stream, args.sms)) for k in range(2)]
    say("executor_part0 own thread", workers[0].call(lambda: own[0].standalone_ips(args.seconds)))
    futures = [workers[k].submit(lambda k=k: own[k].standalone_ips(args.seconds)) for k in range(2)]
    say("executor_part0+1 own threads", [f.result() for f in futures])
    for w in workers:
        w.close()
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
