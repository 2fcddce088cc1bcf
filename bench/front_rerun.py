"""Export points of a two-objective tune's Pareto front and rerun each (issue 15): the front's two
ends (best img/s, lowest J/img) and its middle point, each distinct point once, each exported with
``autohet export --run-id`` and rerun with ``autohet run --config``; ratios rerun / tune for img/s
and J/img printed side by side.

    python -m bench.front_rerun --experiment resnet18-energy --out front_rerun.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import emit

__all__ = ["main"]


def autohet(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autohet.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--tracking-uri")
    parser.add_argument("--out")
    args = parser.parse_args()
    from autohet.tracking import experiment_runs

    _, _, runs = experiment_runs(args.experiment, args.tracking_uri)
    points = [r for r in runs if r.data.tags.get("pareto") == "true"]
    if not points:
        sys.exit(f"front_rerun: no trial of {args.experiment!r} is tagged pareto; run a two-objective tune first")
    ordered = sorted(points, key=lambda r: -r.data.metrics["throughput_ips"])
    picks = {"best img/s": ordered[0], "lowest J/img": min(points, key=lambda r: r.data.metrics["energy_j_per_image"])}
    if len(ordered) > 2:
        picks["middle"] = ordered[len(ordered) // 2]
    ends: dict[str, Any] = {}
    for label, run in picks.items():  # a front of one point is rerun once
        if all(run.info.run_id != r.info.run_id for r in ends.values()):
            ends[label] = run
    rows: list[dict[str, Any]] = []
    folder = Path(tempfile.mkdtemp(prefix="front-"))
    for label, run in ends.items():
        row: dict[str, Any] = {"point": label, "run_id": run.info.run_id, "strategy": run.data.tags.get("strategy"),
                               "front_points": len(points), "tune_ips": run.data.metrics["throughput_ips"],
                               "tune_j_per_img": run.data.metrics["energy_j_per_image"]}
        config = folder / f"{run.info.run_id}.yaml"
        exported = autohet("export", "--experiment", args.experiment, "--run-id", run.info.run_id, "--out", str(config),
                           *(["--tracking-uri", args.tracking_uri] if args.tracking_uri else []))
        if exported.returncode != 0:
            row["error"] = (exported.stderr or exported.stdout).strip()[-300:]
            rows.append(row)
            continue
        rerun = autohet("run", "--config", str(config), "--json")
        if rerun.returncode != 0:
            row["error"] = (rerun.stderr or rerun.stdout).strip()[-300:]
            rows.append(row)
            continue
        m = json.loads(rerun.stdout.strip().splitlines()[-1])
        energy = m.get("extra", {}).get("energy", {})
        row.update(rerun_ips=m["throughput_ips"], rerun_j_per_img=energy.get("energy_j_per_image"),
                   output_ok=m.get("output_ok"))
        row["ips_ratio"] = row["rerun_ips"] / row["tune_ips"]
        if row["rerun_j_per_img"] is not None:
            row["j_per_img_ratio"] = row["rerun_j_per_img"] / row["tune_j_per_img"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    emit("front_rerun", rows, ["point", "strategy", "front_points", "tune_ips", "rerun_ips", "ips_ratio",
                               "tune_j_per_img", "rerun_j_per_img", "j_per_img_ratio", "output_ok"], args.out)


if __name__ == "__main__":
    main()
