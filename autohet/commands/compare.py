"""``autohet compare``: the best trial per strategy of an experiment, as a table."""

from __future__ import annotations

import argparse
import json

from autohet.commands._common import table

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="best trial per strategy of an experiment")
    p.add_argument("--experiment", required=True)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under runs/)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from autohet.tuning.tracking import experiment_runs, tune_objective
    from autohet.tuning.tuner import summarize

    client, _, runs = experiment_runs(args.experiment, args.tracking_uri)
    objective = tune_objective(client, runs)
    rows = summarize(runs, objective)
    if args.json:
        print(json.dumps({"experiment": args.experiment, "objective": objective, "strategies": rows}, default=str))
        return 0
    unit = "img/s" if objective == "throughput" else "ms p50"
    print(f"{args.experiment}: {len(runs)} trials, objective {objective}")
    print(table([[r["strategy"], r["trials"], r["invalid"], "-" if r["best"] is None else r["best"],
                  "-" if r["efficiency"] is None else r["efficiency"], r["run_id"] or "-"] for r in rows],
                ["strategy", "trials", "invalid", f"best {unit}", "efficiency", "run id"]))
    return 0
