"""One trial as a nested MLflow run: params, metrics, status, the output check, timeline PNG, config."""

from __future__ import annotations

import json
from typing import Any

from autohet.tracking._status import FINISHED, STATUSES
from autohet.tracking._store import mlflow_client

__all__ = ["CONFIG_TAG", "TrialLogger"]

# The trial's Tune config as JSON: what the finals run again (``autohet.tuning.finals``). MLflow's
# params hold it too, but as text that loses its types.
CONFIG_TAG = "tune_config"
MAX_TAG_CHARS = 5000


class TrialLogger:
    """Logs trials of one tune under its parent run."""

    def __init__(self, uri: str | None, experiment_id: str, parent_run_id: str, fingerprint: dict[str, Any]):
        self.uri = uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.fingerprint = fingerprint

    def log(self, index: int, config: dict[str, Any], result: dict[str, Any], tune_trial_id: str = "") -> str:
        """The trial's run id. ``result["status"]`` is one of STATUSES; only ``ok`` is valid."""
        from mlflow.entities import Metric, Param, RunTag

        from autohet.tracking.plots import timeline_figure

        client = mlflow_client(self.uri)
        strategy = result.get("strategy") or config.get("strategy", "?")
        status = result.get("status", "error")
        if status not in STATUSES:
            raise ValueError(f"unknown trial status {status!r}")
        valid = status == "ok"
        tags = {"mlflow.parentRunId": self.parent_run_id, "autohet_kind": "trial", "strategy": strategy,
                "status": status, "valid": str(valid).lower(), "simulated": str(bool(result.get("simulated"))).lower(),
                "output_check": {"ok": "passed", "invalid": "failed"}.get(status, "not run"),
                "trial_index": str(index), "tune_trial_id": tune_trial_id}
        config_json = json.dumps(config, default=str)
        if len(config_json) <= MAX_TAG_CHARS:
            tags[CONFIG_TAG] = config_json
        if config.get("optuna_trial") is not None:
            tags["optuna_trial"] = str(config["optuna_trial"])
        run = client.create_run(self.experiment_id, run_name=f"trial-{index:03d}-{strategy}", tags=tags)
        run_id = run.info.run_id
        params = [Param("strategy", strategy)] + [
            Param(k, str(v)[:6000]) for k, v in sorted(config.items()) if k != "strategy"]
        metrics = [Metric(k, float(v), 0, 0) for k, v in result.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)]
        extra_tags = [RunTag("error", str(result["error"])[:5000])] if result.get("error") else []
        extra_tags += [RunTag(f"unavailable.{k}", str(v)[:500]) for k, v in (result.get("unavailable") or {}).items()]
        client.log_batch(run_id, metrics=metrics, params=params, tags=extra_tags)
        if result.get("measurement"):
            client.log_text(run_id, result["measurement"], "measurement.json")
            m = json.loads(result["measurement"])
            names = [e["name"] for e in m["executors"]]
            if m.get("timeline"):
                fig = timeline_figure(m["timeline"], names, f"trial {index}: {strategy} "
                                      f"{m['throughput_ips']:.1f} img/s" + (" [SIMULATED]" if m["simulated"] else ""))
                client.log_figure(run_id, fig, "timeline.png")
                import matplotlib.pyplot as plt

                plt.close(fig)
        if result.get("config_yaml"):
            client.log_text(run_id, result["config_yaml"], "config.yaml")
        client.set_terminated(run_id, "FINISHED" if status in FINISHED else "KILLED")
        return run_id
