"""The tune's live line on stderr and the end-of-tune account of where its wall time went."""

from __future__ import annotations

import sys
import time
from typing import Any

from autohet.core.objectives import ObjectiveSet, TrialKey
from autohet.tracking import STATUSES

__all__ = ["Progress"]


class Progress:
    """Trials done / budget, elapsed, the best so far and the last trial's status."""

    def __init__(self, budget: int, objectives: ObjectiveSet, done_before: int,
                 time_budget_s: float | None = None) -> None:
        self.budget, self.objectives, self.time_budget_s = budget, objectives, time_budget_s
        self.done = done_before
        self.start = time.time()
        self.best: tuple[float, str] | None = None
        self.tty = sys.stderr.isatty()
        self.seconds: dict[str, float] = {}  # summed trial phases (time.*) and MLflow logging
        self.statuses: dict[str, int] = dict.fromkeys(STATUSES, 0)
        self.status_seconds: dict[str, float] = {}  # trial seconds by status (cut trials' share of the budget)
        self.final_runs = 0  # the finals' runs (``autohet.tuning.finals``) and their seconds
        self.final_s = 0.0

    def add_phases(self, result: dict[str, Any]) -> None:
        """A run's phases (``time.*``) into the wall-time account."""
        for key, value in result.items():
            if key.startswith(TrialKey.PHASE_PREFIX) and isinstance(value, int | float):
                phase = key[len(TrialKey.PHASE_PREFIX):]
                self.seconds[phase] = self.seconds.get(phase, 0.0) + float(value)

    def add_final(self, result: dict[str, Any]) -> None:
        """A final run: its phases count as a trial's in the account, but it is not a trial."""
        self.add_phases(result)
        self.final_runs += 1
        self.final_s += float(result.get(TrialKey.TRIAL, 0.0))

    def update(self, result: dict[str, Any], logging_s: float = 0.0) -> None:
        status = result.get("status", "error")
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status != "killed":
            self.done += 1
        self.add_phases(result)
        self.seconds["mlflow_log_s"] = self.seconds.get("mlflow_log_s", 0.0) + logging_s
        self.status_seconds[status] = self.status_seconds.get(status, 0.0) + float(result.get(TrialKey.TRIAL, 0.0))
        primary = self.objectives.primary
        value = primary.value(result) if status == "ok" else None
        if value is not None and (self.best is None or primary.better(value, self.best[0])):
            self.best = (value, result.get("strategy", "?"))
        best = f"best {self.best[0]:.4g} {primary.unit} ({self.best[1]})" if self.best else "no valid trial yet"
        elapsed = time.strftime("%H:%M:%S", time.gmtime(time.time() - self.start))
        line = f"[{self.done:>3}/{self.budget}] {elapsed}  {best}  last: {result.get('strategy', '?')} ({status}"
        line += self._others(result) + ")"
        print(("\r" + line.ljust(100)) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)

    def _others(self, result: dict[str, Any]) -> str:
        """The last trial's figures on the objectives after the first (a Pareto tune's energy)."""
        parts = []
        for o in self.objectives.objectives[1:]:
            value = o.value(result)
            parts.append(f"{value:.4g} {o.unit}" if value is not None else f"{o.name} not measured")
        return (", " + ", ".join(parts)) if parts and result.get("status") in ("ok", "violation") else ""

    def breakdown(self, manager_stats: dict[str, Any] | None) -> str:
        """Where the tune's wall time went: the trials' phases, MLflow logging, the rest (Ray Tune,
        set-up, export); trials by status; how often executors were started (``None``: the manager
        was still setting up executors for a trial the time budget stopped, and was ended); then a line
        per setting set up ahead that a trial waited for."""
        wall = time.time() - self.start
        parts = [f"{name.removesuffix('_s')} {secs:.0f} s" for name, secs in self.seconds.items() if name != "trial_s"]
        rest = wall - self.seconds.get("trial_s", 0.0) - self.seconds.get("mlflow_log_s", 0.0)
        acquire = self.seconds.get("acquire_s", 0.0)
        statuses = ", ".join(f"{n} {s}" for s, n in self.statuses.items() if n)
        if self.statuses.get("cut"):
            cut = self.status_seconds.get("cut", 0.0)
            share = f", {100 * cut / self.time_budget_s:.0f}% of the time budget" if self.time_budget_s else ""
            statuses += f" (cut trials {cut:.0f} s{share})"
        if self.final_runs:
            statuses += f"; finals: {self.final_runs} runs, {self.final_s:.0f} s"
        if manager_stats is None:
            return (f"autohet: {self.done} trials in {wall:.0f} s: " + ", ".join(parts) + f", other {rest:.0f} s; "
                    f"trials: {statuses or 'none'}; the last trial, stopped by the time budget while its executors "
                    "were being set up, was ended with them")
        return (f"autohet: {self.done} trials in {wall:.0f} s: " + ", ".join(parts) + f", other {rest:.0f} s "
                f"(acquiring executors {100 * acquire / wall if wall > 0 else 0:.0f}% of the wall time); trials: "
                f"{statuses or 'none'}; {manager_stats.get('topologies_started', 0)} executor topologies started "
                f"({manager_stats.get('actors_adopted', 0)} actors reused from earlier ones, "
                f"{manager_stats.get('actors_replaced', 0)} replaced after cuts), "
                f"{manager_stats.get('standalone_measured', 0)} standalone measurements" + _ahead(manager_stats)
                + "".join(f"\nautohet: set up ahead: {job}" for job in manager_stats.get("ahead_jobs", ())))


def _ahead(stats: dict[str, Any]) -> str:
    """What was made ready ahead while trials ran elsewhere (``autohet.tuning.ahead``), where anything was."""
    parts = []
    if stats.get("compiled_ahead"):
        parts.append(f"{stats['compiled_ahead']} settings compiled ahead on idle GPUs "
                     f"({stats.get('compiled_ahead_s', 0)} s compiling; trials waited {stats.get('ahead_waited_s', 0)} "
                     "s for them)")
    if stats.get("actors_started_ahead"):
        parts.append(f"CPU executors started ahead on idle cores: {stats['actors_started_ahead']}")
    return "".join(f", {part}" for part in parts)
