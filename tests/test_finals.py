"""The finals (autohet.tuning.finals): who enters, the order they run in, the time they stop at, the
winner, and which trial export takes (no Ray: the trial runner and the clock are fakes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autohet.core.errors import UserError
from autohet.core.objectives import LATENCY, THROUGHPUT, ObjectiveSet, TrialKey
from autohet.tracking import final_pick
from autohet.tuning.finals import (
    FINAL_MOST_SCALE,
    Finalist,
    final_choice,
    final_scale,
    finals_table,
    pick_finalists,
    run_finals,
)
from autohet.tuning.settings import load_settings


def entrant(name: str, value: float, trial_s: float = 1.0, **config: object) -> Finalist:
    return Finalist(f"run-{name}", name, {"strategy": name, **config}, value, trial_s)


def test_finalists_are_distinct_configurations_within_the_margin_best_first():
    trials = [entrant("quick", 90.0, p=8), entrant("single", 100.0, executor=0),
              entrant("single", 97.0, executor=0, optuna_trial=7),  # the same configuration again
              entrant("hat", 84.0, s=1), entrant("chunk", 95.0, w=64), entrant("fifo", 93.0, c=4)]
    picked = pick_finalists(trials, THROUGHPUT, count=3, margin=0.15)
    assert [(f.strategy, f.trial_value) for f in picked] == [("single", 100.0), ("chunk", 95.0), ("fifo", 93.0)]
    assert [f.strategy for f in pick_finalists(trials, THROUGHPUT, count=9, margin=0.15)] == [
        "single", "chunk", "fifo", "quick"]  # hat (84) is more than 15% below the best


def test_no_finals_without_two_finalists():
    one_close = [entrant("single", 100.0, executor=0), entrant("hat", 50.0, s=1)]
    assert pick_finalists(one_close, THROUGHPUT, count=3, margin=0.15) == []
    assert pick_finalists(one_close * 2, THROUGHPUT, count=1, margin=0.9) == []
    assert pick_finalists([], THROUGHPUT, count=3, margin=0.15) == []


def test_a_latency_tune_takes_the_lowest_figures():
    trials = [entrant("single", 2.0, executor=0), entrant("hat", 2.2, s=1), entrant("quick", 2.5, p=1)]
    assert [f.strategy for f in pick_finalists(trials, LATENCY, count=3, margin=0.15)] == ["single", "hat"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def runner(clock: FakeClock, figures: dict[str, list[object]], seconds: float = 1.0):
    """Each call takes ``seconds`` of the fake clock and returns the strategy's next figure: a number
    (ok), a status name (that status) or an exception (raised)."""
    calls: list[str] = []

    def run(config: dict) -> dict:
        name = config["strategy"]
        calls.append(name)
        clock.now += seconds
        figure = figures[name].pop(0)
        if isinstance(figure, Exception):
            raise figure
        if isinstance(figure, str):
            return {"status": figure, "error": "outputs differ"}
        return {"status": "ok", TrialKey.THROUGHPUT: figure}

    return run, calls


def test_finals_run_by_turns_and_the_best_median_wins():
    clock = FakeClock()
    finalists = [entrant("hat", 41.5, s=1), entrant("single", 38.5, executor=0)]
    run, calls = runner(clock, {"hat": [39.0, 39.4, 38.8], "single": [40.2, 40.0, 40.6]})
    assert run_finals(finalists, run, THROUGHPUT, rounds=3, deadline=100.0, clock=clock) == 3
    assert calls == ["hat", "single"] * 3
    winner = final_choice(finalists, THROUGHPUT)
    # exact: Python float arithmetic on the test's own figures
    assert winner is finalists[1] and winner.values == [40.2, 40.0, 40.6]
    table = finals_table(finalists, THROUGHPUT, winner)
    assert "median 40.2  <- exported" in table and "median 39" in table


def test_a_finalist_whose_run_is_not_ok_is_out():
    clock = FakeClock()
    finalists = [entrant("hat", 50.0, s=1), entrant("quick", 48.0, p=8), entrant("single", 45.0, executor=0)]
    run, calls = runner(clock, {"hat": [60.0, "invalid"], "quick": [RuntimeError("actor died"), 99.0],
                                "single": [44.0, 46.0]})
    assert run_finals(finalists, run, THROUGHPUT, rounds=2, deadline=100.0, clock=clock) == 2
    assert calls == ["hat", "quick", "single", "hat", "single"]
    assert finalists[0].out.startswith("invalid: outputs differ") and "actor died" in finalists[1].out
    assert final_choice(finalists, THROUGHPUT) is finalists[2]  # the faster ones did not repeat
    assert "out: invalid" in finals_table(finalists, THROUGHPUT, finalists[2])


def test_the_finals_stop_before_a_run_that_would_end_past_the_deadline():
    clock = FakeClock()
    finalists = [entrant("hat", 50.0, trial_s=2.0, s=1), entrant("single", 49.0, trial_s=2.0, executor=0)]
    run, calls = runner(clock, {"hat": [50.0, 70.0], "single": [52.0, 10.0]}, seconds=2.0)
    # 2 s a run: hat, single, hat fit in 7 s; single's second would end at 8 s
    assert run_finals(finalists, run, THROUGHPUT, rounds=2, deadline=7.0, clock=clock) == 1
    assert calls == ["hat", "single", "hat"]
    winner = final_choice(finalists, THROUGHPUT)  # complete rounds only: hat's second figure is not counted
    assert winner is finalists[1]


def test_no_round_finished_leaves_the_choice_to_the_best_trial():
    clock = FakeClock()
    finalists = [entrant("hat", 50.0, trial_s=30.0, s=1), entrant("single", 49.0, trial_s=30.0, executor=0)]
    run, calls = runner(clock, {"hat": [1.0], "single": [1.0]})
    assert run_finals(finalists, run, THROUGHPUT, rounds=2, deadline=10.0, clock=clock) == 0
    assert calls == [] and final_choice(finalists, THROUGHPUT) is None


def test_final_runs_grow_into_half_the_time_left_up_to_the_most():
    finalists = [entrant("hat", 50.0, trial_s=3.0), entrant("single", 49.0, trial_s=3.0)]  # 12 s for 2 rounds
    # exact: Python float arithmetic on the test's own figures
    assert final_scale(finalists, 2, time_left=48.0) == 2.0  # half of 48 s over 12 s planned
    assert final_scale(finalists, 2, time_left=400.0) == FINAL_MOST_SCALE
    # exact: Python float arithmetic on the test's own figures
    assert final_scale(finalists, 2, time_left=10.0) == 1.0  # never shorter than the trials
    # exact: Python float arithmetic on the test's own figures
    assert final_scale([entrant("hat", 50.0, trial_s=0.0)], 2, time_left=100.0) == 1.0


def test_a_longer_setup_sizes_its_runs_longer_and_an_unsized_one_is_unchanged():
    from autohet.tuning.trainable import TrialSetup, TrialSizing

    sized = TrialSetup(None, None, "throughput", "m", 16, 0.5, 50, sizing=TrialSizing(3.0, 32, 10**6, 40.0))
    longer = sized.longer(4.0)
    assert longer.sizing.images_at(40.0) == 4 * sized.sizing.images_at(40.0) == 512  # 128 images -> 512
    # exact: Python float arithmetic on the test's own figures
    assert sized.sizing.target_s == 3.0 and sized.longer(1.0) is sized
    unsized = TrialSetup(None, None, "throughput", "m", 16, 0.5, 50)
    assert unsized.longer(4.0) is unsized


def fake_run(run_id: str, parent: str, value: float, final: float | None = None, status: str = "ok"):
    metrics = {TrialKey.THROUGHPUT: value}
    if final is not None:
        metrics[TrialKey.FINAL] = final
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id),
                           data=SimpleNamespace(metrics=metrics, params={},
                                                tags={"status": status, "mlflow.parentRunId": parent}))


def test_export_takes_the_finals_winner_of_the_tune_that_holds_the_best_trial():
    objectives = ObjectiveSet.parse("throughput")
    runs = [fake_run("a", "tune1", 100.0, final=90.0), fake_run("b", "tune1", 95.0, final=97.0),
            fake_run("c", "tune1", 80.0), fake_run("x", "tune0", 70.0, final=200.0),
            fake_run("bad", "tune1", 120.0, final=300.0, status="invalid")]
    assert final_pick(runs, objectives).info.run_id == "b"
    assert final_pick([r for r in runs if r.info.run_id != "b"], objectives).info.run_id == "a"
    no_finals = [fake_run("a", "tune2", 100.0), fake_run("x", "tune0", 70.0, final=200.0)]
    assert final_pick(no_finals, objectives) is None  # the best trial's tune held none: export takes it


def test_finals_settings_are_checked():
    settings = load_settings(None, {})
    assert (settings.finalists, settings.final_rounds, settings.final_within) == (3, 2, 0.15)
    for bad, message in (({"finalists": -1}, "finalists must be 0"), ({"final_rounds": 0}, "final_rounds must be"),
                         ({"final_within": 1.0}, "final_within must be a fraction")):
        with pytest.raises(UserError, match=message):
            load_settings(None, bad)


def test_a_finalist_is_expected_to_take_its_trials_seconds_less_its_acquiring():
    from autohet.tracking import CONFIG_TAG
    from autohet.tuning.finals import finalists_of

    run = fake_run("gpu", "tune1", 69728.0)
    run.data.metrics.update({TrialKey.TRIAL: 21.3, TrialKey.ACQUIRE: 16.7})
    run.data.tags.update({CONFIG_TAG: '{"strategy": "single", "single.executor": 0}', "strategy": "single"})
    no_config = fake_run("old", "tune1", 50000.0)  # logged before the config tag: not a candidate
    [f] = finalists_of([run, no_config, fake_run("bad", "tune1", 1e6, status="invalid")], THROUGHPUT)
    assert (f.run_id, f.strategy, f.config, f.trial_value) == ("gpu", "single", {"strategy": "single",
                                                                                 "single.executor": 0}, 69728.0)
    assert f.trial_s == pytest.approx(4.6)


def test_trials_sized_by_speed_from_the_pool_measured_first(monkeypatch) -> None:
    """``images: auto``: the trials' images come from the pool's measured speed (a local once shadowed
    the sizing function here and every such tune failed before its first trial)."""
    from types import SimpleNamespace

    from autohet.core.models import ModelSpec
    from autohet.tuning import sizing

    monkeypatch.setattr(sizing, "get_interruptibly", lambda value: value)
    monkeypatch.setattr(sizing, "output_classes", lambda model, pool: 10)
    manager = SimpleNamespace(calibrate=SimpleNamespace(remote=lambda seconds: 400.0))
    settings = load_settings(None, {})
    plan = sizing.size_trials(ModelSpec("lenet"), settings, SimpleNamespace(manager=manager), None)
    assert plan.sizing is not None and plan.sizing.base_ips == 400.0  # exact: the fake's own figure
    assert plan.images == plan.sizing.images(None) >= settings.min_images
    assert plan.deadline_s == settings.trial_timeout(plan.images, 400.0)  # exact: the same arithmetic
