"""``autohet tune``: search every strategy and its parameters; export the best valid trial."""

from __future__ import annotations

import argparse

from autohet.commands._common import add_model_args, model_spec, summary_table, table
from autohet.tuning.settings import load_settings

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help="search strategies and parameters with Ray Tune + Optuna; log to MLflow")
    add_model_args(p)
    p.add_argument("--conf", help="tune defaults (default conf/default.yaml)")
    p.add_argument("--objective", help="throughput (default), latency, energy, or two of them for a Pareto front "
                                       "(throughput,energy or latency,energy)")
    p.add_argument("--trials", type=int, help="trial budget")
    p.add_argument("--time-budget", type=float, dest="time_budget_s", metavar="SECONDS", help="wall-clock budget")
    p.add_argument("--strategies", help="comma-separated strategy names (single is always included)")
    p.add_argument("--pool", help="pool file (default from the conf: actors/auto.yaml)")
    p.add_argument("--experiment", help="MLflow experiment (default: the model name)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under runs/)")
    p.add_argument("--seed", type=int, help="sampler seed")
    p.add_argument("--images", help="images per trial, or auto")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic images")
    p.add_argument("--npy", help="an .npy file of images instead of synthetic ones")
    p.add_argument("--max-temp", type=float, dest="max_temp", metavar="C",
                   help="a trial whose measured max temperature exceeds C is a violation (never exported); "
                        "trials first wait for the devices to cool (conf: cool_margin_c, cool_max_s)")
    p.add_argument("--resume", action="store_true", help="continue a killed tune, keeping finished trials")
    p.add_argument("--address", help="join this Ray cluster")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from autohet.tuning.tuner import tune_model

    model = model_spec(args)
    images = args.images
    if images is not None and images != "auto":
        images = int(images) if str(images).isdigit() else images
    settings = load_settings(args.conf, {
        "objective": args.objective, "trials": args.trials, "time_budget_s": args.time_budget_s,
        "strategies": args.strategies, "pool": args.pool, "experiment": args.experiment,
        "tracking_uri": args.tracking_uri, "seed": args.seed, "images": images, "max_temp": args.max_temp})
    outcome = tune_model(model, settings, args.address, args.resume, args.data_seed, args.npy)
    primary = settings.objectives.primary
    print(f"\n{outcome.trials_done} trials of {model.name} ({settings.objective}); best valid per strategy:")
    print(summary_table(outcome.summary, f"best {primary.unit}"))
    if outcome.front:
        names = [o.name for o in settings.objectives.objectives]
        print(f"\nPareto front ({', '.join(names)}), tagged pareto=true in MLflow:")
        print(table([[r["strategy"], *[f"{r[n]:.4g}" for n in names], r["run_id"]] for r in outcome.front],
                    ["strategy", *[f"{o.name} {o.unit}" for o in settings.objectives.objectives], "run id"]))
        print("pick a point: autohet export --experiment "
              f"{outcome.experiment} --run-id ID, or by a bound: --max-watts W / --min-ips N / --max-ms M")
    elif outcome.front_note:
        print(f"\n{outcome.front_note}")
    if outcome.best_path:
        b = outcome.best
        finals = " (the finals' winner)" if b.get("mlflow", {}).get("run_id") != outcome.summary[0]["run_id"] else ""
        print(f"\nbest: {b['strategy']} {b['params']}{finals} -> {outcome.best_path}")
        print(f"rerun: autohet run --config {outcome.best_path}")
        return 0
    if outcome.trials_done == 0:
        print(f"\nno trial finished within --time-budget {settings.time_budget_s:g} s: nothing exported; "
              "raise --time-budget (the set-up before the first trial is part of it)")
    else:
        print("\nno valid trial: nothing exported (see the invalid trials' errors in MLflow: autohet ui)")
    return 4
