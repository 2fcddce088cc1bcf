"""The finals: a tune's few best configurations measured again, by turns, before one is exported.

A tune's best trial is the largest of many noisy figures, so it is biased upward, and the trials
close to it are as likely to be the faster configuration (docs/why.md, tuning/finals.py). So the ok
trials within ``final_within`` of the best (at most ``finalists``, distinct configurations) run again
through the same trial path, one after another, for ``rounds`` rounds, in the time the search left
(at least ``FINAL_SHARE`` of the trial budget is kept for them); the one with the best median
exports. A finalist whose final run is not ok (wrong outputs, cut, refused, an error) is out: it
did not repeat.

Where the search left time over, each final run measures up to ``FINAL_MOST_SCALE`` times its trial's
images (``final_scale``): a short trial gives a slow group few batches, and its figure is noisy, while
a tune's trials can end well before its budget (docs/why.md, tuning/finals.py).

Pure decisions (``pick_finalists``, ``final_choice``) are separate from running them (``run_finals``,
which takes the trial runner as a function) so tests drive them with fakes.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autohet.core.objectives import Objective
from autohet.core.settings import FINAL_MOST_SCALE, FINAL_SHARE

__all__ = ["FINAL_MOST_SCALE", "FINAL_SHARE", "Finalist", "final_choice", "final_scale", "finalists_of",
           "finals_table", "log_finals", "pick_finalists", "run_finals", "trial_runner"]

_FINAL_FILL = 0.5


@dataclass
class Finalist:
    """One configuration in the finals: its trial run, its Tune config, its trial figure and the
    figures its final runs measured (``out``: why it left the finals)."""

    run_id: str
    strategy: str
    config: dict[str, Any]
    trial_value: float
    trial_s: float = 0.0  # its trial's seconds: what one final run is expected to take
    values: list[float] = field(default_factory=list)
    out: str | None = None


def pick_finalists(trials: list[Finalist], primary: Objective, count: int, margin: float) -> list[Finalist]:
    """Up to ``count`` ok trials, best first, each a distinct configuration, within ``margin`` of the
    best; fewer than two: no finals (an empty list)."""
    if count < 2 or not trials:
        return []
    ranked = sorted(trials, key=lambda f: primary.rank(f.trial_value))
    best = ranked[0].trial_value

    def close(value: float) -> bool:
        return value >= (1 - margin) * best if primary.direction == "max" else value <= (1 + margin) * best

    chosen: list[Finalist] = []
    seen: set[str] = set()
    for f in ranked:
        key = json.dumps({k: v for k, v in f.config.items() if k != "optuna_trial"}, sort_keys=True, default=str)
        if key in seen or not close(f.trial_value):
            continue
        seen.add(key)
        chosen.append(f)
        if len(chosen) == count:
            break
    return chosen if len(chosen) >= 2 else []


def final_scale(finalists: list[Finalist], rounds: int, time_left: float, most: float = FINAL_MOST_SCALE) -> float:
    """How many times its trial's images each final run measures: the finals' planned runs (``rounds``
    of each finalist, each its trial's seconds) stretched to fill half of ``time_left``, from 1 (as the
    trials) to ``most``."""
    planned = rounds * sum(max(f.trial_s, 0.0) for f in finalists)
    if planned <= 0 or time_left <= 0:
        return 1.0
    return max(1.0, min(most, _FINAL_FILL * time_left / planned))


def run_finals(finalists: list[Finalist], run: Callable[[dict[str, Any]], dict[str, Any]], primary: Objective,
               rounds: int, deadline: float, clock: Callable[[], float] = time.monotonic) -> int:
    """Runs each finalist once per round, by turns, while the next run is expected to end before
    ``deadline`` (``clock``'s time); returns the rounds every finalist still in finished."""
    for _ in range(rounds):
        for f in finalists:
            if f.out is not None:
                continue
            if clock() + max(f.trial_s, 0.0) > deadline:
                return _complete_rounds(finalists)
            started = clock()
            try:
                result = run(f.config)
            except Exception as exc:  # e.g. an actor died: this configuration did not repeat
                f.out = f"error: {exc}"[:300]
                continue
            f.trial_s = clock() - started
            value = primary.value(result) if result.get("status") == "ok" else None
            if value is None:
                f.out = f"{result.get('status', 'error')}: {result.get('error', '')}"[:300]
            else:
                f.values.append(value)
    return _complete_rounds(finalists)


def _complete_rounds(finalists: list[Finalist]) -> int:
    counts = [len(f.values) for f in finalists if f.out is None]
    return min(counts) if counts else 0


def final_choice(finalists: list[Finalist], primary: Objective) -> Finalist | None:
    """The finalist with the best median over the rounds every remaining finalist finished; None
    where none finished a round (the best trial stays the choice)."""
    rounds = _complete_rounds(finalists)
    standing = [f for f in finalists if f.out is None]
    if rounds == 0 or not standing:
        return None
    return min(standing, key=lambda f: primary.rank(statistics.median(f.values[:rounds])))


def finals_table(finalists: list[Finalist], primary: Objective, winner: Finalist | None) -> str:
    """The finals as printed at the end of a tune: each finalist's trial figure, final figures, median."""
    rounds = _complete_rounds(finalists)
    lines = []
    for f in finalists:
        figures = " ".join(f"{v:.4g}" for v in f.values) or "-"
        median = f"{statistics.median(f.values[:rounds]):.4g}" if f.out is None and rounds else "-"
        note = "  <- exported" if f is winner else (f"  out: {f.out}" if f.out else "")
        lines.append(f"  {f.strategy:<10} trial {f.trial_value:<10.4g} finals {figures:<24} median {median}{note}")
    return "\n".join(lines)


def finalists_of(runs: list[Any], primary: Objective) -> list[Finalist]:
    """The tune's ok trial runs (MLflow) as candidates: those whose Tune config was logged. A final
    run is expected to take its trial's seconds less its acquiring (its executors' builds are kept):
    a compiled executor's acquiring can be most of its trial, and counting it kept the finals from
    running at all (docs/why.md, tuning/finals.py)."""
    from autohet.core.objectives import TrialKey
    from autohet.tracking import CONFIG_TAG, run_status

    out = []
    for run in runs:
        value = primary.value(run.data.metrics) if run_status(run) == "ok" else None
        text = run.data.tags.get(CONFIG_TAG)
        if value is None or not text:
            continue
        expected = run.data.metrics.get(TrialKey.TRIAL, 0.0) - run.data.metrics.get(TrialKey.ACQUIRE, 0.0)
        out.append(Finalist(run.info.run_id, run.data.tags.get("strategy", "?"), json.loads(text), value,
                            max(0.0, float(expected))))
    return out


def trial_runner(setup: Any, on_result: Callable[[dict[str, Any]], None]
                 ) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A final run as the trials ran: ``run_trial`` on the manager's executors, here in the tune's own
    process, its result handed to ``on_result`` (the tune's accounting). A Ray task of its own paid a
    fresh worker's imports first, which left the finals time for fewer runs (docs/why.md,
    tuning/finals.py)."""
    from autohet.tuning.trainable import run_trial

    def run(config: dict[str, Any]) -> dict[str, Any]:
        result = run_trial(dict(config), setup)
        on_result(result)
        return result

    return run


def log_finals(client: Any, parent_id: str, finalists: list[Finalist], winner: Finalist | None,
               primary: Objective) -> None:
    """Each finalist's final figures (``final.<metric>`` by step) and their median
    (``TrialKey.FINAL``, which export reads), and the parent's ``final_choice`` tag."""
    from mlflow.entities import Metric, RunTag

    from autohet.core.objectives import TrialKey

    rounds = _complete_rounds(finalists)
    now = int(time.time() * 1000)
    for f in finalists:
        metrics = [Metric(f"final.{primary.metric}", v, now, i) for i, v in enumerate(f.values)]
        if f.out is None and rounds:
            metrics.append(Metric(TrialKey.FINAL, statistics.median(f.values[:rounds]), now, 0))
        tags = [RunTag("finalist", "out" if f.out else "true")] + ([RunTag("finalist_out", f.out)] if f.out else [])
        client.log_batch(f.run_id, metrics=metrics, tags=tags)
    if winner is not None:
        client.set_tag(parent_id, "final_choice", winner.run_id)
