"""``autohet run``: one strategy on one pool, or an exported config, with a measured report."""

from __future__ import annotations

import argparse
import sys

from autohet.commands._common import (
    add_model_args,
    add_pool_args,
    add_workload_args,
    make_pool,
    make_workload,
    model_spec,
    require_positive,
    resolve_pool,
    table,
)
from autohet.errors import UserError
from autohet.measurement import Measurement
from autohet.params import parse_set_options
from autohet.run import RunContext, run_strategy

__all__ = ["register", "report"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run one strategy (or an exported config) and report what it measured")
    add_model_args(p, required=False)
    add_pool_args(p)
    add_workload_args(p)
    p.add_argument("--strategy", help="single, static, quick, chunk, hat, fifo, fast_split, ...")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a strategy parameter (repeatable)")
    p.add_argument("--config", help="an exported config (runs/<experiment>/best.yaml)")
    p.add_argument("--objective", choices=["throughput", "latency"],
                   help="throughput (default) or batch-1 latency; a config brings its own")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", action="store_true", help="include the work-unit timeline in --json")
    p.set_defaults(func=main)


def _from_config(args: argparse.Namespace):
    from autohet.config import load_config
    from autohet.platform_info import fingerprint, fingerprint_differences

    config = load_config(args.config)
    diffs = fingerprint_differences(config.platform, fingerprint()) if config.platform else []
    for line in diffs:
        print(f"autohet: warning: platform differs from the tuned one ({line}); figures may not hold",
              file=sys.stderr)
    pool_spec = config.pool
    if not args.address and not args.in_process:
        from autohet.pool import check_local_devices

        check_local_devices(pool_spec)
    images = args.images if args.images_given else config.images
    args.objective = args.objective or config.objective
    return config.model, pool_spec, config.strategy, config.params, images, config.workload_seed, config.npy


def main(args: argparse.Namespace) -> int:
    args.images_given = any(a == "--images" or a.startswith("--images=") for a in sys.argv)
    if args.config:
        if args.model or args.strategy:
            raise UserError("--config already names the model and strategy; drop --model/--strategy")
        model, pool_spec, strategy, params, images, data_seed, npy = _from_config(args)
        params = {**params, **parse_set_options(args.set)}
    else:
        if not args.model or not args.strategy:
            raise UserError("run needs --model and --strategy (or --config FILE)")
        model = model_spec(args)
        from autohet.strategies import get_strategy

        get_strategy(args.strategy).validate(parse_set_options(args.set))  # fail before starting anything
        pool_spec = resolve_pool(args.pool, args.address)
        strategy, params, images = args.strategy, parse_set_options(args.set), args.images
        data_seed, npy = args.data_seed, args.npy
    require_positive("--images", images)
    workload = make_workload(model, images, data_seed, npy or args.npy)
    pool = make_pool(pool_spec, args.address, args.in_process)
    try:
        ctx = RunContext(model, workload, check_images=args.check_images, objective=args.objective or "throughput")
        m = run_strategy(strategy, params, pool, ctx)
    finally:
        pool.shutdown()
    if args.json:
        print(m.to_json(timeline=args.timeline))
    else:
        print(report(m))
    return 0 if m.output_ok else 3


def report(m: Measurement) -> str:
    label = " [SIMULATED]" if m.simulated else ""
    lines = [
        f"{m.model} / {m.strategy} {m.params}{label}",
        f"images {m.images}  wall {m.wall_s:.3f} s  throughput {m.throughput_ips:.1f} img/s  "
        f"limit {m.limit_ips:.1f} img/s  efficiency {m.efficiency:.3f}  waste {m.waste:.3f}",
        f"output check: {'ok' if m.output_ok else 'FAILED'} (max |diff| {m.max_abs_diff:.3g}, "
        f"tolerance {m.tolerance:.3g})",
        "",
        table([[e.name, e.device, e.images, e.busy_s, e.standalone_ips, "died" if e.died else ""]
               for e in m.executors], ["executor", "device", "images", "busy_s", "standalone_ips", ""]),
    ]
    lines += [f"! {f}" for f in m.failures]
    return "\n".join(lines)
