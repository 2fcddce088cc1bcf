"""``autohet export``: any trial's config (default: the best valid one) as a YAML file.

A trial is named by ``--run-id``, or picked by bounds (``--max-watts``, ``--min-ips``,
``--max-ms``): the best ok trial by the tune's first objective among those that meet every bound
given, which is how a point of a throughput,energy front is chosen for production.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autohet.core.errors import UserError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="write a trial's config (default: the experiment's best)")
    p.add_argument("--experiment", required=True)
    p.add_argument("--run-id", help="the trial's MLflow run id (default: the best valid trial)")
    p.add_argument("--max-watts", type=float, metavar="W",
                   help="only trials whose average power over the run (power_avg_w: every readable device) is at "
                        "most W")
    p.add_argument("--min-ips", type=float, metavar="N", help="only trials of at least N images/s")
    p.add_argument("--max-ms", type=float, metavar="M", help="only trials whose batch-1 p50 latency is at most M ms")
    p.add_argument("--out", help="output file (default runs/<experiment>/best.yaml or .../<run-id>.yaml)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under runs/)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from autohet.core.objectives import ObjectiveSet
    from autohet.tracking import (
        constraints_from,
        experiment_runs,
        export_run,
        final_pick,
        pick_trial,
        summarize,
        tune_objective,
    )

    constraints = constraints_from({"max_watts": args.max_watts, "min_ips": args.min_ips, "max_ms": args.max_ms})
    if args.run_id and constraints:
        raise UserError("--run-id names the trial; drop --max-watts/--min-ips/--max-ms, or drop --run-id")
    client, _, runs = experiment_runs(args.experiment, args.tracking_uri)
    named = bool(args.run_id or constraints)
    if args.run_id:
        run_id = args.run_id
        if run_id not in {r.info.run_id for r in runs}:
            raise UserError(f"run {run_id} is not a trial of experiment {args.experiment}; see "
                            f"`autohet compare --experiment {args.experiment}`")
    elif constraints:
        objectives = ObjectiveSet.parse(tune_objective(client, runs))
        run_id = pick_trial(runs, objectives, constraints, args.experiment).info.run_id
    else:
        objective = tune_objective(client, runs)
        valid = [r for r in summarize(runs, objective) if r["best"] is not None]
        if not valid:
            raise UserError(f"experiment {args.experiment} has no valid trial to export")
        chosen = final_pick(runs, ObjectiveSet.parse(objective))  # the finals' winner, where they ran
        run_id = chosen.info.run_id if chosen is not None else valid[0]["run_id"]
    out = Path(args.out or (Path("runs") / args.experiment / (f"{run_id}.yaml" if named else "best.yaml")))
    config = export_run(client, run_id, out, None, args.experiment)
    figures = ", ".join(f"{config['measured'][key]:.4g} {unit}" for key, unit in
                        (("throughput_ips", "img/s"), ("power_avg_w", "W"), ("energy_j_per_image", "J/img"))
                        if isinstance(config["measured"].get(key), int | float))
    print(f"exported {config['strategy']} {config['params']} (run {run_id}{': ' + figures if figures else ''}) "
          f"-> {out}")
    return 0
