"""``autohet profile``: each executor's standalone throughput at a few batch sizes.

Executors of one class (same kind, core count, GPU and settings: a GPU machine's one-core CPU
groups, say) run at one speed: each class is measured once per batch and the figure shared, each
measurement is time-boxed (``--seconds``; a unit slower than the box reports its own rate), and a
line on stderr says what is being measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from autohet.commands._common import add_model_args, add_pool_args, make_pool, model_spec, table
from autohet.core.errors import UserError
from autohet.pool import StandaloneCache, executor_class

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("profile", help="standalone throughput of every executor at a few batch sizes")
    add_model_args(p)
    add_pool_args(p)
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes (default 1,16,64)")
    p.add_argument("--seconds", type=float, default=1.0, help="measuring time per executor class and batch")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from autohet.core.workload import workload_for
    from autohet.pool.resolve import resolve_pool

    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--batches must be integers like 1,16,64, got {args.batches!r}") from None
    if not batches or min(batches) < 1:
        raise UserError("--batches needs at least one batch size >= 1")
    if args.seconds <= 0:
        raise UserError(f"--seconds must be positive, got {args.seconds}")
    model = model_spec(args)
    spec = resolve_pool(args.pool, args.address)
    workload = workload_for(model.name, max(batches) * 8)
    pool = make_pool(spec, args.address, args.in_process)
    results: dict[str, dict[int, float]] = {name: {} for name in pool.names}
    classes = len({executor_class(e) for e in spec.executors})

    began = time.perf_counter()

    def say(text: str) -> None:
        print(f"autohet: profile: [{time.perf_counter() - began:5.1f} s] {text}", file=sys.stderr, flush=True)

    try:
        say(f"starting {len(pool)} executors ({classes} distinct)")
        pool.start(model, workload)
        for b in batches:
            pool.configure({kind: {"batch": b} for kind in {e.kind for e in pool.spec.executors}})
            figures = StandaloneCache().measure(pool, args.seconds, None,
                                                progress=lambda text, b=b: say(f"batch {b}: {text}"))
            for name, ips in zip(pool.names, figures, strict=True):
                results[name][b] = ips
        say("measured; stopping the executors")
    finally:
        pool.shutdown()
    devices = {e.name: e.device for e in pool.spec.executors}
    if args.json:
        print(json.dumps({"model": model.name, "pool": spec.source, "simulated": spec.simulated,
                          "executors": [{"name": n, "device": devices[n],
                                         "ips_by_batch": {str(b): v for b, v in r.items()}}
                                        for n, r in results.items()]}))
    else:
        label = " [SIMULATED]" if spec.simulated else ""
        print(f"{model.name}: standalone images/s by batch size{label} (one measurement per executor class)")
        print(table([[n, devices[n], *[r[b] for b in batches]] for n, r in results.items()],
                    ["executor", "device", *[f"b{b}" for b in batches]]))
    return 0
