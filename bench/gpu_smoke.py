"""A quick check of every GPU code path on a GPU machine, each item PASS or FAIL with its error, in
about a minute: executors (eager, CUDA graphs, inductor), green-context partitions (two disjoint
ones running at once), the engine (a GPU device, transfers, graphed segments, placement), the
single-device latency job, and ``autohet.load`` of a config of each family on a GPU and a CPU group
(first call checked against the reference). Run it before measuring anything.

    python -m bench.gpu_smoke [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autohet.core.models import ModelSpec, build_model
from autohet.core.workload import workload_for
from autohet.executors import ExecutorSpec, make_executor

RESULTS: list[dict[str, Any]] = []


def item(name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    try:
        detail = fn()
        RESULTS.append({"item": name, "ok": True, "seconds": time.perf_counter() - t0, "detail": detail})
        print(f"PASS {name} ({time.perf_counter() - t0:.1f} s): {detail}", flush=True)
    except Exception as exc:  # every item is reported, the next one still runs
        RESULTS.append({"item": name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                        "trace": traceback.format_exc()[-3000:]})
        print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)


def executor(backend: str, model: str = "resnet18", batch: int = 64, sms: int | None = None,
             stream: Any = None) -> Any:
    work = workload_for(model, 512)
    ex = make_executor(ExecutorSpec("g", "gpu", (), 0, batch=batch, precision="fp16", channels_last=True,
                                    backend=backend, sms=sms), ModelSpec(model))
    if stream is not None:
        ex.stream_override = stream
    ex.load(work)
    return ex, work


def check_executor(backend: str) -> str:
    ex, work = executor(backend)
    with torch.inference_mode():
        ref = build_model("resnet18")(torch.from_numpy(work.rows(3, 100))).numpy()
    out = ex.run(3, 100).outputs
    err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    assert err < 1e-2, f"relative error {err}"
    ips = ex.standalone_ips(1.0)
    return f"rel err {err:.2e}, standalone {ips:.0f} img/s, compile {ex.describe()['compile_s']:.1f} s"


def check_partitions() -> str:
    from concurrent.futures import ThreadPoolExecutor

    from autohet.executors.green import equal_share, sm_partitions

    total = torch.cuda.get_device_properties(0).multi_processor_count
    parts = sm_partitions(0, [equal_share(0, 2)] * 2)
    execs = [executor("eager", batch=64, stream=p.stream)[0] for p in parts]
    alone = [e.standalone_ips(1.0) for e in execs]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda e: e.standalone_ips(2.0), execs))
    whole = executor("eager", batch=64)[0].standalone_ips(1.0)
    return (f"SMs granted {[p.sms for p in parts]} of {total}; alone {[round(a) for a in alone]} img/s, "
            f"together {[round(t) for t in together]} (sum {sum(together):.0f}), whole GPU {whole:.0f}")


def check_engine_placement() -> str:
    from autohet.context import RunContext
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.pool import LocalPool, PoolSpec
    from autohet.strategy_run import run_strategy

    spec = PoolSpec("smoke", [ExecutorSpec("gpu0", "gpu", (0,), 0, precision="fp16"),
                              ExecutorSpec("cpu0", "cpu", tuple(range(1, 5)))])
    workload = Workload.from_spec(WorkloadSpec(32, (3, 224, 224)))
    m = run_strategy("placement", {"runs": 3, "x": 1}, LocalPool(spec),
                     RunContext(ModelSpec("resnet18"), workload, mode="latency", latency_runs=20))
    assert m.output_ok, m.failures
    return f"p50 {m.latency_ms['p50']:.3f} ms, baselines {m.extra['baselines_p50_ms']}"


def check_single_latency(backend: str) -> str:
    from autohet.context import RunContext
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.pool import LocalPool, PoolSpec
    from autohet.strategy_run import run_strategy

    spec = PoolSpec("smoke", [ExecutorSpec("gpu0", "gpu", (0,), 0, precision="fp16", backend=backend)])
    workload = Workload.from_spec(WorkloadSpec(32, (3, 224, 224)))
    m = run_strategy("single", {}, LocalPool(spec), RunContext(ModelSpec("resnet18"), workload, mode="latency",
                                                                 latency_runs=30))
    assert m.output_ok, m.failures
    return f"p50 {m.latency_ms['p50']:.3f} ms"


def check_runtime(strategy: str, objective: str, params: dict[str, Any]) -> str:
    """A config of the strategy on gpu0 (fp16, channels_last) and a CPU group through autohet.load: a
    call (checked against the fp32 reference) and a stream, the stream equal to the call."""
    import tempfile

    import autohet
    from autohet.config import RunConfig, write_config
    from autohet.core.workload import workload_for
    from autohet.pool import PoolSpec

    spec = PoolSpec("smoke", [ExecutorSpec("gpu0", "gpu", (0,), 0, batch=64, precision="fp16", channels_last=True,
                                           backend="cudagraphs"),
                              ExecutorSpec("cpu0", "cpu", tuple(range(1, 5)), batch=8)])
    x = np.ascontiguousarray(workload_for("resnet18", 40).rows(0, 40))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(RunConfig(ModelSpec("resnet18"), spec, strategy, params, objective=objective),
                            Path(tmp) / "c.yaml")
        with autohet.load(path) as runner:
            out = runner(x)
            assert runner.checked, "first call not checked"
            streamed = np.concatenate(list(runner.map([x[:16], x[16:]])))
            assert np.allclose(streamed, out, rtol=1e-2, atol=1e-2 * float(np.abs(out).max())), "stream != call"
            return f"{runner.check_result}, served {runner.describe()['served']}"


def runtime_checks() -> list[tuple[str, Callable[[], Any]]]:
    half = [0] * 5 + [1] * 5  # resnet18's 10 blocks at batch 1
    return [
        ("runtime fast_split", lambda: check_runtime("fast_split", "throughput", {"unit": "batches", "w_s": 2,
                                                                                  "r": 0.8, "threshold": 1})),
        ("runtime single latency", lambda: check_runtime("single", "latency", {"executor": 0})),
        ("runtime placement", lambda: check_runtime("placement", "latency", {"start": "given", "assignment": half,
                                                                             "x": 0})),
        ("runtime pipeline", lambda: check_runtime("pipeline", "throughput", {"start": "given", "cuts": [8],
                                                                              "stages": [0, 1], "batch": 16})),
        ("runtime split", lambda: check_runtime("split", "throughput", {"start": "given", "ratios": [0.9], "rest": 0,
                                                                        "batch": 8})),
        ("runtime channels", lambda: check_runtime("channels", "latency", {"start": "given", "shares": [0.9] * 21,
                                                                           "rest": 0})),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out")
    parser.add_argument("--skip", default="", help="comma-separated item prefixes to skip")
    args = parser.parse_args()
    skip = [s for s in args.skip.split(",") if s]
    checks = [("executor eager", lambda: check_executor("eager")),
              ("executor cudagraphs", lambda: check_executor("cudagraphs")),
              ("executor inductor", lambda: check_executor("inductor")),
              ("green partitions", check_partitions),
              ("engine placement", check_engine_placement),
              ("single latency cudagraphs", lambda: check_single_latency("cudagraphs")),
              ("single latency eager", lambda: check_single_latency("eager")), *runtime_checks()]
    for name, fn in checks:
        if not any(name.startswith(s) for s in skip):
            item(name, fn)
    if args.out:
        Path(args.out).write_text(json.dumps(RESULTS, indent=1))
    print(f"{sum(r['ok'] for r in RESULTS)}/{len(RESULTS)} passed")


if __name__ == "__main__":
    main()
