"""Engine jobs are bounded like data-parallel runs: past the run's deadline a job is stopped and the
trial cut (RunTimeout), in this process and in the engine actor; a job in time returns its result."""

from __future__ import annotations

import threading
import time

import pytest

from autohet.engine import EngineJob
from autohet.engine.jobs import run_job
from autohet.errors import RunTimeout
from autohet.executors import ExecutorSpec

SPECS = [ExecutorSpec("cpu0", "cpu", (0,))]


class BlockedJob(EngineJob):
    """Waits until released: it cannot finish before any deadline, whatever the machine's speed."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def run(self, engine):
        self.release.wait()
        return {"devices": sorted(engine.devices)}


class SleepingJob(EngineJob):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, engine):
        time.sleep(self.seconds)
        return {"devices": sorted(engine.devices)}


def test_an_in_process_job_past_its_deadline_is_a_run_timeout_naming_the_strategy() -> None:
    release = threading.Event()
    try:
        with pytest.raises(RunTimeout, match="split did not finish within 0 s"):
            run_job(BlockedJob(release), SPECS, on_ray=False, deadline_s=0.2, what="split")
    finally:
        release.set()  # the abandoned thread ends and closes its engine


def test_a_job_in_time_returns_its_result_with_or_without_a_deadline() -> None:
    release = threading.Event()
    release.set()
    assert run_job(BlockedJob(release), SPECS, on_ray=False, deadline_s=60.0)["devices"] == ["cpu0", "host"]
    assert run_job(BlockedJob(release), SPECS, on_ray=False)["devices"] == ["cpu0", "host"]


@pytest.mark.ray
def test_the_engine_actor_is_stopped_past_the_deadline_and_the_next_job_gets_a_fresh_one(ray_local) -> None:
    with pytest.raises(RunTimeout, match="pipeline did not finish within 1 s .its engine was stopped"):
        run_job(SleepingJob(300.0), SPECS, on_ray=True, deadline_s=1.0, what="pipeline")
    assert run_job(SleepingJob(0.0), SPECS, on_ray=True, deadline_s=120.0)["devices"] == ["cpu0", "host"]
