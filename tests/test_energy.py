"""Energy and temperature: readers on fake sysfs trees and a fake NVML, the meter on a fake clock,
violations, the Pareto front and export by constraint on a small MLflow store, and one real
throughput,energy tune of LeNet on this machine (where energy is unavailable: the front is empty
and the trials say why)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from autohet.core.measurement import Measurement
from autohet.platform import sensors
from autohet.platform.meter import EnergyMeter
from autohet.platform.sensors import EnergyCounter, Gauge, Sources
from autohet.platform.thermal import wait_cool

REPO = Path(__file__).resolve().parents[1]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def power_counter(clock: Clock, profile: list[tuple[float, float]], name: str = "gpu0") -> EnergyCounter:
    """A cumulative counter (J) for a power profile [(until_s, watts), ...] read at the fake clock."""

    def read() -> float:
        joules, start = 0.0, 0.0
        for until, watts in profile:
            joules += watts * max(0.0, min(clock.t, until) - start)
            start = until
        return joules

    return EnergyCounter(name, read)


def zone(root: Path, name: str, label: str, energy_uj: int | None, max_uj: int | None = 1_000_000_000) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(label + "\n")
    if energy_uj is None:
        (path / "energy_uj").mkdir()  # reading it fails, as an unreadable file does (tests may run as root)
    else:
        (path / "energy_uj").write_text(f"{energy_uj}\n")
    if max_uj is not None:
        (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


# ---------------------------------------------------------------- readers


def test_rapl_reads_top_level_packages_across_a_wraparound_and_names_unreadable_zones(tmp_path):
    root = tmp_path / "powercap"
    pkg0 = zone(root, "intel-rapl:0", "package-0", 999_000_000)
    zone(root, "intel-rapl:0:0", "core", 5)  # a sub-zone: part of package 0, not counted again
    zone(root, "intel-rapl:1", "package-1", None)
    sources = sensors.rapl_counters(root)
    assert [c.name for c in sources.counters] == ["cpu_pkg0"]
    assert sources.counters[0].wrap_j == 1000.0  # exact: Python float arithmetic on the test's own figures
    assert "not readable" in sources.unavailable["energy_cpu_pkg1"]

    clock = Clock()
    meter = EnergyMeter(sources, clock=clock, interval_s=None).start()
    clock.t = 1.0
    (pkg0 / "energy_uj").write_text("1000000\n")  # 999 J -> 1 J: wrapped at 1000 J, so 2 J
    meter.sample()
    clock.t = 2.0
    (pkg0 / "energy_uj").write_text("3000000\n")
    meter.stop()
    result = meter.result(images=8, run_s=2.0)
    figures = result.metrics()
    assert figures["energy_j"] == pytest.approx(4.0) and figures["energy_cpu_pkg0_j"] == pytest.approx(4.0)
    assert figures["energy_j_per_image"] == pytest.approx(0.5) and figures["power_avg_w"] == pytest.approx(2.0)
    assert "energy_cpu_pkg1" in result.unavailable


def test_rapl_absent_or_empty_is_unavailable_with_the_reason(tmp_path):
    assert "no " + str(tmp_path / "none") in sensors.rapl_counters(tmp_path / "none").unavailable["energy_cpu"]
    (tmp_path / "empty").mkdir()
    assert "no RAPL package zone" in sensors.rapl_counters(tmp_path / "empty").unavailable["energy_cpu"]
    zone(tmp_path / "nowrap", "intel-rapl:0", "package-0", 10, max_uj=None)
    counter = sensors.rapl_counters(tmp_path / "nowrap").counters[0]
    with pytest.raises(ValueError, match="went backwards"):
        counter.delta(10.0, 5.0)


def test_nvml_absent_or_failing_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(sensors, "_NVML", {})
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as where nvidia-ml-py is not installed
    out = sensors.nvml_sources([0])
    assert not out.counters and "pynvml not installed" in out.unavailable["energy_gpu"]
    assert sensors.nvml_sources([]).unavailable == {}  # no GPU in the pool: nothing to say

    monkeypatch.setattr(sensors, "_NVML", {})
    broken = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("Driver Not Loaded")))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert "NVML did not start (RuntimeError: Driver Not Loaded)" in sensors.nvml_sources([0]).unavailable[
        "energy_gpu"]


class FakeNvml:
    """Two GPUs; the second has no energy counter (as before Volta)."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802 (NVML's names)
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:  # noqa: N802
        if h == 1:
            raise RuntimeError("Not Supported")
        return int(250_000 * self.clock.t)  # mJ: 250 W

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        return 250_000  # mW

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:  # noqa: N802
        return 60 + int(self.clock.t)

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:  # noqa: N802
        return 1980 - 100 * int(self.clock.t)


def test_nvml_counters_and_gauges_through_the_meter(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    clock = Clock()
    sources = sensors.nvml_sources([0, 1], nvml=FakeNvml(clock))
    assert [c.name for c in sources.counters] == ["gpu0"]
    assert "Not Supported" in sources.unavailable["energy_gpu1"]
    meter = EnergyMeter(sources, clock=clock, interval_s=None).start()
    clock.t = 2.0
    meter.sample()
    clock.t = 4.0
    meter.stop()
    figures = meter.result(images=100, run_s=4.0).metrics()
    assert figures["energy_gpu0_j"] == pytest.approx(1000.0) and figures["power_avg_w"] == pytest.approx(250.0)
    assert figures["power_gpu0_before_w"] == 250.0  # exact: Python float arithmetic on the test's own figures
    assert figures["temp_gpu0_before_c"] == 60 and figures["temp_gpu0_after_c"] == 64
    assert figures["temp_max_c"] == 64 and figures["temp_gpu1_max_c"] == 64
    assert figures["clock_gpu0_before_sm_mhz"] == 1980 and figures["clock_gpu0_min_sm_mhz"] == 1580


def test_psutil_temperatures_empty_or_per_chip():
    empty = sensors.psutil_temperatures(lambda: {})
    assert not empty.gauges and "is empty" in empty.unavailable["temp_host"]
    entry = SimpleNamespace
    found = sensors.psutil_temperatures(lambda: {"coretemp": [entry(current=50.0), entry(current=57.0)],
                                                   "nvme": [entry(current=40.0)], "acpitz": []})
    assert sensors.read_temperatures(found) == ({"coretemp": 57.0, "nvme": 40.0}, {})


# ---------------------------------------------------------------- the meter


def steady_run(clock: Clock, exclude: tuple[float, float] | None = None) -> EnergyMeter:
    """A strategy run: 10 s of search at 100 W, a 2 s timed part at 300 W, 1 s of output check at
    50 W; optionally a stretch excluded (a standalone measurement at 400 W inside the search)."""
    profile = [(3.0, 100.0), (5.0, 400.0 if exclude else 100.0), (10.0, 100.0), (12.0, 300.0), (13.0, 50.0)]
    meter = EnergyMeter(Sources([power_counter(clock, profile)]), clock=clock, interval_s=None).start()
    cut = None
    for step in range(1, 27):
        clock.t = step * 0.5
        if exclude and clock.t == exclude[0]:
            cut = meter.excluded()
            cut.__enter__()
        if exclude and clock.t == exclude[1]:
            cut.__exit__(None, None, None)
        meter.sample()
    meter.stop()
    return meter


def test_the_run_is_charged_its_busiest_stretch_not_the_search_around_it():
    result = steady_run(Clock()).result(images=100, run_s=2.0)
    figures = result.metrics()
    assert figures["energy_window_j"] == pytest.approx(1000 + 600 + 50) and figures["energy_window_s"] == 13.0
    assert figures["energy_j"] == pytest.approx(600.0)  # the 2 s at 300 W
    assert figures["energy_j_per_image"] == pytest.approx(6.0) and figures["power_avg_w"] == pytest.approx(300.0)
    assert steady_run(Clock()).result(images=100).metrics()["energy_j"] == pytest.approx(1650.0)  # no run_s


def test_a_run_shorter_than_the_counters_steps_is_charged_the_busiest_seconds_average_power():
    """NVML's counter moves in steps: a 50 ms run read alone could hold a whole 100 ms step (2x)."""
    clock = Clock()
    stepped = EnergyCounter("gpu0", lambda: 10.0 * int(clock.t / 0.1 + 1e-9))  # 100 W, a 10 J step per 0.1 s
    meter = EnergyMeter(Sources([stepped]), clock=clock, interval_s=None).start()
    for step in range(1, 101):
        clock.t = step * 0.02
        meter.sample()
    meter.stop()
    figures = meter.result(images=50, run_s=0.05).metrics()
    assert figures["power_avg_w"] == pytest.approx(100.0, rel=0.15)
    assert figures["energy_j"] == pytest.approx(5.0, rel=0.15)


def test_an_excluded_stretch_is_cut_out_of_the_window_and_never_charged():
    result = steady_run(Clock(), exclude=(3.0, 5.0)).result(images=100, run_s=2.0)
    figures = result.metrics()
    assert figures["energy_window_s"] == pytest.approx(11.0)
    assert figures["energy_window_j"] == pytest.approx(800 + 600 + 50)  # the 800 J at 400 W are not the run's
    assert figures["energy_j"] == pytest.approx(600.0)


def test_without_samples_the_run_gets_the_window_average_power():
    clock = Clock()
    meter = EnergyMeter(Sources([power_counter(clock, [(10.0, 100.0)])]), clock=clock, interval_s=None).start()
    clock.t = 10.0
    meter.stop()
    assert meter.result(images=10, run_s=4.0).metrics()["energy_j"] == pytest.approx(400.0)


def test_nothing_readable_is_unavailable_never_zero():
    meter = EnergyMeter(Sources(unavailable={"energy_cpu": "no /sys/class/powercap"}), interval_s=0.01)
    with meter:
        pass
    result = meter.result(images=100, run_s=1.0)
    assert meter._thread is None  # nothing to sample: no thread
    assert not {k for k in result.metrics() if k.startswith(("energy", "power"))}
    assert result.unavailable["energy_cpu"] == "no /sys/class/powercap" and "energy_j" in result.unavailable
    assert "temp" in result.unavailable


def test_the_sampling_thread_tracks_the_max_temperature_and_stops():
    temps = iter([40.0, 70.0] + [55.0] * 10_000)
    meter = EnergyMeter(Sources(gauges=[Gauge("temp_c", lambda: {"gpu0": next(temps)})]), interval_s=0.001)
    with meter:
        deadline = time.monotonic() + 60  # the thread samples every 1 ms: a minute is a stuck thread, not a slow one
        while (meter.result(0).temp_max_c or 0.0) < 70:  # the thread's sample
            assert time.monotonic() < deadline, "the sampling thread took no second sample within 60 s"
            time.sleep(0.001)  # wait for it without holding the GIL in a spin
    assert not meter._thread.is_alive()
    # exact: Python float arithmetic on the test's own figures
    assert meter.result(0).metrics()["temp_gpu0_max_c"] == 70.0


def test_a_counter_failing_mid_run_is_dropped_with_the_reason():
    clock = Clock()
    calls = iter([1.0, 2.0])
    meter = EnergyMeter(Sources([EnergyCounter("gpu0", lambda: next(calls))]), clock=clock, interval_s=None)
    meter.start()
    clock.t = 1.0
    meter.sample()
    clock.t = 2.0
    meter.stop()  # the third read raises StopIteration
    result = meter.result(10, 1.0)
    assert "energy_j" not in result.metrics() and "failed during the run" in result.unavailable["energy_gpu0"]


def test_wait_cool_waits_for_the_margin_caps_and_skips_without_sensors():
    clock = Clock()
    readings = iter([90.0, 85.0, 78.0, 74.0, 99.0])
    sources = Sources(gauges=[Gauge("temp_c", lambda: {"gpu0": next(readings)})])
    cooled = wait_cool(sources, below_c=75.0, cap_s=60.0, clock=clock, sleep=clock.sleep, poll_s=1.0)
    # exact: Python float arithmetic on the test's own figures
    assert (cooled.waited_s, cooled.temp_c, cooled.note) == (3.0, 74.0, None)

    clock = Clock()
    hot = Sources(gauges=[Gauge("temp_c", lambda: {"gpu0": 90.0})])
    capped = wait_cool(hot, below_c=75.0, cap_s=5.0, clock=clock, sleep=clock.sleep, poll_s=1.0)
    # exact: Python float arithmetic on the test's own figures
    assert capped.waited_s == 5.0 and "still 90 C after 5 s" in capped.note

    none = wait_cool(Sources(unavailable={"temp_host": "psutil.sensors_temperatures() is empty"}), 75.0,
                     60.0, clock=clock, sleep=clock.sleep)
    # exact: Python float arithmetic on the test's own figures
    assert none.waited_s == 0.0 and "no temperature readable (temp_host: psutil" in none.note


# ---------------------------------------------------------------- runs, statuses


def lenet_ctx(images: int = 300, mode: str = "throughput"):
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload, WorkloadSpec

    return RunContext(ModelSpec("lenet"), Workload.from_spec(WorkloadSpec(images, (1, 28, 28))), check_images=8,
                      standalone_seconds=0.05, mode=mode, latency_runs=10)


def test_every_run_through_run_strategy_carries_its_energy_or_why_not():
    from autohet.commands.run import report
    from autohet.pool import LocalPool, load_pool
    from autohet.strategy_run import energy_sources, run_strategy
    from autohet.tuning.trainable import trial_metrics

    clock = Clock()

    def joules() -> float:  # 200 W on the meter's own clock: each read is one more fake second
        clock.sleep(1.0)
        return 200.0 * clock.t

    counter = EnergyCounter("gpu0", joules)
    meter = EnergyMeter(Sources([counter], unavailable={"energy_cpu": "no /sys/class/powercap"}), clock=clock,
                        interval_s=None)
    pool = LocalPool(load_pool(str(REPO / "actors/cpu2.yaml")))
    try:
        m = run_strategy("hat", {}, pool, lenet_ctx(), meter=meter)
        assert m.output_ok
        energy = m.extra["energy"]
        assert energy["energy_j_per_image"] == pytest.approx(energy["energy_j"] / m.images)
        assert energy["power_avg_w"] == pytest.approx(200.0)  # exact: the run's span cut from a constant 200 W
        assert m.extra["unavailable"]["energy_cpu"] == "no /sys/class/powercap"
        metrics = trial_metrics(m)
        assert metrics["energy_j_per_image"] == energy["energy_j_per_image"] and "energy_gpu0_j" in metrics
        shown = report(m)
        assert " J/image, " in shown and "(gpu0 " in shown
        assert "not measured: energy_cpu: no /sys/class/powercap" in shown

        latency = run_strategy("single", {"executor": 0}, pool, lenet_ctx(mode="latency"))  # this host's sources
        here = energy_sources(pool.spec)
        if here.counters:
            assert latency.extra["energy"]["energy_j_per_request"] > 0
        else:  # this container: nothing readable, every reason recorded, no energy figure at all
            assert "energy_j_per_image" not in latency.extra["energy"]
            assert set(here.unavailable) <= set(latency.extra["unavailable"])
            assert latency.extra["unavailable"]["energy_j"]
    finally:
        pool.shutdown()


def test_pool_sources_skip_simulated_pools_and_name_remote_nodes(monkeypatch):
    from dataclasses import replace

    from autohet.pool import load_pool
    from autohet.strategy_run import energy_sources
    from autohet.testing import sim_pool_spec

    sim = energy_sources(sim_pool_spec([100.0, 50.0]))
    assert not sim.counters and "simulated pool" in sim.unavailable["energy_j"]
    asked = []
    monkeypatch.setattr("autohet.strategy_run.default_sources", lambda gpus: asked.append(gpus) or Sources())
    spec = load_pool(str(REPO / "actors/cpu2.yaml"))
    remote = replace(spec, executors=[spec.executors[0], replace(spec.executors[1], node="node-b")])
    assert "executors on node-b are not read" in energy_sources(remote).unavailable["energy_remote"]
    assert asked == [[]]  # no GPU in the pool: NVML is not asked about any


def measurement(ok: bool = True, temp: float | None = None, violation: str | None = None) -> Measurement:
    extra = {"energy": {} if temp is None else {"temp_max_c": temp}}
    if violation:
        extra["violation"] = violation
    return Measurement("lenet", "hat", {}, 10, 1.0, 10.0, 12.0, 0.8, ok, 0.0, 1e-3, [],
                       failures=[] if ok else ["outputs differ"], extra=extra)


def test_a_trial_past_a_bound_is_a_violation_with_the_worst_objective_values():
    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning.trainable import objective_metrics, trial_status

    assert trial_status(measurement(temp=85.0), 80.0)[0] == "violation"
    assert "85.0 C" in trial_status(measurement(temp=85.0), 80.0)[1]
    assert trial_status(measurement(temp=85.0), None) == ("ok", None)
    assert trial_status(measurement(temp=None), 80.0) == ("ok", None)  # unreadable: not a violation
    assert trial_status(measurement(violation="split: GPU at 92 C"), None) == ("violation", "split: GPU at 92 C")
    assert trial_status(measurement(ok=False, temp=95.0), 80.0)[0] == "invalid"
    objectives = ObjectiveSet.parse("throughput,energy")
    worst = objective_metrics({"status": "violation", "throughput_ips": 1e6, "energy_j_per_image": 1e-6},
                              objectives)
    assert worst == {"objective.throughput": 0.0, "objective.energy": 1e12, "objective_value": 0.0}


def test_settings_take_max_temp_and_refuse_nonsense():
    from autohet.core.errors import UserError
    from autohet.tuning.settings import load_settings

    settings = load_settings(str(REPO / "conf/default.yaml"), {"max_temp": 80, "objective": "latency,energy"})
    # exact: Python float arithmetic on the test's own figures
    assert settings.max_temp == 80.0 and settings.cool_margin_c == 5.0 and settings.objectives.mode == "latency"
    with pytest.raises(UserError, match="max_temp must be between"):
        load_settings(str(REPO / "conf/default.yaml"), {"max_temp": -3})


# ---------------------------------------------------------------- front, tags, export


# (strategy, img/s, watts, status): energy per image = watts / img/s
TRIALS = [("static", 100.0, 50.0, "ok"), ("quick", 200.0, 160.0, "ok"), ("chunk", 300.0, 330.0, "ok"),
          ("fifo", 150.0, 300.0, "ok"), ("hat", 250.0, 500.0, "ok"), ("single", 50.0, 20.0, "ok"),
          ("fast_split", 400.0, 40.0, "violation"), ("hat", 500.0, 10.0, "invalid")]


def fake_result(strategy: str, ips: float, watts: float, status: str, index: int) -> dict:
    """A trial's result as the trainable builds it, its energy read by a meter on a fake counter."""
    from autohet.config import RunConfig
    from autohet.core.models import ModelSpec
    from autohet.core.objectives import ObjectiveSet
    from autohet.pool import load_pool
    from autohet.tuning.trainable import objective_metrics

    clock, images = Clock(), 200
    run_s = images / ips
    meter = EnergyMeter(Sources([power_counter(clock, [(run_s, watts)])], unavailable={"energy_cpu": "no RAPL"}),
                        clock=clock, interval_s=None).start()
    clock.t = run_s
    meter.stop()
    energy = meter.result(images, run_s).metrics()
    config = RunConfig(ModelSpec("lenet"), load_pool(str(REPO / "actors/cpu2.yaml")), strategy, {}, images=images,
                       objective="throughput,energy", measured={"throughput_ips": ips, "output_ok": True, **energy})
    result = {"status": status, "strategy": strategy, "throughput_ips": ips, "wall_s": run_s, **energy,
              "unavailable": {"energy_cpu": "no RAPL"}, "config_yaml": yaml.safe_dump(config.to_dict()),
              "params_json": "{}"}
    if status != "ok":
        result["error"] = f"{status} for the test"
    result.update(objective_metrics(result, ObjectiveSet.parse("throughput,energy")))
    return result


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory) -> str:
    """One MLflow store for the module (making one costs seconds): each test has its own experiment."""
    return f"sqlite:///{tmp_path_factory.mktemp('runs') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def tune_store(mlflow_db, tmp_path_factory):
    """A tune of TRIALS in an MLflow store, recorded as the tuner records one (made once: the tests
    read it; the export test writes only its own YAML files beside it)."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.tracking import TrialLogger, ensure_experiment, mlflow_client, record_outcome

    path = tmp_path_factory.mktemp("pareto")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path)
        client = mlflow_client(mlflow_db)
        exp_id = ensure_experiment(client, "pareto", mlflow_db)
        parent = client.create_run(exp_id, run_name="tune", tags={"autohet_kind": "tune"}).info.run_id
        client.log_param(parent, "objective", "throughput,energy")
        logger = TrialLogger(mlflow_db, exp_id, parent, {})
        ids = [logger.log(i + 1, {"strategy": s}, fake_result(s, ips, w, st, i)) for i, (s, ips, w, st) in
               enumerate(TRIALS)]
        outcome = record_outcome(client, "pareto", exp_id, parent, ObjectiveSet.parse("throughput,energy"),
                                 path / "runs" / "pareto", {"cpu_model": "test"})
    return SimpleNamespace(uri=mlflow_db, client=client, parent=parent, ids=ids, outcome=outcome, path=path)


@pytest.fixture
def store(tune_store, monkeypatch):
    monkeypatch.chdir(tune_store.path)
    return tune_store


def test_the_front_is_tagged_plotted_and_never_holds_a_violation(store):
    client, ids = store.client, store.ids
    on_front = {ids[i] for i, run_id in enumerate(ids) if client.get_run(run_id).data.tags.get("pareto") == "true"}
    # J/img: static 0.5, quick 0.8, chunk 1.1, fifo 2.0, hat 2.0, single 0.4; fifo and hat are dominated
    assert on_front == {ids[0], ids[1], ids[2], ids[5]}
    assert [r["strategy"] for r in store.outcome.front] == ["chunk", "quick", "static", "single"]
    assert store.outcome.front[0]["energy"] == pytest.approx(1.1)
    assert store.outcome.front_note is None
    assert {"pareto.png", "best.yaml", "comparison.png"} <= {a.path for a in client.list_artifacts(store.parent)}
    best = yaml.safe_load((store.path / "runs" / "pareto" / "best.yaml").read_text())
    assert best["mlflow"]["run_id"] == ids[2]  # chunk: the fastest ok trial, not the violation or the invalid one
    violation = client.get_run(ids[6])
    assert violation.data.tags["status"] == "violation" and violation.data.metrics["objective.energy"] == 1e12
    assert violation.data.tags["unavailable.energy_cpu"] == "no RAPL"


def test_export_picks_a_front_point_by_constraint_and_it_reruns(store, capsys):
    from autohet.cli import main

    base = ["export", "--experiment", "pareto", "--tracking-uri", store.uri]
    assert main([*base, "--max-watts", "200", "--out", "low.yaml"]) == 0  # quick: 200 img/s at 160 W
    assert f"run {store.ids[1]}: 200 img/s, 160 W" in capsys.readouterr().out
    assert yaml.safe_load((store.path / "low.yaml").read_text())["strategy"] == "quick"
    assert main([*base, "--max-watts", "400", "--min-ips", "120", "--out", "mid.yaml"]) == 0
    assert yaml.safe_load((store.path / "mid.yaml").read_text())["mlflow"]["run_id"] == store.ids[2]

    assert main([*base, "--max-watts", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autohet: error: no ok trial of experiment pareto meets --max-watts 5: best "
                          "achievable: 20 W for --max-watts") and len(err.splitlines()) == 1
    assert main([*base, "--max-watts", "60", "--min-ips", "250"]) == 2
    assert "best achievable: 20 W for --max-watts, 300 img/s for --min-ips (each on its own" in \
        capsys.readouterr().err
    assert main([*base, "--max-ms", "5"]) == 2
    assert "measured latency_p50_ms (a throughput,energy tune times no batch-1 requests" in capsys.readouterr().err
    assert main([*base, "--max-watts", "200", "--run-id", store.ids[0]]) == 2
    assert main([*base, "--run-id", store.ids[6]]) == 2
    assert "is violation, not a valid result" in capsys.readouterr().err

    assert main(["run", "--config", "low.yaml", "--in-process", "--json", "--images", "200"]) == 0
    rerun = json.loads(capsys.readouterr().out)
    assert rerun["strategy"] == "quick" and rerun["output_ok"] is True and "energy" in rerun["extra"]


def test_no_front_where_energy_was_never_measured_and_the_note_says_why(tmp_path, monkeypatch, mlflow_db):
    from autohet.core.objectives import ObjectiveSet
    from autohet.tracking import TrialLogger, ensure_experiment, mlflow_client, record_outcome

    monkeypatch.chdir(tmp_path)
    uri = mlflow_db
    client = mlflow_client(uri)
    exp_id = ensure_experiment(client, "cpu", uri)
    parent = client.create_run(exp_id, tags={"autohet_kind": "tune"}).info.run_id
    logger = TrialLogger(uri, exp_id, parent, {})
    for i in range(3):
        result = {k: v for k, v in fake_result("hat", 100.0 + i, 50.0, "ok", i).items()
                  if not k.startswith(("energy", "power", "objective"))}
        result["unavailable"] = {"energy_cpu": "no /sys/class/powercap"}
        logger.log(i + 1, {"strategy": "hat"}, result)
    outcome = record_outcome(client, "cpu", exp_id, parent, ObjectiveSet.parse("throughput,energy"),
                             tmp_path / "cpu", {})
    assert outcome.front == [] and "energy (energy_j_per_image) was measured in no ok trial" in outcome.front_note
    assert "energy_cpu: no /sys/class/powercap" in outcome.front_note
    assert client.get_run(parent).data.tags["pareto"] == outcome.front_note
    assert "pareto.png" not in {a.path for a in client.list_artifacts(parent)}


# ---------------------------------------------------------------- a real tune


@pytest.mark.ray
@pytest.mark.slow
def test_a_throughput_energy_tune_on_this_machine_finishes_and_says_what_it_could_not_measure(tmp_path):
    from mlflow.tracking import MlflowClient

    from autohet.pool import load_pool
    from autohet.strategy_run import energy_sources
    from tests.test_tune import pinned_spaces

    spaces = pinned_spaces(tmp_path)
    conf = {"trials": 4, "time_budget_s": 600, "images": 1000, "standalone_seconds": 0.1, "check_images": 8,
            "search_spaces": str(spaces), "pool": str(REPO / "actors/cpu2.yaml"), "cool_max_s": 1}
    (tmp_path / "conf.yaml").write_text(yaml.safe_dump(conf))
    env = dict(os.environ, PYTHONPATH=str(REPO), AUTOHET_PLUGINS="", RAY_TMPDIR="/tmp")
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "autohet.cli", "tune", "--model", "lenet", "--conf", "conf.yaml",
                           "--objective", "throughput,energy", "--experiment", "pe", "--max-temp", "80"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pe")
    trials = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'trial'")
    parent = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'tune'")[0]
    assert len(trials) == 4 and parent.data.params["objective"] == "throughput,energy"
    assert parent.data.params["max_temp"] == "80.0"
    ok = [r for r in trials if r.data.tags["status"] == "ok"]
    assert ok and (tmp_path / "runs" / "pe" / "best.yaml").is_file()
    for run in trials:
        assert {"objective.throughput", "objective.energy", "objective_value"} <= set(run.data.metrics)
    sources = energy_sources(load_pool(str(REPO / "actors/cpu2.yaml")))
    if sources.counters:  # a machine that reads energy: a real front
        assert all("energy_j_per_image" in r.data.metrics for r in ok)
        assert any(r.data.tags.get("pareto") == "true" for r in ok) and "Pareto front (throughput, energy)" in \
            proc.stdout
        return
    # this container: energy unavailable in every trial, with its reason; the front is empty and says why
    assert "no energy counter readable here" in proc.stderr
    for run in ok:
        assert "energy_j_per_image" not in run.data.metrics and run.data.metrics["objective.energy"] == 1e12
        reasons = {k: v for k, v in run.data.tags.items() if k.startswith("unavailable.energy")}
        assert reasons and all(reasons.values()), run.data.tags
        assert set(sources.unavailable) <= {k.split(".", 1)[1] for k in run.data.tags if k.startswith("unavail")}
        assert run.data.tags.get("pareto") is None
    assert "no Pareto front: energy (energy_j_per_image) was measured in no ok trial" in proc.stdout
    assert parent.data.tags["pareto"].startswith("no Pareto front")
    if not sensors.read_temperatures(sources)[0]:
        assert "--max-temp 80: no temperature readable here" in proc.stderr
        assert all("no temperature readable" in r.data.tags["unavailable.cooling"] for r in trials)
