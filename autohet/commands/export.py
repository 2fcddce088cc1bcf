"""``autohet export``: any trial's config (default: the best valid one) as a YAML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from autohet.errors import UserError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="write a trial's config (default: the experiment's best)")
    p.add_argument("--experiment", required=True)
    p.add_argument("--run-id", help="the trial's MLflow run id (default: the best valid trial)")
    p.add_argument("--out", help="output file (default runs/<experiment>/best.yaml or .../<run-id>.yaml)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under runs/)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from autohet.tracking import experiment_runs, export_run, summarize, tune_objective

    client, _, runs = experiment_runs(args.experiment, args.tracking_uri)
    if args.run_id:
        run_id = args.run_id
        if run_id not in {r.info.run_id for r in runs}:
            raise UserError(f"run {run_id} is not a trial of experiment {args.experiment}; see "
                            f"`autohet compare --experiment {args.experiment}`")
    else:
        objective = tune_objective(client, runs)
        valid = [r for r in summarize(runs, objective) if r["best"] is not None]
        if not valid:
            raise UserError(f"experiment {args.experiment} has no valid trial to export")
        run_id = valid[0]["run_id"]
    out = Path(args.out or (Path("runs") / args.experiment / ("best.yaml" if not args.run_id else f"{run_id}.yaml")))
    config = export_run(client, run_id, out, None, args.experiment)
    print(f"exported {config['strategy']} {config['params']} (run {run_id}) -> {out}")
    return 0

