"""``autohet profile``: each executor's standalone throughput at a few batch sizes."""

from __future__ import annotations

import argparse
import json

from autohet.commands._common import (
    add_model_args,
    add_pool_args,
    make_pool,
    make_workload,
    model_spec,
    resolve_pool,
    table,
)
from autohet.errors import UserError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("profile", help="standalone throughput of every executor at a few batch sizes")
    add_model_args(p)
    add_pool_args(p)
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes (default 1,16,64)")
    p.add_argument("--seconds", type=float, default=1.0, help="measuring time per executor and batch")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--batches must be integers like 1,16,64, got {args.batches!r}") from None
    if not batches or min(batches) < 1:
        raise UserError("--batches needs at least one batch size >= 1")
    model = model_spec(args)
    spec = resolve_pool(args.pool, args.address)
    workload = make_workload(model, max(batches) * 8)
    pool = make_pool(spec, args.address, args.in_process)
    results: dict[str, dict[int, float]] = {name: {} for name in pool.names}
    try:
        pool.start(model, workload)
        for b in batches:
            pool.configure({kind: {"batch": b} for kind in ("cpu", "gpu", "sim")})
            for name, ips in zip(pool.names, pool.standalone_ips(args.seconds), strict=True):
                results[name][b] = ips
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
        print(f"{model.name}: standalone images/s by batch size{label}")
        print(table([[n, devices[n], *[r[b] for b in batches]] for n, r in results.items()],
                    ["executor", "device", *[f"b{b}" for b in batches]]))
    return 0
