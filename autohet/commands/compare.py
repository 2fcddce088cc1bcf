"""``autohet compare``: the best trial per strategy of an experiment, as a table."""

from __future__ import annotations

import argparse
import json

from autohet.commands._common import summary_table

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="best trial per strategy of an experiment")
    p.add_argument("--experiment", required=True)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under runs/)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from autohet.core.objectives import ObjectiveSet
    from autohet.tracking import experiment_runs, summarize, tune_objective

    client, _, runs = experiment_runs(args.experiment, args.tracking_uri)
    objective = tune_objective(client, runs)
    rows = summarize(runs, objective)
    if args.json:
        print(json.dumps({"experiment": args.experiment, "objective": objective, "strategies": rows}, default=str))
        return 0
    unit = ObjectiveSet.parse(objective).primary.unit
    print(f"{args.experiment}: {len(runs)} trials, objective {objective}")
    print(summary_table(rows, f"best {unit}"))
    for r in rows:
        if r["run_id"]:
            print(f"  {r['strategy']}: best run {r['run_id']}")
    return 0
