"""``autohet run``: one strategy on one pool, or an exported config, with a measured report; or,
with ``--input``, an exported config's outputs for a folder of images or an .npy (``--out``).

A throughput run measures each executor class's standalone speed first (the limit, and the
default ``--timeout``: ten times the run's expected length at that speed, at least 60 s), shows a
progress line on a terminal, and ends past its timeout with one line naming a faster parameter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from autohet.commands._common import (
    add_model_args,
    add_pool_args,
    add_workload_args,
    make_pool,
    model_spec,
    require_positive,
    table,
)
from autohet.context import RunContext
from autohet.core.errors import UserError
from autohet.core.measurement import Measurement
from autohet.core.objectives import ObjectiveSet
from autohet.core.params import parse_set_options
from autohet.pool import StandaloneCache
from autohet.strategy_run import run_strategy

__all__ = ["register", "report"]

DEFAULT_IMAGES = 10000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run one strategy (or an exported config) and report what it measured")
    add_model_args(p, required=False)
    add_pool_args(p)
    add_workload_args(p, DEFAULT_IMAGES)
    p.add_argument("--strategy", help="single, static, quick, chunk, hat, fifo, fast_split, placement, ...")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a strategy parameter (repeatable)")
    p.add_argument("--config", help="an exported config (runs/<experiment>/best.yaml)")
    p.add_argument("--objective", help="the run to make: throughput (default) or latency (batch-1 requests); "
                                       "a config brings its own")
    p.add_argument("--timeout", type=float, help="seconds the run may take (default: 10x its expected length "
                                                 "from the measured standalone speeds, at least 60)")
    p.add_argument("--standalone-seconds", type=float, default=1.0, help="measuring time per executor class")
    p.add_argument("--input", help="with --config: a folder of JPEG/PNG images (recursive, sorted) or an .npy of "
                                    "preprocessed inputs to run through the config (outputs to --out)")
    p.add_argument("--out", help="with --input: .npy (logits in input order) or .jsonl (top-5 per input), "
                                 "written atomically")
    p.add_argument("--skip-bad", action="store_true", help="with --input: leave out files that are not readable "
                                                            "images and list them, instead of stopping")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", action="store_true", help="include the work-unit timeline in --json")
    p.set_defaults(func=main)


def _from_config(args: argparse.Namespace):
    from autohet.config import load_config
    from autohet.platform.fingerprint import fingerprint, fingerprint_differences

    config = load_config(args.config)
    diffs = fingerprint_differences(config.platform, fingerprint()) if config.platform else []
    for line in diffs:
        print(f"autohet: warning: platform differs from the tuned one ({line}); figures may not hold",
              file=sys.stderr)
    pool_spec = config.pool
    if not args.address and not args.in_process:
        from autohet.pool import check_local_devices

        check_local_devices(pool_spec)
    images = args.images if args.images is not None else config.images
    args.objective = args.objective or config.objective
    return config.model, pool_spec, config.strategy, config.params, images, config.workload_seed, config.npy


class _Line:
    """A progress line on stderr, redrawn in place; only on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False

    def say(self, text: str) -> None:
        if self.tty:
            print("\r" + f"autohet: {text}".ljust(90)[:120], end="", file=sys.stderr, flush=True)
            self.shown = True

    def images(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if not self.tty or (now - self.last < 0.2 and done < total):
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed * (total - done) / done if done else float("nan")
        self.say(f"{done}/{total} images, {elapsed:.1f} s, ~{eta:.0f} s left")

    def close(self) -> None:
        if self.shown:
            print("\r" + " " * 90 + "\r", end="", file=sys.stderr, flush=True)


def batch_files(args: argparse.Namespace) -> int:
    """``--input``/``--out``: every input through the exported config, outputs written to --out."""
    if not args.config:
        raise UserError("--input needs --config (the exported config to run it through)")
    if not args.out:
        raise UserError("--input needs --out FILE (.npy for logits, .jsonl for top-5 per input)")
    if args.model or args.strategy or args.set:
        raise UserError("--input runs the config as exported; drop --model/--strategy/--set")
    from autohet.runtime.batch import run_batch

    line = _Line()
    try:
        summary = run_batch(args.config, args.input, args.out, skip_bad=args.skip_bad, address=args.address,
                            progress=line.images)
    finally:
        line.close()
    if args.json:
        print(json.dumps(summary))
        return 0
    decode = summary.get("decode")
    where = "" if decode is None else (
        f"; decoded on cores {_cores(decode['cores'])}" + (" (none is free of the config's devices: shared with "
                                                         "them)" if decode["shared_with_devices"] else ""))
    print(f"wrote {summary['images']} outputs to {summary['out']} ({summary['throughput_ips']:.1f} img/s over "
          f"{summary['wall_s']:.2f} s{where})")
    for bad in summary["skipped"]:
        print(f"skipped {bad['path']}: {bad['reason']}")
    if summary["deaths"]:
        print(f"{len(summary['deaths'])} executor failures during the run (warned above); their units re-ran on the "
              "others: nothing lost")
    return 0


def _cores(cores: list[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)) else \
        ",".join(map(str, cores))


def main(args: argparse.Namespace) -> int:
    if args.input:
        return batch_files(args)
    if args.out or args.skip_bad:
        raise UserError("--out and --skip-bad go with --input (a folder of images or an .npy to run)")
    if args.config:
        if args.model or args.strategy:
            raise UserError("--config already names the model and strategy; drop --model/--strategy")
        model, pool_spec, strategy, params, images, data_seed, npy = _from_config(args)
        params = {**params, **parse_set_options(args.set)}
    else:
        if not args.model or not args.strategy:
            raise UserError("run needs --model and --strategy (or --config FILE)")
        model = model_spec(args)
        from autohet.pool.resolve import resolve_pool
        from autohet.strategies import get_strategy

        get_strategy(args.strategy).validate(parse_set_options(args.set))  # fail before starting anything
        pool_spec = resolve_pool(args.pool, args.address)
        strategy, params = args.strategy, parse_set_options(args.set)
        images = args.images if args.images is not None else DEFAULT_IMAGES
        data_seed, npy = args.data_seed, args.npy
    require_positive("--images", images)
    if args.timeout is not None and args.timeout <= 0:
        raise UserError(f"--timeout must be positive seconds, got {args.timeout}")
    mode = ObjectiveSet.parse(args.objective or "throughput").mode
    from autohet.core.workload import workload_for

    workload = workload_for(model.name, images, data_seed, npy or args.npy)
    pool = make_pool(pool_spec, args.address, args.in_process)
    line = _Line()
    cache = StandaloneCache()
    try:
        ctx = RunContext(model, workload, check_images=args.check_images, mode=mode,
                         standalone_provider=lambda p, share, used: cache.measure(
                             p, args.standalone_seconds, share, progress=line.say, used=used),
                         progress=line.images)
        ctx.deadline_s = args.timeout
        from autohet.strategies import get_strategy

        chosen = get_strategy(strategy)
        if not mode.per_request and not chosen.on_engine:
            pool.start(model, workload)
            checked = chosen.validate(chosen.defaults_for(pool.spec, params))
            chosen.check_pool(pool, checked)  # a bad executor index is one line before anything is measured
            used = chosen.executors_used(checked)
            limit = sum(ctx.standalone(pool, used))  # measured before the run: the limit and the default timeout
            if ctx.deadline_s is None and limit > 0:
                ctx.deadline_s = max(60.0, 10.0 * images / limit)
            line.start = time.perf_counter()
        m = run_strategy(strategy, params, pool, ctx)
    finally:
        line.close()
        pool.shutdown()
    if args.json:
        print(m.to_json(timeline=args.timeline))
    else:
        print(report(m))
    return 0 if m.output_ok else 3


def report(m: Measurement) -> str:
    label = " [SIMULATED]" if m.simulated else ""
    if m.limit_ips is None:
        lat = m.latency_ms
        figures = f"latency p50 {lat.get('p50', float('nan')):.3f} ms  p95 {lat.get('p95', float('nan')):.3f} ms"
    else:
        figures = f"limit {m.limit_ips:.1f} img/s  efficiency {m.efficiency:.3f}  waste {m.waste:.3f}"
    lines = [
        f"{m.model} / {m.strategy} {m.params}{label}",
        f"images {m.images}  wall {m.wall_s:.3f} s  throughput {m.throughput_ips:.1f} img/s  {figures}",
        f"output check: {'ok' if m.output_ok else 'FAILED'} (max |diff| {m.max_abs_diff:.3g}, "
        f"tolerance {m.tolerance:.3g})",
        "",
        table([[e.name, e.device, e.images, f"~{e.busy_s:.4g}" if e.busy_estimated else e.busy_s, e.standalone_ips,
                "died" if e.died else ""]
               for e in m.executors], ["executor", "device", "images", "busy_s", "standalone_ips", ""]),
    ]
    if any(e.busy_estimated for e in m.executors):
        lines.append("busy_s ~: estimated from a few timed frames scaled to the run (not summed from its own units)")
    if m.extra.get("limit_raised"):
        lines.append("limit: " + "; ".join(f"{n} ran at {v['run_ips']:.4g} img/s, above its standalone "
                                           f"{v['standalone_ips']:.4g}: the run's speed is used"
                                           for n, v in m.extra["limit_raised"].items()))
    lines += energy_lines(m)
    lines += [f"! {f}" for f in m.failures]
    if m.extra.get("violation"):
        lines.append(f"! violation: {m.extra['violation']}")
    return "\n".join(lines)


def energy_lines(m: Measurement) -> list[str]:
    """What the run drew and how hot it got; each figure that could not be read, with why."""
    e = m.extra.get("energy") or {}

    def fig(key: str) -> str:
        return f"{e[key]:.4g}" if key in e else "?"

    lines = []
    if "energy_j" in e:
        whole = ("energy_j", "energy_window_j")
        devices = ", ".join(f"{k[7:-2]} {v:.4g} J" for k, v in e.items()
                            if k.startswith("energy_") and k.endswith("_j") and k not in whole)
        per = "request" if m.limit_ips is None else "image"
        lines.append(f"energy {fig('energy_j')} J ({devices}): {fig('energy_j_per_image')} J/{per}, "
                     f"{fig('power_avg_w')} W average over the run; the whole strategy run "
                     f"{fig('energy_window_j')} J in {fig('energy_window_s')} s")
    temps = {k[5:-6]: v for k, v in e.items() if k.startswith("temp_") and k.endswith("_max_c") and k != "temp_max_c"}
    if temps:
        lines.append(f"temperature max {fig('temp_max_c')} C (" + ", ".join(f"{k} {v:.1f}" for k, v in temps.items())
                     + ")")
    unavailable = m.extra.get("unavailable") or {}
    if unavailable:
        lines.append("not measured: " + "; ".join(f"{k}: {v}" for k, v in unavailable.items()))
    return lines
