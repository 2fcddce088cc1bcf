"""Channel partitioning (seed 004) on the in-process engine: per layer pair IOP against OCP + OCP
(measured and modelled), and end to end the planned and tuned results against the best single
device, all measured in one run per model on the same engine.

    python -m bench.channels --models vgg16,resnet18            # GPU machine: the GPU + one CPU group
    python -m bench.channels --sms 66 --out runs/ch_66.json     # the GPU as a 66-SM green-context partition
    python -m bench.channels --smoke                            # CPU: lenet on two CPU groups

Plans: ``planned`` (the seed's heuristic), ``planned+unsplit`` (layers may stay whole on the joining
device), ``ocp`` (every layer alone), ``iop`` (every pairable pair), ``tuned`` (``--tune N`` Optuna
trials over the pairing bits and each layer's share, started from the planned point).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from autohet.context import TOLERANCE, tolerance_for
from autohet.core.models import ModelSpec, build_model, input_shape
from autohet.core.objectives import RunMode
from autohet.core.workload import Workload, WorkloadSpec
from autohet.engine import build_engine
from autohet.pool import detect_executors
from autohet.strategies.channels import ChannelsSession
from bench._common import describe_machine, emit


def devices(smoke: bool, sms: int | None, precision: str) -> list:
    """The GPU (whole, or one partition of ``sms`` SMs; fed by one core) and one CPU group of the
    other cores; two CPU groups without a GPU or with ``--smoke``."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    gpus = 0 if smoke or not torch.cuda.is_available() else 1
    group = max(1, len(cores) - gpus) if gpus else max(1, len(cores) // 2)
    gpu = {"precision": precision, "channels_last": True, **({"sms": sms} if sms else {})}
    return detect_executors(cores, gpus, {"cpu_group_size": group, "max_cpu_groups": 1 if gpus else 2, "gpu": gpu})


def _figure(session: ChannelsSession, out: dict[str, Any]) -> float:
    """p50 ms (latency) or images/s (throughput) of one measured plan."""
    if session.mode.per_request:
        return float(np.median(out.times_s)) * 1e3
    return session.workload.images / out.wall_s


def _check(session: ChannelsSession, outputs: np.ndarray, reference: np.ndarray, precision: str) -> bool:
    ref = reference[: len(outputs)]
    diff = float(np.max(np.abs(outputs[: len(ref)] - ref)))
    return diff <= TOLERANCE[precision] * max(float(np.max(np.abs(ref))), 1e-6)


def _tune(session: ChannelsSession, trials: int, start: Any, run: Any) -> tuple[Any, float]:
    """Optuna over the pairing bits of pairable layers and each layer's first-device share, the planned
    point first; each trial measured end to end. Returns (best plan, its figure)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n = len(session.names)
    sign = session.mode.pick(1.0, -1.0)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    first = {f"pair{i}": start.pairing[i] for i in range(n) if session.costs[i].pairs_next}
    if len(session.devices) == 2:
        first.update({f"share{i}": float(start.shares[i][0]) for i in range(n)})
    study.enqueue_trial(first)
    best: tuple[Any, float] | None = None
    for _ in range(trials):
        trial = study.ask()
        pairing = [trial.suggest_categorical(f"pair{i}", [0, 1]) if session.costs[i].pairs_next else 0
                   for i in range(n)]
        shares = ([trial.suggest_float(f"share{i}", 0.0, 1.0) for i in range(n)]
                  if len(session.devices) == 2 else None)
        plan = session.plan(pairing, shares)
        value = run(plan)
        study.tell(trial, sign * value)
        if best is None or sign * value < sign * best[1]:
            best = (plan, value)
    return best or (start, float("nan"))


def bench_model(engine: Any, names: list[str], model: str, mode: str, args: argparse.Namespace,
                precision: str) -> list[dict[str, Any]]:
    run_mode = RunMode(mode)
    images = run_mode.pick(args.requests, args.images)
    workload = Workload.from_spec(WorkloadSpec(images, input_shape(model)))
    params = {"graphs": args.graphs, "runs": args.runs, "batch": args.batch, "depth": 2, "rest": None}
    session = ChannelsSession(engine, ModelSpec(model), run_mode, workload, args.requests, names, params,
                              args.standalone_seconds)
    import torch

    with torch.inference_mode():
        head = min(16, images)
        reference = build_model(model)(torch.from_numpy(np.ascontiguousarray(workload.rows(0, head)))).numpy()
    unit = run_mode.pick("p50_ms", "ips")
    best_single = run_mode.pick(min, max)(session.baselines.values())
    rows: list[dict[str, Any]] = []

    def run(plan: Any) -> float:
        out = session.measure(plan)
        ok = _check(session, out.outputs, reference, precision)
        return _figure(session, out) if ok else run_mode.pick(float("inf"), 0.0)

    planned = session.plan()
    report = session.report(planned, compare=True)
    for p in report["pairs"]:
        rows.append({"model": model, "mode": mode, "row": "pair", "name": f"{p['first']} + {p['second']}",
                     "iop_measured_ms": p["iop_measured_ms"], "ocp_measured_ms": p["ocp_measured_ms"],
                     "iop_modelled_ms": p["iop_modelled_ms"], "ocp_modelled_ms": p["ocp_modelled_ms"],
                     "chosen": p["chosen"]})
    plans = {"planned": planned, "planned+unsplit": session.plan(unsplit=True),
             "ocp": session.plan([0] * len(session.names)), "iop": session.plan([1] * len(session.names))}
    for variant, plan in plans.items():
        out = session.measure(plan)
        figure = _figure(session, out)
        rows.append({"model": model, "mode": mode, "row": "plan", "name": variant, unit: figure,
                     "measured_ms": figure if run_mode.per_request else 1e3 * args.batch / figure,
                     "modelled_ms": plan.modelled_s * 1e3, f"best_single_{unit}": best_single,
                     "vs_best_single": figure / best_single, "output_ok": _check(session, out.outputs, reference,
                                                                                 precision),
                     "pairing": plan.pairing, "iop_units": sum(u.kind == "iop" for u in plan.units),
                     "whole_units": sum(u.kind == "whole" for u in plan.units)})
    if args.tune:
        plan, figure = _tune(session, args.tune, planned, run)
        out = session.measure(plan)
        figure = _figure(session, out)
        rows.append({"model": model, "mode": mode, "row": "plan", "name": f"tuned ({args.tune} trials)", unit: figure,
                     "measured_ms": figure if run_mode.per_request else 1e3 * args.batch / figure,
                     "modelled_ms": plan.modelled_s * 1e3, f"best_single_{unit}": best_single,
                     "vs_best_single": figure / best_single,
                     "output_ok": _check(session, out.outputs, reference, precision), "pairing": plan.pairing,
                     "shares": [s[0] for s in plan.shares]})
    rows.append({"model": model, "mode": mode, "row": "baselines", "name": "devices alone", **{
        f"{d} {unit}": v for d, v in session.baselines.items()}, "rest": session.rest,
        "links": report["links"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="lenet on two CPU groups (runs anywhere)")
    parser.add_argument("--models", default="vgg16,resnet18")
    parser.add_argument("--modes", help="latency, throughput or both, comma-separated (default latency; with "
                                        "--smoke both)")
    parser.add_argument("--sms", type=int, help="use a green-context partition of this many SMs as the GPU")
    parser.add_argument("--precision", default="fp16", help="the GPU's precision (the CPU group runs fp32)")
    parser.add_argument("--requests", type=int, default=30, help="batch-1 requests per latency measurement")
    parser.add_argument("--images", type=int, default=512, help="images per throughput measurement")
    parser.add_argument("--batch", type=int, default=16, help="images per frame in throughput runs")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per layer, link and unit")
    parser.add_argument("--tune", type=int, default=20, help="Optuna trials over pairing and shares (0: none)")
    parser.add_argument("--graphs", default="on", choices=["on", "off"], help="CUDA graphs for GPU pieces")
    parser.add_argument("--standalone-seconds", type=float, default=1.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    args.graphs = args.graphs == "on"
    if args.smoke:
        args.models, args.requests, args.images, args.runs, args.tune = "lenet", 10, 64, 3, min(args.tune, 3)
        args.modes, args.standalone_seconds = args.modes or "latency,throughput", 0.1
    args.modes = args.modes or "latency"
    specs = devices(args.smoke, args.sms, args.precision)
    names = [s.name for s in specs]
    precision = tolerance_for([s.precision for s in specs])
    rows: list[dict[str, Any]] = []
    engine = build_engine(specs)
    try:
        for model in args.models.split(","):
            for mode in args.modes.split(","):
                rows += bench_model(engine, names, model, mode, args, precision)
    finally:
        engine.close()
    pairs = [r for r in rows if r["row"] == "pair"]
    plans = [r for r in rows if r["row"] == "plan"]
    if pairs:
        emit("channels: per layer pair, IOP against OCP + OCP (ms)", pairs,
             ["model", "mode", "name", "iop_measured_ms", "ocp_measured_ms", "iop_modelled_ms", "ocp_modelled_ms",
              "chosen"], None)
    emit(f"channels: end to end on {', '.join(s.device for s in specs)} (latency p50 ms / throughput img/s)", plans,
         ["model", "mode", "name", "p50_ms", "ips", "modelled_ms", "vs_best_single", "output_ok", "iop_units"], None)
    for row in (r for r in rows if r["row"] == "baselines"):
        print(row["model"], row["mode"], {k: round(v, 3) for k, v in row.items() if " " in k}, "rest", row["rest"])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"bench": "channels", "machine": describe_machine(),
                                              "devices": [s.to_dict() for s in specs], "rows": rows}, indent=1,
                                             default=str))


if __name__ == "__main__":
    main()
