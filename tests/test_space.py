"""search_spaces YAML -> Optuna define-by-run: conditional parameters, ranges, errors."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from autohet.core.errors import UserError
from autohet.core.objectives import RunMode
from autohet.pool import load_pool
from autohet.tuning.initial import initial_points
from autohet.tuning.space import OPTUNA_TRIAL_KEY, DefineByRun, SearchSpace, SpaceContext, load_search_space


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path


def test_repo_spaces_cover_every_registered_data_parallel_strategy():
    space = load_search_space("search_spaces")
    assert {"single", "static", "quick", "chunk", "hat", "fifo", "fast_split"} <= set(space.strategies)
    assert "batch" in space.executors["cpu"] and "precision" in space.executors["gpu"]


def test_define_by_run_suggests_strategy_first_then_only_its_params():
    space = load_search_space("search_spaces")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    define = DefineByRun(space, SpaceContext({"executors": 3}, frozenset({"cpu"}), pool_dims=True))
    seen = set()
    for _ in range(120):
        trial = study.ask()
        assert define(trial) == {OPTUNA_TRIAL_KEY: trial.number}  # ties the Tune trial to the Optuna one
        strategy = trial.params["strategy"]
        seen.add(strategy)
        own = {k for k in trial.params if "." in k and not k.startswith(("exec.", "pool."))}
        assert all(k.startswith(strategy + ".") for k in own)
        expected = set()
        for name, dim in space.strategies[strategy].items():
            if dim.when is not None and trial.params.get(f"{strategy}.{dim.when[0]}") != dim.when[1]:
                continue  # gated off in this trial
            if dim.type == "weights":
                expected |= {f"{strategy}.{name}_{i}" for i in range(3)}
            elif dim.vector:
                continue  # sized by the model or the in-process devices: this context gives no length
            else:
                expected.add(f"{strategy}.{name}")
        assert own == expected
        assert "exec.cpu.batch" in trial.params and "exec.gpu.batch" not in trial.params
        if strategy == "fast_split":
            w_s, r = space.strategies["fast_split"]["w_s"], space.strategies["fast_split"]["r"]
            assert w_s.low <= trial.params["fast_split.w_s"] <= w_s.high
            assert r.low <= trial.params["fast_split.r"] <= r.high
        if strategy == "single":
            assert trial.params["single.executor"] in (0, 1, 2)
        if strategy == "static":
            assert {"static.ratios_0", "static.ratios_1", "static.ratios_2"} <= set(trial.params)
        study.tell(trial, 1.0)
    assert seen == set(space.strategies)


def test_decode_round_trip():
    strategy, params, execs, pool = SearchSpace.decode({
        "strategy": "static", "static.ratios_1": 0.5, "static.ratios_0": 0.25, "exec.cpu.batch": 16,
        "pool.cpu_group_size": 2, "fifo.c": 9})
    assert strategy == "static" and params == {"ratios": [0.25, 0.5]}
    assert execs == {"cpu": {"batch": 16}} and pool == {"cpu_group_size": 2}


def test_initial_points_hold_single_per_device_kind_and_strategy_defaults():
    from autohet.tuning.initial import CPU_VARIANTS

    space = load_search_space("search_spaces")
    points = initial_points(space, load_pool("actors/cpu2.yaml"))
    singles = [p for p in points if p["strategy"] == "single"]
    assert points[: len(singles)] == singles and all(p["single.executor"] == 0 for p in singles)
    # then the group at its other batch choices, the largest first (filled with the best variant later)
    own = singles[0]["exec.cpu.batch"]
    assert [p["exec.cpu.batch"] for p in singles[-2:]] == sorted({4, 16, 64} - {own}, reverse=True)
    singles = singles[:-2]
    assert {p["exec.cpu.batch"] for p in singles} == {own}
    # each CPU backend and precision, the fastest known first, the pool file's own setting last
    ran = [tuple(p[f"exec.cpu.{k}"] for k in ("backend", "precision", "channels_last", "streams")) for p in singles]
    in_space = [v for v in CPU_VARIANTS if space.executors["cpu"]["backend"].contains(v.backend)]
    assert ran == [*in_space, ("eager", "fp32", False, 0)] and len(in_space) >= 6
    assert {p["strategy"] for p in points} == set(space.strategies)
    fast = next(p for p in points if p["strategy"] == "fast_split")
    # a CPU-only pool's fixed sizes count batches, one each: the tail is one batch (data_parallel.PoolMix.CPU_GROUPS)
    assert (fast["fast_split.w_s"], fast["fast_split.unit"], fast["exec.cpu.batch"]) == (1, "batches", 64)
    fifo = next(p for p in points if p["strategy"] == "fifo")
    assert (fifo["fifo.c"], fifo["fifo.unit"]) == (1, "batches")


def test_the_cpu_singles_of_an_auto_pool_run_one_group_of_every_core(monkeypatch):
    import autohet.pool.spec as pool_spec_module
    from autohet.tuning.initial import staged_points

    monkeypatch.setattr(pool_spec_module.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    monkeypatch.setattr(pool_spec_module, "_local_gpus", lambda: 0)
    space = load_search_space("search_spaces")
    first = staged_points(space, load_pool("actors/auto.yaml"))
    assert all(p["pool.cpu_group_size"] == "all" and p["single.executor"] == 0 for p in first.singles)
    assert all(p["pool.cpu_group_size"] == 1 for p in first.strategies)  # the pool's own groups, to split over
    # the split probe: fifo over those groups, as stage two runs it (filled per close variant later)
    fifo = next(p for p in first.strategies if p["strategy"] == "fifo")
    assert first.probes == [fifo] and first.later()[0].per_close_cpu  # then the strategies, then the batches
    assert first.later()[2].points == first.batches
    assert staged_points(space, load_pool("actors/auto.yaml"), mode=RunMode.LATENCY).probes == []
    # an explicit pool's singles ran on a group of the size the strategies split over: nothing to probe
    assert staged_points(space, load_pool("actors/cpu2.yaml")).probes == []


def test_stage_two_runs_each_kind_at_its_best_singles_settings():
    """StagedSearch enqueues the strategies only once every single reported, with the best single's
    executor settings; a single that is not ok never sets them."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning.initial import Stage
    from autohet.tuning.search import SingleKind, StagedSearch
    from autohet.tuning.space import DefineByRun, SpaceContext

    space = load_search_space("search_spaces").restrict(["fifo"], RunMode.THROUGHPUT)
    pool = load_pool("actors/cpu2.yaml")
    ctx = SpaceContext({"executors": 2}, frozenset({"cpu"}))
    first = [{"strategy": "single", "single.executor": 0, "exec.cpu.backend": b, "exec.cpu.batch": 16,
              "exec.cpu.precision": "fp32", "exec.cpu.channels_last": False, "exec.cpu.streams": 0}
             for b in ("openvino", "onnxruntime", "eager")]
    later = [{"strategy": "fifo", "fifo.c": 128, "exec.cpu.backend": "eager", "exec.cpu.batch": 64}]
    search = StagedSearch(DefineByRun(space, ctx), metric="objective_value", mode="max", points_to_evaluate=first,
                          later=[Stage(later)], kind_of=SingleKind(pool), objectives=ObjectiveSet.parse("throughput"),
                          seed=0)
    figures = {"openvino": ("ok", 90.0), "onnxruntime": ("invalid", 500.0), "eager": ("ok", 40.0)}
    configs = [search.suggest(f"t{n}") for n in range(3)]
    for n, config in enumerate(configs):
        assert config["strategy"] == "single"
        assert search.suggest("early") is None  # stage two waits for every single's figure
        status, value = figures[config["exec.cpu.backend"]]
        search.on_trial_complete(f"t{n}", {"status": status, "objective_value": value})
    stage_two = search.suggest("t3")
    assert stage_two["strategy"] == "fifo" and stage_two["fifo.c"] == 128
    assert (stage_two["exec.cpu.backend"], stage_two["exec.cpu.batch"]) == ("openvino", 16)
    assert search.best["cpu"][0] == 90.0  # exact: a fake trial's figure
    # suggested, not reported yet (``run_search`` logs it at the end)
    assert [(trial_id, config) for trial_id, config, _ in search.unreported()] == [("t3", stage_two)]
    search.on_trial_complete("t3", None)  # stopped at the budget: no result
    assert [config for _, config, _ in search.unreported()] == [stage_two]


def test_a_trial_stopped_at_the_search_budget_is_logged_as_cut_with_where_its_seconds_went() -> None:
    """A two-GPU vgg16 tune logged no trial in its last 100 s and said nothing of why (BENCHMARKS.md 47): a trial
    still running at the search's budget was stopped and logged nowhere. Now it is logged, cut, with its seconds
    and what the pool manager was doing for it; one already logged (a crash, as ``error``) is not logged again."""
    from autohet.core.objectives import PRIMARY_METRIC, ObjectiveSet, TrialKey
    from autohet.tuning import study

    def stopped_trials(*args: Any) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        return study.stopped_trials(*args, ObjectiveSet.parse("throughput"))

    fifo = {"strategy": "fifo", "pool.cpu_group_size": 2, "fifo.c": 4, "exec.gpu.batch": 256}
    acquiring = {"doing": "acquiring executors: starting the topology gpu0, gpu1, cpu0, cpu1 and 13 more (15 new)",
                 "for_s": 91.6}
    [(trial_id, config, result)] = stopped_trials([("t22", fifo, 1000.0), ("t9", {}, 900.0)], {"t9"}, acquiring,
                                                  1095.4)
    assert (trial_id, config, result["status"], result["strategy"]) == ("t22", fifo, "cut", "fifo")
    assert result[TrialKey.TRIAL] == pytest.approx(95.4)
    assert result[PRIMARY_METRIC] == 0.0  # exact: the worst value any trial not ok is logged with
    assert result["error"] == (
        "a fifo trial (cpu_group_size=2; gpu batch=256) was stopped at the search's time budget after 95 s, not "
        "measured: the pool manager had been acquiring executors: starting the topology gpu0, gpu1, cpu0, cpu1 and 13 "
        "more (15 new) for its last 92 s")
    ran = stopped_trials([("t1", {}, 0.0)], set(), {"after": "acquire", "idle_s": 40.0}, 50.0)[0][2]["error"]
    assert ran.startswith("a ? trial (the pool as it is; the executors as they are) was stopped") and ran.endswith(
        "its run went on for its last 40 s, after the pool manager's acquire returned")
    # the manager's last call returned before this trial began: it never got as far as asking for executors
    single = {"strategy": "single", "single.executor": 0, "exec.cpu.backend": "onnxruntime", "exec.cpu.batch": 16,
              "exec.gpu.batch": 256}
    early = stopped_trials([("t1", single, 0.0)], set(), {"after": "acquire", "idle_s": 60.0}, 50.0)[0][2]["error"]
    assert early.startswith("a single trial (the pool as it is; cpu backend=onnxruntime, batch=16; gpu batch=256) was")
    assert early.endswith("it had not asked the pool manager for anything")
    silent = stopped_trials([("t1", {}, 0.0)], set(), None, 5.0)[0][2]["error"]
    assert silent.endswith("the pool manager did not answer what it was doing")


def test_the_batch_stage_runs_the_best_variant_at_each_batch_and_hands_the_winner_on():
    """The CPU group's batch points wait for the variants, run at the best variant's settings with their
    own batch, and the strategies after them on groups of that size get the batch that won (not the
    variants' 16); a strategy on groups of another size keeps its own batch."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning.initial import Stage
    from autohet.tuning.search import SingleKind, StagedSearch
    from autohet.tuning.space import DefineByRun, SpaceContext

    space = load_search_space("search_spaces").restrict(["fifo"], RunMode.THROUGHPUT)
    pool = load_pool("actors/cpu2.yaml")
    ctx = SpaceContext({"executors": 2}, frozenset({"cpu"}), pool_dims=True)
    base = {"strategy": "single", "single.executor": 0, "exec.cpu.batch": 16, "exec.cpu.precision": "fp32",
            "exec.cpu.channels_last": False, "exec.cpu.streams": 0, "exec.cpu.backend": "eager",
            "pool.cpu_group_size": 2, "pool.gpu_partitions": 1}
    first = [{**base, "exec.cpu.backend": b} for b in ("onnxruntime", "eager")]
    batches = [{**base, "exec.cpu.batch": b} for b in (64, 4)]
    fifo = {"strategy": "fifo", "fifo.c": 128, "exec.cpu.backend": "eager", "exec.cpu.batch": 16,
            "pool.gpu_partitions": 1}
    later = [Stage(batches, frozenset({"exec.cpu.batch"})),
             Stage([{**fifo, "pool.cpu_group_size": 2}, {**fifo, "pool.cpu_group_size": 1}])]
    search = StagedSearch(DefineByRun(space, ctx), metric="objective_value", mode="max", points_to_evaluate=first,
                          later=later, kind_of=SingleKind(pool), objectives=ObjectiveSet.parse("throughput"),
                          seed=0)
    figures = {("onnxruntime", 16): 40.0, ("eager", 16): 20.0, ("onnxruntime", 64): 48.0, ("onnxruntime", 4): 30.0}
    for n in range(4):
        config = search.suggest(f"t{n}")
        assert config["strategy"] == "single"
        if n in (1, 3):
            assert search.suggest("early") is None  # each stage waits for the one before
        search.on_trial_complete(f"t{n}", {"status": "ok", "objective_value": figures[
            (config["exec.cpu.backend"], config["exec.cpu.batch"])]})
    same, other = search.suggest("t4"), search.suggest("t5")
    assert same["strategy"] == other["strategy"] == "fifo"
    assert (same["pool.cpu_group_size"], same["exec.cpu.backend"], same["exec.cpu.batch"]) == (2, "onnxruntime", 64)
    assert (other["pool.cpu_group_size"], other["exec.cpu.backend"], other["exec.cpu.batch"]) == (
        1, "onnxruntime", 16)
    assert search.best["cpu"][0] == 48.0  # exact: a fake trial's figure


def _gpu_walk_search(figures: dict[int, float]) -> list[dict]:
    """The configs a StagedSearch suggests on two GPUs: the GPU single at 256, the batch walk over 64-512,
    then fifo; each single's figure by its batch (``figures``)."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.executors import ExecutorSpec
    from autohet.pool import PoolSpec
    from autohet.tuning.initial import Stage, batch_walk
    from autohet.tuning.search import SingleKind, StagedSearch
    from autohet.tuning.space import DefineByRun, SpaceContext

    space = load_search_space("search_spaces").restrict(["fifo"], RunMode.THROUGHPUT)
    pool = PoolSpec("gpus", [ExecutorSpec(f"gpu{i}", "gpu", (i,), gpu=i, batch=256, precision="fp16")
                             for i in range(2)])
    ctx = SpaceContext({"executors": 2}, frozenset({"gpu"}))
    base = {"strategy": "single", "single.executor": 0, "exec.gpu.backend": "inductor", "exec.gpu.batch": 256}
    batches = [{**base, "exec.gpu.batch": b, "exec.gpu.backend": "eager"} for b in (64, 128, 512)]
    fifo = {"strategy": "fifo", "fifo.c": 4, "exec.gpu.backend": "eager", "exec.gpu.batch": 256}
    search = StagedSearch(DefineByRun(space, ctx), metric="objective_value", mode="max", points_to_evaluate=[base],
                          later=[*batch_walk(batches, 256), Stage([fifo])], kind_of=SingleKind(pool),
                          objectives=ObjectiveSet.parse("throughput"), seed=0)
    return _run_singles(search, lambda config: figures[config["exec.gpu.batch"]])


def _run_singles(search: Any, figure_of: Callable[[dict], float]) -> list[dict]:
    """The configs ``search`` suggests, each single reported ok at ``figure_of(config)``, up to the first other
    strategy (or six configs)."""
    configs = []
    for n in range(6):
        config = search.suggest(f"t{n}")
        configs.append(config)
        if config["strategy"] != "single":
            break
        search.on_trial_complete(f"t{n}", {"status": "ok", "objective_value": figure_of(config)})
    return configs


def test_the_gpu_batches_are_walked_out_from_the_pools_batch_and_stop_past_a_batch_that_lost():
    """Issue 46 (a tune's acquiring): on several GPUs the GPU's other batches are a walk out from 256, each
    step at the best backend and tried only while the step before it won; a larger batch that wins skips
    every smaller one, and the strategies after get the batch that won."""
    up = _gpu_walk_search({256: 70.0, 512: 75.0, 128: 80.0, 64: 90.0})
    assert [(c["strategy"], c["exec.gpu.batch"]) for c in up] == [("single", 256), ("single", 512), ("fifo", 512)]
    assert up[1]["exec.gpu.backend"] == "inductor"  # the best single's backend, not the point's own
    down = _gpu_walk_search({256: 70.0, 512: 60.0, 128: 72.0, 64: 71.0})
    assert [(c["strategy"], c["exec.gpu.batch"]) for c in down] == [
        ("single", 256), ("single", 512), ("single", 128), ("single", 64), ("fifo", 128)]
    flat = _gpu_walk_search({256: 70.0, 512: 60.0, 128: 65.0, 64: 90.0})  # 64 is past 128, which lost
    assert [(c["strategy"], c["exec.gpu.batch"]) for c in flat] == [
        ("single", 256), ("single", 512), ("single", 128), ("fifo", 256)]


def _cpu_beside_gpus_search(cpu_figure: float) -> list[dict]:
    """The configs a StagedSearch suggests on two GPUs and a CPU group: the GPU single (35000 img/s), the
    CPU group's first single (``cpu_figure``), its other variants unless that was negligible, then fifo."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.executors import ExecutorSpec
    from autohet.pool import PoolSpec
    from autohet.tuning.initial import _CPU_KEYS, Stage
    from autohet.tuning.search import SingleKind, StagedSearch
    from autohet.tuning.space import DefineByRun, SpaceContext

    space = load_search_space("search_spaces").restrict(["fifo"], RunMode.THROUGHPUT)
    pool = PoolSpec("gpus", [*(ExecutorSpec(f"gpu{i}", "gpu", (i,), gpu=i, batch=256, precision="fp16")
                               for i in range(2)), ExecutorSpec("cpu0", "cpu", (2, 3), batch=16)])
    ctx = SpaceContext({"executors": 3}, frozenset({"gpu", "cpu"}))
    gpu = {"strategy": "single", "single.executor": 0, "exec.gpu.backend": "inductor", "exec.gpu.batch": 256}
    cpu = [{"strategy": "single", "single.executor": 2, "exec.cpu.backend": b, "exec.cpu.batch": 16}
           for b in ("onnxruntime", "eager", "onnxruntime_nnpack")]
    fifo = {"strategy": "fifo", "fifo.c": 4, "exec.gpu.backend": "eager", "exec.gpu.batch": 256}
    search = StagedSearch(DefineByRun(space, ctx), metric="objective_value", mode="max", points_to_evaluate=[gpu],
                          later=[Stage(cpu[:1], _CPU_KEYS), Stage(cpu[1:], _CPU_KEYS, unless_negligible="cpu"),
                                 Stage([fifo])], kind_of=SingleKind(pool),
                          objectives=ObjectiveSet.parse("throughput"), seed=0)
    return _run_singles(search, lambda config: 35000.0 if config["single.executor"] == 0 else cpu_figure)


def test_beside_gpus_a_cpu_group_whose_first_single_is_negligible_runs_no_other_variant():
    """Issue 46 (a tune's acquiring): beside two H200s the 30-core group's singles ran at 0.5-1.6% of one GPU
    and cost a tenth of the tune's acquiring (BENCHMARKS.md 39, 42); under ``NEGLIGIBLE_SHARE`` of the best GPU
    single, its first single is its last."""
    from autohet.core.settings import NEGLIGIBLE_SHARE

    low = _cpu_beside_gpus_search(35000.0 * NEGLIGIBLE_SHARE * 0.9)
    assert [(c["strategy"], c.get("single.executor")) for c in low] == [("single", 0), ("single", 2), ("fifo", None)]
    assert low[1]["exec.cpu.backend"] == "onnxruntime"
    high = _cpu_beside_gpus_search(35000.0 * NEGLIGIBLE_SHARE * 1.1)
    assert [c.get("exec.cpu.backend") for c in high[1:4]] == ["onnxruntime", "eager", "onnxruntime_nnpack"]
    assert high[-1]["strategy"] == "fifo"


def test_the_split_probes_run_each_close_cpu_variant_over_the_strategies_groups():
    """Variants whose whole-group single came within CLOSE_TO_BEST of the best each run the probe point
    (at its own batch); the best probe's settings, its batch included, go to the strategies on the probes'
    groups, the best single's to those on the singles' group; the strategies' point that is the winning
    probe is not run again."""
    from autohet.core.objectives import ObjectiveSet, TrialKey
    from autohet.tuning.initial import CLOSE_TO_BEST, Stage
    from autohet.tuning.search import SingleKind, StagedSearch
    from autohet.tuning.space import DefineByRun, SpaceContext

    space = load_search_space("search_spaces").restrict(["fifo", "chunk"], RunMode.THROUGHPUT)
    pool = load_pool("actors/cpu2.yaml")
    ctx = SpaceContext({"executors": 2}, frozenset({"cpu"}), pool_dims=True)
    base = {"strategy": "single", "single.executor": 0, "exec.cpu.batch": 64, "exec.cpu.precision": "fp32",
            "exec.cpu.channels_last": False, "exec.cpu.streams": 0, "pool.cpu_group_size": 2,
            "pool.gpu_partitions": 1}
    figures = {"onnxruntime": 4.83, "onnxruntime_nnpack": 4.81, "openvino": 4.83 * CLOSE_TO_BEST - 0.01,
               "eager": 2.3}
    first = [{**base, "exec.cpu.backend": b} for b in figures]
    fifo = {"strategy": "fifo", "fifo.c": 1, "fifo.unit": "batches", "exec.cpu.backend": "eager",
            "exec.cpu.batch": 16, "pool.cpu_group_size": 1, "pool.gpu_partitions": 1}
    chunk = {"strategy": "chunk", "chunk.w": 32, "chunk.unit": "images", "exec.cpu.backend": "eager",
             "exec.cpu.batch": 16, "pool.gpu_partitions": 1}
    later = [Stage([fifo], per_close_cpu=True),
             Stage([fifo, {**chunk, "pool.cpu_group_size": 1}, {**chunk, "pool.cpu_group_size": 2}])]
    search = StagedSearch(DefineByRun(space, ctx), metric="objective_value", mode="max", points_to_evaluate=first,
                          later=later, kind_of=SingleKind(pool), objectives=ObjectiveSet.parse("throughput"),
                          seed=0)
    for n in range(len(first)):
        config = search.suggest(f"s{n}")
        search.on_trial_complete(f"s{n}", {"status": "ok", "objective_value": figures[config["exec.cpu.backend"]]})
    probes = [search.suggest(f"p{n}") for n in range(2)]
    assert search.suggest("early") is None  # the strategies wait for the probes
    assert [(p["strategy"], p["exec.cpu.backend"], p["exec.cpu.batch"]) for p in probes] == [
        ("fifo", "onnxruntime", 16), ("fifo", "onnxruntime_nnpack", 16)]  # the best first; openvino not close
    for n, probe in enumerate(probes):
        search.on_trial_complete(f"p{n}", {"status": "ok", "objective_value": {
            "onnxruntime": 5.0, "onnxruntime_nnpack": 6.3}[probe["exec.cpu.backend"]]})
    assert search.best["cpu"][0] == 4.83  # exact: a fake trial's figure; a probe is no single
    split, whole = search.suggest("t0"), search.suggest("t1")
    assert (split["strategy"], split["pool.cpu_group_size"], split["exec.cpu.backend"], split["exec.cpu.batch"]) == (
        "chunk", 1, "onnxruntime_nnpack", 16)
    assert (whole["strategy"], whole["pool.cpu_group_size"], whole["exec.cpu.backend"], whole["exec.cpu.batch"]) == (
        "chunk", 2, "onnxruntime", 64)
    search.on_trial_complete("t0", {"status": "ok", "objective_value": 6.0, TrialKey.ACQUIRE: 1e6})
    search.on_trial_complete("t1", {"status": "ok", "objective_value": 4.0})
    # exact: fake trials' figures
    assert [f for f, _, _ in search.split_probes] == [5.0, 6.3]  # a strategy's trial is no probe
    # past the acquire cap, a sampled point keeps the best trial's groups (the nnpack probe's), at the
    # settings measured on them
    kept = search.suggest("k0")
    assert (kept["pool.cpu_group_size"], kept["exec.cpu.backend"], kept["exec.cpu.batch"]) == (
        1, "onnxruntime_nnpack", 16)


def test_the_split_winner_keeps_a_refinement_its_probe_could_not_tell_apart():
    """The best probe, unless a probe of a backend that refines it (CPU_REFINES) at the same other
    settings came within CLOSE_TO_BEST of it; a refinement at other settings, or further off, loses."""
    from autohet.core.objectives import THROUGHPUT
    from autohet.executors.cpu_backends import CPU_REFINES
    from autohet.tuning.initial import CLOSE_TO_BEST, split_winner

    assert CPU_REFINES["onnxruntime_nnpack"] == "onnxruntime"
    ort = {"exec.cpu.backend": "onnxruntime", "exec.cpu.batch": 16, "exec.cpu.precision": "fp32"}
    nnpack = {**ort, "exec.cpu.backend": "onnxruntime_nnpack"}
    openvino = {**ort, "exec.cpu.backend": "openvino"}
    assert split_winner([(4.356, ort), (4.233, nnpack)], THROUGHPUT) == nnpack  # the README job's probes
    assert split_winner([(4.4, ort), (4.4 * CLOSE_TO_BEST - 0.01, nnpack)], THROUGHPUT) == ort
    assert split_winner([(4.4, ort), (4.3, {**nnpack, "exec.cpu.batch": 64})], THROUGHPUT) == ort
    assert split_winner([(4.4, nnpack), (4.3, ort)], THROUGHPUT) == nnpack
    assert split_winner([(4.4, ort), (4.39, openvino)], THROUGHPUT) == ort  # no refinement: the best


def cpu2_fifo_search(monkeypatch, clock: list[float]):
    """A StagedSearch of fifo over actors/cpu2.yaml with one eager single first, its clock ``clock[0]``
    (stepped by hand)."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning import search as search_module
    from autohet.tuning.search import SingleKind, StagedSearch
    from autohet.tuning.space import DefineByRun, SpaceContext

    space = load_search_space("search_spaces").restrict(["fifo"], RunMode.THROUGHPUT)
    ctx = SpaceContext({"executors": 2}, frozenset({"cpu"}), pool_dims=True)
    first = [{"strategy": "single", "single.executor": 0, "exec.cpu.backend": "eager", "exec.cpu.batch": 16,
              "exec.cpu.precision": "fp32", "exec.cpu.channels_last": False, "exec.cpu.streams": 0,
              "pool.cpu_group_size": 2, "pool.gpu_partitions": 1}]
    monkeypatch.setattr(search_module, "time", SimpleNamespace(time=lambda: clock[0]))
    return StagedSearch(DefineByRun(space, ctx), metric="objective_value", mode="max", points_to_evaluate=first,
                        later=[], kind_of=SingleKind(load_pool("actors/cpu2.yaml")),
                        objectives=ObjectiveSet.parse("throughput"), seed=0)


def test_past_the_acquire_cap_sampled_points_keep_the_best_trials_topology(monkeypatch):
    """After both stages, while acquiring took more than ACQUIRE_SHARE_CAP of the tune's time, each
    sampled point is asked with the best trial's pool dims (no new topology) and each kind at its best
    single's settings (no new build); under it, the sampler picks them freely."""
    from autohet.core.objectives import TrialKey

    clock = [1000.0]
    search = cpu2_fifo_search(monkeypatch, clock)
    assert search.suggest("t0")["pool.cpu_group_size"] == 2
    clock[0] += 10.0
    search.on_trial_complete("t0", {"status": "ok", "objective_value": 50.0, TrialKey.ACQUIRE: 4.0})
    assert search.acquire_share() == pytest.approx(0.4)
    kept = [search.suggest(f"k{n}") for n in range(6)]
    assert {c["pool.cpu_group_size"] for c in kept} == {2} and {c["pool.gpu_partitions"] for c in kept} == {1}
    assert {(c["exec.cpu.backend"], c["exec.cpu.batch"], c["exec.cpu.precision"]) for c in kept} == {
        ("eager", 16, "fp32")}  # the CPU's best single's settings
    assert len({(c["strategy"], c.get("fifo.c")) for c in kept}) > 1  # the rest is still sampled
    for n in range(6):
        search.on_trial_complete(f"k{n}", {"status": "ok", "objective_value": 10.0, TrialKey.ACQUIRE: 0.0})
    clock[0] += 1000.0  # acquiring now 4 s of 1010: under the cap
    free = [search.suggest(f"f{n}") for n in range(12)]
    assert len({c["pool.cpu_group_size"] for c in free}) > 1
    assert len({(c["exec.cpu.backend"], c["exec.cpu.batch"]) for c in free}) > 1


def test_the_acquire_cap_looks_ahead_to_the_tunes_expected_length(monkeypatch):
    """Under the cap so far, a sampled point still keeps the best topology when one more acquiring as
    long as the longest so far would take acquiring past the cap of the tune's expected length: the
    deadline, or sooner the trials left at the mean trial time so far."""
    from autohet.core.objectives import TrialKey
    from autohet.tuning import search as search_module

    clock = [1000.0]

    def after_one_trial(trials: int, budget_s: float):
        search = cpu2_fifo_search(monkeypatch, clock)
        search.expect(trials, budget_s)
        search.suggest("t0")
        clock[0] += 60.0  # one trial of 60 s, 8 s of it acquiring: 13%, under the cap
        search.on_trial_complete("t0", {"status": "ok", "objective_value": 50.0, TrialKey.ACQUIRE: 8.0})
        return search

    # 40 s left: the tune ends 100 s in, where 8 + 8 s of acquiring would be 16%
    short = after_one_trial(30, 100.0)
    assert short.acquire_share() < search_module.ACQUIRE_SHARE_CAP and short.over_acquire_cap()
    kept = [short.suggest(f"k{n}") for n in range(4)]
    assert {(c["pool.cpu_group_size"], c["exec.cpu.backend"], c["exec.cpu.batch"]) for c in kept} == {
        (2, "eager", 16)}
    # trials left: 1 more at 60 s ends it 120 s in, where 16 s is 13%
    assert not after_one_trial(2, 1000.0).over_acquire_cap()
    long = after_one_trial(30, 1000.0)
    assert not long.over_acquire_cap()
    free = [long.suggest(f"f{n}") for n in range(12)]
    assert len({(c["pool.cpu_group_size"], c["exec.cpu.backend"], c["exec.cpu.batch"]) for c in free}) > 1


def test_restrict_keeps_single_and_checks_names():
    space = load_search_space("search_spaces")
    assert list(space.restrict(["fifo"], RunMode.THROUGHPUT).strategies) == ["single", "fifo"]
    with pytest.raises(UserError, match="no search space; valid:"):
        space.restrict(["nope"], RunMode.THROUGHPUT)


@pytest.mark.parametrize("text, fragment", [
    ("strategies: {fifo: {c: {type: int, low: 5}}}", "needs a numeric high"),
    ("strategies: {fifo: {c: {type: int, low: 9, high: 2}}}", "low 9 > high 2"),
    ("strategies: {fifo: {size: {type: int, low: 1, high: 2}}}", "no parameter 'size'; valid: c"),
    ("strategies: {roundrobin: {}}", "is not registered; valid:"),
    ("strategies: {fifo: {c: {type: gaussian}}}", "type: one of"),
    ("strategies: {fifo: {c: {type: categorical, choices: []}}}", "non-empty choices"),
    ("strategies: {fifo: {c: {type: float, low: 0, high: 1, log: true}}}", "low must be > 0"),
    ("executors: {tpu: {batch: {type: categorical, choices: [1]}}}", "not one of cpu, gpu, sim"),
    ("executors: {cpu: {sms: {type: categorical, choices: [8]}}}", "no parameter 'sms'"),
    ("strategies: {fifo: {c: {type: int, low: 0, high: 8}}}", "would suggest 0, which the parameter refuses"),
    ("strategies: {fifo: {unit: {type: categorical, choices: [images, frames]}}}", "would suggest 'frames'"),
    ("strategies: {fifo: {c: {type: int, low: 1, high: 8, size: 3}}}", "unknown key 'size'; valid for int"),
    ("executors: {cpu: {threads: {type: categorical, choices: [1]}}}", "no parameter 'threads'"),
    ("strategies: [", "not valid YAML"),
    ("famly: x", "unknown key 'famly'"),
])
def test_bad_space_yaml_is_a_clear_error(tmp_path, text, fragment):
    with pytest.raises(UserError) as info:
        load_search_space(write(tmp_path, "bad.yaml", text))
    assert fragment in str(info.value)


def test_initial_points_try_a_gpu_alone_at_each_batch_choice():
    from autohet.executors import ExecutorSpec
    from autohet.pool import PoolSpec

    space = load_search_space("search_spaces")
    mixed = PoolSpec("mixed", [ExecutorSpec("gpu0", "gpu", (0,), gpu=0, batch=256, precision="fp16"),
                               ExecutorSpec("cpu0", "cpu", (1,), batch=16)])
    points = initial_points(space, mixed)
    singles = [p for p in points if p["strategy"] == "single"]
    gpu = sorted({p["exec.gpu.batch"] for p in singles if p["single.executor"] == 0})
    assert gpu == sorted(space.executors["gpu"]["batch"].choices)
    fast = next(p for p in points if p["strategy"] == "fast_split")  # defaults that suit a GPU next to cores
    assert (fast["fast_split.unit"], fast["fast_split.w_s"], fast["fast_split.threshold"]) == ("batches", 2, 1)
    assert all(p["exec.gpu.precision"] == "fp16" for p in singles)
    from autohet.tuning.initial import CPU_VARIANTS

    # no CPU compiling, and no NNPACK layer timing, next to a GPU
    cpu = [v for v in CPU_VARIANTS if v.backend not in ("inductor", "onnxruntime_nnpack")]
    assert [p["single.executor"] for p in singles].count(1) == len(cpu) + 1  # the CPU group's variants
    assert [p["single.executor"] for p in singles][-len(cpu) - 1:] == [1] * (len(cpu) + 1)
    assert not any(p.get("exec.cpu.backend") in ("inductor", "onnxruntime_nnpack") for p in singles)
    # right after the GPU at its defaults: torch.compile (inductor), then CUDA graphs, then the batches
    assert [p.get("exec.gpu.backend") for p in singles[1:3]] == ["inductor", "cudagraphs"]
    assert singles[3]["exec.gpu.backend"] == singles[0]["exec.gpu.backend"]


def test_initial_points_keep_the_auto_pools_own_topology(monkeypatch):
    """Every first point names the auto pool's own dims (whole GPUs, its group size): left to the
    sampler, gpu_partitions flipped the first trials' topology on the H100 and each flip restarted
    the GPU's actor (acquire was 54% of a tune's wall time)."""
    import autohet.pool.spec as pool_spec_module

    monkeypatch.setattr(pool_spec_module.os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    monkeypatch.setattr(pool_spec_module, "_local_gpus", lambda: 1)
    space = load_search_space("search_spaces")
    points = initial_points(space, load_pool("actors/auto.yaml"))
    assert points and all(p["pool.gpu_partitions"] == 1 for p in points)
    # one switch and back: the CPU group's singles, together, on one group of the 15 free cores
    sizes = [p["pool.cpu_group_size"] for p in points]
    first_all = sizes.index("all")
    n_all = sizes.count("all")
    assert sizes[first_all : first_all + n_all] == ["all"] * n_all and set(sizes) == {4, "all"}
    assert all(p["strategy"] == "single" and p["single.executor"] == 1 for p in points if p["pool.cpu_group_size"]
               == "all")
    # that group is started ahead while the GPU's singles run (nothing to compile ahead: no other GPU)
    from autohet.tuning.initial import staged_points

    pool = load_pool("actors/auto.yaml")
    assert staged_points(space.for_pool(pool), pool).ahead() == [
        {"pool": {"cpu_group_size": "all", "gpu_partitions": 1, "max_cpu_groups": "all"}}]


def test_a_latency_space_drops_batch_and_its_first_points_try_compiled_graphs_first():
    from autohet.executors import ExecutorSpec
    from autohet.pool import PoolSpec

    space = load_search_space("search_spaces").restrict(None, RunMode.LATENCY)
    assert all("batch" not in dims for dims in space.executors.values())
    assert "precision" in space.executors["gpu"]
    mixed = PoolSpec("mixed", [ExecutorSpec("gpu0", "gpu", (0,), gpu=0, batch=256, precision="fp16"),
                               ExecutorSpec("cpu0", "cpu", (1,), batch=16)])
    points = initial_points(space, mixed, mode=RunMode.LATENCY)
    singles = [p for p in points if p["strategy"] == "single"]
    # the GPU alone compiled and captured first, then as a plain CUDA graph (every other first point's
    # GPU is one), then eager
    assert [p.get("exec.gpu.backend") for p in singles[:3]] == ["inductor", "cudagraphs", "eager"]
    assert all(p["exec.gpu.backend"] == "cudagraphs" for p in points if p["strategy"] != "single")
    assert not any("exec.gpu.batch" in p for p in singles)
    assert "batch" in load_search_space("search_spaces").restrict(None, RunMode.THROUGHPUT).executors["gpu"]


def _first_points_on(flags: str, spaces, monkeypatch) -> tuple[list, list]:
    monkeypatch.setenv("AUTOHET_CPU_FLAGS", flags)
    space, notes = load_search_space(spaces).for_machine()
    return initial_points(space, load_pool("actors/cpu2.yaml")), notes


def test_the_tune_tests_space_and_first_points_are_the_same_with_and_without_bf16(tmp_path, monkeypatch):
    """Issue 24: a tune test counted trials that a bf16 day's space changed. The tune tests' pinned
    space must give the same first points (and leave nothing out) on every CPU."""
    from tests.test_tune import pinned_spaces

    spaces = pinned_spaces(tmp_path)
    with_bf16, notes_on = _first_points_on("+avx512_bf16,+amx_bf16", spaces, monkeypatch)
    without, notes_off = _first_points_on("-avx512_bf16,-amx_bf16", spaces, monkeypatch)
    assert with_bf16 == without and notes_on == notes_off == []


def test_cpu_bf16_is_searched_only_where_the_cpu_has_it(monkeypatch):
    monkeypatch.setenv("AUTOHET_CPU_FLAGS", "+avx512_bf16")
    space, notes = load_search_space("search_spaces").for_machine()
    assert "bf16" in space.executors["cpu"]["precision"].choices
    assert not any("precision=bf16" in n for n in notes)
    monkeypatch.setenv("AUTOHET_CPU_FLAGS", "-avx512_bf16,-amx_bf16")
    space, notes = load_search_space("search_spaces").for_machine()
    assert space.executors["cpu"]["precision"].choices == ("fp32",)
    assert any(n.startswith("cpu precision=bf16 left out: no AVX512-BF16/AMX") for n in notes)


def test_a_malformed_cpu_flags_override_is_one_line(monkeypatch):
    from autohet.executors.compiled import cpu_flags

    monkeypatch.setenv("AUTOHET_CPU_FLAGS", "avx512_bf16")
    with pytest.raises(UserError, match=r"'avx512_bf16' must be \+flag or -flag"):
        cpu_flags()


def test_a_pool_of_two_gpus_runs_each_gpu_setting_alone_then_the_gpus_together(monkeypatch):
    """Issue 46: on an auto pool of two GPUs (and 14 cores: CPU groups beside them) stage one is the GPU
    alone at each backend, the one that compiles last (another GPU compiles it meanwhile); then the GPU's
    other batches; then fifo and fast_split over the GPUs without the CPU groups (``max_cpu_groups: 0``), in
    whole batches, at the best single's settings, its batch included (BENCHMARKS.md 42: run before the walk,
    they ran at 256 where 512 won); then the CPU group's first single, its other variants only where that
    one is not negligible beside the GPU; then the rest."""
    import autohet.pool.spec as pool_spec_module
    from autohet.tuning.initial import Known, staged_points
    from autohet.tuning.manager import regroup

    monkeypatch.setattr(pool_spec_module.os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    monkeypatch.setattr(pool_spec_module, "_local_gpus", lambda: 2)
    pool = load_pool("actors/auto.yaml")
    assert [e.kind for e in pool.executors][:2] == ["gpu", "gpu"] and len(pool.executors) > 2
    space = load_search_space("search_spaces").for_pool(pool)
    first = staged_points(space, pool)
    assert {p["exec.gpu.batch"] for p in first.singles} == {256}  # each backend at the pool's batch
    assert [p.get("exec.gpu.backend") for p in first.singles] == ["eager", "cudagraphs", "inductor"]
    # the compiled single on gpu1, where the plan's first compile ahead goes while gpu0's singles run; the walk on
    # gpu0, which sets its first step up from the cache while that single runs (BENCHMARKS.md 46)
    assert [(p["strategy"], p["single.executor"]) for p in first.singles] == [("single", 0), ("single", 0),
                                                                              ("single", 1)]
    assert {p["single.executor"] for p in first.gpu_batches} == {0}
    # made ready while trials run elsewhere, in the order needed: inductor's single and the walk's first step up
    # compiled on the idle GPU, then the CPU singles' group of every core started on the idle cores
    gpu = {k.removeprefix("exec.gpu."): v for k, v in first.singles[-1].items() if k.startswith("exec.gpu.")}
    assert gpu["backend"] == "inductor" and first.ahead() == [
        {"gpu": gpu}, {"gpu": {**gpu, "batch": 512}},
        {"pool": {"cpu_group_size": "all", "gpu_partitions": 1, "max_cpu_groups": "all"}}]
    *walk, together, cpu_first, cpu_singles = first.later()[:6]
    assert [p["strategy"] for p in together.points] == ["fifo", "fast_split"]
    assert all(p["pool.max_cpu_groups"] == 0 for p in together.points)
    fifo, fast = together.points
    assert (fifo["fifo.unit"], fifo["fifo.c"]) == ("batches", 4)
    assert (fast["fast_split.unit"], fast["fast_split.w_s"], fast["fast_split.threshold"]) == ("batches", 2, 1)
    assert [e.kind for e in regroup(pool, {"max_cpu_groups": 0}).executors] == ["gpu", "gpu"]
    best = {"gpu": {"exec.gpu.backend": "inductor", "exec.gpu.batch": 512}}
    assert all((p["exec.gpu.backend"], p["exec.gpu.batch"]) == ("inductor", 512)
               for p in together.filled(Known(best)))  # the best single's, the walk's batch included
    # the other batches walked out from 256: up first, then down (test_the_gpu_batches_are_walked_...)
    assert [(stage.points[0]["exec.gpu.batch"], stage.when_best) for stage in walk] == [
        (512, ("exec.gpu.batch", 256)), (128, ("exec.gpu.batch", 256)), (64, ("exec.gpu.batch", 128))]
    at256 = {"gpu": {"exec.gpu.backend": "inductor", "exec.gpu.batch": 256}}
    assert [p["exec.gpu.backend"] for stage in walk[:2] for p in stage.filled(Known(at256))] == ["inductor"] * 2
    assert len(cpu_first.points) == 1 and cpu_singles.points
    assert all(p["pool.cpu_group_size"] == "all" for p in cpu_first.points + cpu_singles.points)
    assert all(p["pool.max_cpu_groups"] == "all" for p in first.singles + cpu_first.points + cpu_singles.points)
    assert cpu_first.filled(Known(best)) and cpu_singles.filled(Known(best))
    assert cpu_first.filled(Known(best, negligible=frozenset({"cpu"})))  # the first runs whatever it is
    assert cpu_singles.filled(Known(best, negligible=frozenset({"cpu"}))) == []
    walked = [p for stage in walk for p in stage.points]
    assert first.all()[: len(first.singles) + len(walked) + 2] == first.singles + walked + together.points


def test_a_cpu_only_pool_has_no_max_cpu_groups_dim_and_no_gpus_together_stage(monkeypatch):
    import autohet.pool.spec as pool_spec_module
    from autohet.tuning.initial import staged_points

    monkeypatch.setattr(pool_spec_module.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    monkeypatch.setattr(pool_spec_module, "_local_gpus", lambda: 0)
    pool = load_pool("actors/auto.yaml")
    space = load_search_space("search_spaces")
    assert "max_cpu_groups" in space.pool and "max_cpu_groups" not in space.for_pool(pool).pool
    first = staged_points(space.for_pool(pool), pool)
    assert first.gpus_together == [] and not any("pool.max_cpu_groups" in p for p in first.all())
    assert first.ahead() == []  # no idle GPU to compile on
