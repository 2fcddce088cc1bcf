"""The tune's PoolManager without Ray: actors kept across topologies, standalone measured per class."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import autohet.pool.spec as pool_spec_module
from autohet.core.models import ModelSpec
from autohet.core.workload import Workload
from autohet.pool import Pool, PoolSpec, executor_class, identity, load_pool
from autohet.strategies import get_strategy
from autohet.tuning.ahead import Ready
from autohet.tuning.manager import PoolManager


class FakePool(Pool):
    """Records what the manager asks of a pool; 'actors' are strings naming the executor and pool.
    Its configure is the real pool's (``Pool.configure``): the executors it pushes params to are kept."""

    made: list[FakePool] = []

    def __init__(self, spec: PoolSpec, prefix: str) -> None:
        super().__init__(spec)
        self.prefix = prefix
        self.actors: list[Any] = []
        self.adopted: dict[tuple, Any] = {}
        self.measured: list[list[int]] = []
        self.pushed: list[list[int]] = []  # each push of params: to which executors
        FakePool.made.append(self)

    def start(self, model: ModelSpec, workload: Workload, adopt: dict[tuple, Any] | None = None) -> None:
        self.adopted = dict(adopt or {})
        self.actors = [self.adopted.get(identity(e), f"{self.prefix}/{e.name}") for e in self.spec.executors]

    def launch(self, model: ModelSpec, workload: Workload, adopt: dict[tuple, Any] | None = None) -> dict[int, str]:
        """As ``start``, without waiting: the new actors' load calls are strings naming them."""
        self.start(model, workload, adopt)
        held = set((adopt or {}).values())
        return {i: f"load {a}" for i, a in enumerate(self.actors) if a not in held}

    def dispatcher(self) -> Any:
        raise NotImplementedError

    def set_workload(self, workload: Workload) -> list[int]:
        raise NotImplementedError

    def _apply_config(self, indices: list[int]) -> list[dict[str, Any]]:
        self.pushed.append(list(indices))
        return [{"compile_s": 1.0} for _ in indices]

    def standalone_ips(self, seconds: float, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        assert indices is not None, "the manager measures chosen executors only"
        self.measured.append(list(indices))
        execs = self.spec.executors
        return [1000.0 * execs[i].batch if execs[i].kind == "gpu" else 10.0 * len(execs[i].cores) for i in indices]


@pytest.fixture
def nine_core_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> PoolSpec:
    """auto on a pretend 9-core machine with one GPU: gpu0 fed by core 0, eight one-core groups."""
    monkeypatch.setattr(pool_spec_module.os, "sched_getaffinity", lambda _pid: set(range(9)), raising=False)
    monkeypatch.setattr(pool_spec_module, "_local_gpus", lambda: 1)
    FakePool.made = []
    return load_pool("actors/gpu1_cpu.yaml")  # auto with one-core groups


def _manager(base: PoolSpec, killed: list | None = None, max_live_actors: int | None = None,
             released: list | None = None, memory_share: float = 1.0) -> PoolManager:
    workload = Workload(np.zeros((2, 1, 28, 28), dtype=np.float32), 64)
    sink = killed if killed is not None else []
    drops = released if released is not None else []
    return PoolManager(base, ModelSpec("lenet"), workload, "t", pool_factory=FakePool, kill=sink.append,
                       max_live_actors=max_live_actors, release=drops.extend, memory_share=lambda: memory_share)


def test_identical_executors_share_one_standalone_measurement(nine_core_gpu_machine: PoolSpec) -> None:
    base = nine_core_gpu_machine
    assert [e.cores for e in base.executors] == [(0,)] + [(c,) for c in range(1, 9)]
    manager = _manager(base)
    assert manager.calibrate(0.1) == 1000.0 * 256 + 8 * 10.0  # exact: Python float arithmetic on the test's own figures
    pool = FakePool.made[-1]
    assert pool.measured == [[0], [1]]  # the GPU, and the first of the eight identical CPU groups
    # exact: Python float arithmetic on the test's own figures
    assert manager.standalone(0.1, None) == [256000.0] + [10.0] * 8
    assert pool.measured == [[0], [1]]  # cached
    # exact: Python float arithmetic on the test's own figures
    assert manager.known_standalone(3) == 10.0 and manager.known_standalone(99) is None
    manager.acquire({}, {"gpu": {"batch": 128}})
    manager.standalone(0.1, None)
    assert pool.measured[-1] == [0]  # only the executor whose configuration changed


def test_topologies_keep_their_actors_and_share_measurements(nine_core_gpu_machine: PoolSpec) -> None:
    killed: list = []
    manager = _manager(nine_core_gpu_machine, killed, max_live_actors=64)
    manager.calibrate(0.1)
    first = FakePool.made[-1]
    spec, actors, _ = manager.acquire({"cpu_group_size": 4}, {})
    second = FakePool.made[-1]
    assert second is not first and not killed  # the one-core groups stay alive, idle
    assert [e.cores for e in spec.executors] == [(0,), (1, 2, 3, 4), (5, 6, 7, 8)]
    assert actors[0] == first.actors[0]  # the GPU executor's actor serves both topologies
    assert set(second.adopted) == {identity(spec.executors[0])}
    # exact: Python float arithmetic on the test's own figures
    assert manager.standalone(0.1, None) == [256000.0, 40.0, 40.0]
    assert second.measured == [[1]]  # the GPU's figure came from the cache
    manager.acquire({"cpu_group_size": 4}, {})
    assert FakePool.made[-1] is second  # same topology: same pool
    _, back, _ = manager.acquire({}, {})  # the first topology again: every actor found alive
    assert back == first.actors and len(FakePool.made[-1].adopted) == 9
    assert manager.stats() == {"topologies_started": 3, "actors_adopted": 10, "actors_replaced": 0,
                               "actors_released": 0, "standalone_measured": 3, "compiled_ahead": 0,
                               "actors_started_ahead": 0, "compiled_ahead_s": 0, "ahead_waited_s": 0,
                               "ahead_jobs": []}


def test_cut_trial_ends_busy_actors_and_the_next_acquire_starts_only_those(nine_core_gpu_machine: PoolSpec) -> None:
    killed: list = []
    manager = _manager(nine_core_gpu_machine, killed)
    _, actors, _ = manager.acquire({}, {})
    manager.replace([2, 3])
    assert killed == [actors[2], actors[3]]
    _, again, _ = manager.acquire({}, {})
    fresh = FakePool.made[-1]
    assert len(fresh.adopted) == 7 and again[2] != actors[2] and again[4] == actors[4]


def test_least_recently_used_idle_actors_are_ended_above_the_cap(nine_core_gpu_machine: PoolSpec) -> None:
    killed: list = []
    manager = _manager(nine_core_gpu_machine, killed, max_live_actors=5)
    _, one_core, _ = manager.acquire({}, {})  # 9 actors: over the cap, but all in use
    assert not killed
    manager.acquire({"cpu_group_size": 4}, {})  # gpu + 2 groups in use: 6 of the 8 idle one-core groups go
    assert len(killed) == 6 and set(killed) <= set(one_core[1:]) and len(manager.live) == 5


@pytest.mark.parametrize(("available", "drops"), [(0.5, True), (0.9, False)])
def test_short_of_memory_a_new_topology_first_has_the_idle_cpu_executors_drop_their_programs(
        nine_core_gpu_machine: PoolSpec, available: float, drops: bool) -> None:
    """Only the idle CPU executors drop (the GPU's actor serves both topologies and holds device
    memory), and only where less than RELEASE_IDLE_BELOW of the memory is available; none is ended."""
    from autohet.tuning.manager import RELEASE_IDLE_BELOW

    assert 0.5 < RELEASE_IDLE_BELOW < 0.9
    killed: list = []
    released: list = []
    manager = _manager(nine_core_gpu_machine, killed, max_live_actors=64, released=released, memory_share=available)
    _, one_core, _ = manager.acquire({}, {})
    assert not released  # nothing idle yet
    _, grouped, _ = manager.acquire({"cpu_group_size": 4}, {})
    assert not killed and grouped[0] == one_core[0]
    assert released == (one_core[1:] if drops else [])
    assert manager.stats()["actors_released"] == (8 if drops else 0)


def test_the_fastest_valid_run_is_remembered() -> None:
    manager = PoolManager(load_pool("actors/cpu2.yaml"), ModelSpec("lenet"),
                          Workload(np.zeros((1, 1, 28, 28), dtype=np.float32), 8), "t", pool_factory=FakePool)
    assert manager.best_speed() is None
    for ips in (200.0, 800.0, 400.0):
        manager.record_speed(ips)
    assert manager.best_speed() == 800.0  # exact: Python float arithmetic on the test's own figures


def test_a_trial_is_sized_to_its_target_seconds_at_the_best_speed_known() -> None:
    from autohet.tuning.trainable import TrialSizing

    sizing = TrialSizing(target_s=3.0, min_images=32, max_images=1_000_000, base_ips=1000.0)
    assert sizing.images(None) == 2896  # 3000 images, rounded to a power of sqrt(2) (2^11.5)
    assert sizing.images(500.0) == 2896  # a slower trial does not shrink the next ones
    assert sizing.images(160_000.0) == 524288  # 480000 -> 2^19: no fixed cap of 100000 (0.6 s trials)
    assert TrialSizing(3.0, 32, 100_000, 160_000.0).images(None) == 100_000  # the output cap holds
    assert TrialSizing(3.0, 32, 100, 1.0).images(None) == 32
    assert sizing.deadline(2896) == pytest.approx(28.96) and sizing.deadline(10) == 20.0
    # exact: Python float arithmetic on the test's own figures
    assert TrialSizing(3.0, 32, 100, 1.0, timeout_s=7.0).deadline(50) == 7.0


def test_a_slower_single_is_sized_and_timed_at_its_own_speed() -> None:
    """A CPU group's single beside a GPU runs its target seconds at its own speed, not the GPU's."""
    from autohet.tuning.trainable import TrialSizing, trial_images

    sizing = TrialSizing(target_s=3.0, min_images=32, max_images=1_000_000, base_ips=70_000.0)
    spec = load_pool("actors/cpu2.yaml")
    assert sizing.images_at(1000.0) == 2896 and sizing.images(None) == 185364
    assert trial_images(sizing, 70_000.0, spec, own_ips=1000.0) == 2896
    assert trial_images(sizing, 70_000.0, spec) == 185364
    assert trial_images(sizing, None, spec, own_ips=1.0) == 2 * sum(e.batch for e in spec.executors)
    assert trial_images(sizing, None, spec, own_ips=1.0, single=1) == 2 * spec.executors[1].batch
    assert sizing.deadline(2896, 1000.0) == pytest.approx(28.96) and sizing.deadline(2896) == 20.0


def test_one_executor_is_measured_alone_once_per_class(nine_core_gpu_machine: PoolSpec) -> None:
    manager = _manager(nine_core_gpu_machine)
    manager.acquire({}, {})
    pool = FakePool.made[-1]
    # exact: Python float arithmetic on the test's own figures
    assert manager.standalone_of(4, 0.1) == 10.0 and pool.measured == [[4]]
    # exact: Python float arithmetic on the test's own figures
    assert manager.standalone_of(2, 0.1) == 10.0 and pool.measured == [[4]]  # same class: cached
    assert manager.known_standalone(7) == 10.0  # exact: Python float arithmetic on the test's own figures
    assert manager.standalone_of(99, 0.1) is None and pool.measured == [[4]]
    manager.acquire({}, {"cpu": {"batch": 32}})
    # exact: Python float arithmetic on the test's own figures
    assert manager.standalone_of(2, 0.1) == 10.0 and pool.measured[-1] == [2]  # a new configuration
    manager.standalone(0.1, 500)  # a trial's figures (its share as the cap): the CPU groups' is known
    assert pool.measured[-1] == [0]


def test_a_single_sets_up_its_executor_alone_and_the_others_before_they_run(nine_core_gpu_machine: PoolSpec) -> None:
    """A single's new GPU setting used to be compiled on every GPU of the topology at once: a third of a
    two-GPU tune's wall time went to acquiring executors (BENCHMARKS.md 33)."""
    manager = _manager(nine_core_gpu_machine)
    manager.acquire({}, {})
    pool = FakePool.made[-1]
    assert pool.pushed == [list(range(9))]
    changed = {"gpu": {"batch": 512}, "cpu": {"batch": 8}}
    _, _, compile_s = manager.acquire({}, changed, only=[3])
    assert pool.pushed[-1] == [3] and compile_s == 1.0  # exact: the fake's own figure, once
    assert pool.spec.executors[0].batch == 512  # the spec holds the trial's params for every executor
    manager.standalone_of(3, 0.1)
    assert pool.pushed[-1] == [3] and pool.measured[-1] == [3]  # set up already: nothing pushed again
    manager.standalone_of(5, 0.1)  # same class as 3: its figure is known, but 5 gets the params first
    assert pool.pushed[-1] == [5]
    # every executor's figure: only the one measured (gpu0's new class) gets the params before it; the rest
    # keep waiting for a run that uses them (a GPU meanwhile compiling ahead is left to it)
    figures = manager.standalone(0.1, None)
    assert pool.pushed[-1] == [0] and pool.unconfigured == {1, 2, 4, 6, 7, 8} and len(figures) == 9
    single = manager.standalone(0.1, None, used=[3])
    assert single == [0.0] * 3 + [10.0] + [0.0] * 5  # exact: the fake's figures, a single's own alone
    assert pool.pushed[-1] == [0]
    manager.acquire({}, changed)  # a trial over every executor: all of them (a no-op where unchanged)
    assert pool.pushed[-1] == list(range(9))
    manager.acquire({}, {"gpu": {"batch": 256}}, only=[])  # an engine family: no executor actor runs
    assert pool.pushed[-1] == [] and pool.unconfigured == set(range(9))


def test_the_executors_a_trial_sets_up_are_its_strategys() -> None:
    assert get_strategy("single").executors_used({"executor": 2}) == [2]
    assert get_strategy("fifo").executors_used({"c": 1}) is None
    assert get_strategy("pipeline").executors_used({}) == []  # its engine runs on the devices, not the actors


def test_executor_class_ignores_name_and_which_cores() -> None:
    base = load_pool("actors/cpu2.yaml")
    a, b = base.executors[:2]
    assert a.cores != b.cores and executor_class(a) == executor_class(b)
    assert executor_class(a) != executor_class(a.with_params({"batch": a.batch * 2}))


def test_regroup_applies_group_size_and_group_count(nine_core_gpu_machine: PoolSpec) -> None:
    from autohet.tuning.manager import regroup

    spec = regroup(nine_core_gpu_machine, {"cpu_group_size": 2, "max_cpu_groups": 2})
    assert [(e.kind, e.cores) for e in spec.executors] == [("gpu", (0,)), ("cpu", (1, 2)), ("cpu", (3, 4))]
    assert regroup(nine_core_gpu_machine, {}) is nine_core_gpu_machine
    explicit = load_pool("actors/cpu2.yaml")
    assert regroup(explicit, {"cpu_group_size": 2}) is explicit  # explicit pools keep their groups


def test_a_fresh_gpu_executor_first_ends_the_idle_actor_holding_that_gpu(nine_core_gpu_machine: PoolSpec,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole GPU's actor and its partitions' actor both claim the GPU: switching between them
    ends the idle one first (else the new actor waits for the GPU forever, as a tune did on the H100)."""
    monkeypatch.setattr(pool_spec_module, "_local_sm_shares", lambda parts: [64])
    killed: list = []
    manager = _manager(nine_core_gpu_machine, killed, max_live_actors=64)
    _, whole, _ = manager.acquire({}, {})
    spec, parts, _ = manager.acquire({"gpu_partitions": 2}, {})
    assert [e.name for e in spec.executors[:2]] == ["gpu0p0", "gpu0p1"] and spec.executors[0].sms == 64
    assert killed == [whole[0]]  # the whole GPU's actor; the idle CPU groups stay
    assert all(i[1] != "gpu" or i[0].startswith("gpu0p") for i in manager.live)
    _, again, _ = manager.acquire({}, {})
    assert set(killed[1:]) <= set(parts[:2]) and len(killed) >= 2 and again[0] not in (whole[0], *parts[:2])
    assert again[1:] == whole[1:]  # the one-core groups were adopted back


def test_the_end_of_a_tune_reports_a_busy_manager_without_waiting_for_it() -> None:
    """No Ray: a breakdown without the manager's counts says why (the last trial's set-up was ended)."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning.progress import Progress

    progress = Progress(3, ObjectiveSet.parse("throughput"), 0)
    line = progress.breakdown(None)
    assert line.startswith("autohet: 0 trials in ") and "ended with them" in line
    assert "executor topologies" in progress.breakdown({"topologies_started": 2})


def test_the_breakdown_says_what_cut_trials_cost_of_the_budget() -> None:
    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning.progress import Progress

    progress = Progress(3, ObjectiveSet.parse("throughput"), 0, time_budget_s=600.0)
    for status, seconds in (("ok", 10.0), ("cut", 45.0), ("cut", 15.0)):
        progress.update({"status": status, "time.trial_s": seconds, "strategy": "fifo"})
    assert "trials: 1 ok, 2 cut (cut trials 60 s, 10% of the time budget)" in progress.breakdown({})
    assert "ahead" not in progress.breakdown({})
    ahead = progress.breakdown({"compiled_ahead": 2, "compiled_ahead_s": 19, "ahead_waited_s": 6,
                                "actors_started_ahead": 1, "ahead_jobs": ["gpu1 inductor b256 cold: 19 s compiling",
                                                                          "gpu0 inductor b256 warm: failed"]})
    assert ahead.endswith(", 2 settings compiled ahead on idle GPUs (19 s compiling; trials waited 6 s for them), "
                          "CPU executors started ahead on idle cores: 1\n"
                          "autohet: set up ahead: gpu1 inductor b256 cold: 19 s compiling\n"
                          "autohet: set up ahead: gpu0 inductor b256 warm: failed")


def test_an_engine_family_is_refused_only_where_its_devices_cannot_reach_the_best_trial() -> None:
    from autohet.tuning.trainable import CPU_ENGINE_HEADROOM, ENGINE_HEADROOM, engine_shortfall

    why = engine_shortfall("pipeline", 7.3, [2.1, 2.0], ["cpu0", "cpu1"])  # vgg16: two eager cores vs OpenVINO
    assert why == ("pipeline cannot beat the best trial's 7.3 img/s: its devices (cpu0, cpu1) run the whole model "
                   "at 4.1 img/s together, each at its best figure as an engine runs it (eager PyTorch on a CPU, a "
                   f"CUDA graph on a GPU; at any backend where none is known), under 1/{ENGINE_HEADROOM:g} of it")
    assert engine_shortfall("pipeline", 6.0, [2.1, 2.0], ["a", "b"]) is None  # within the headroom: it runs
    assert engine_shortfall("split", 4.6, [2.1, 2.0], ["a", "b"], CPU_ENGINE_HEADROOM) is not None  # CPUs: 1.1x
    assert engine_shortfall("pipeline", 7.3, [2.1, None], ["a", "b"]) is None  # a device never measured
    assert engine_shortfall("pipeline", None, [2.1, 2.0], ["a", "b"]) is None  # no valid trial yet
    # an engine trial on these devices (or some of them) already ran within the headroom of the best: it runs.
    # On the 2-core box a lenet pipeline over two 1-core groups ran 8539 img/s against their standalone 7156,
    # and the next pipeline over them was refused against it (a tune test failed so, one run in several)
    assert engine_shortfall("pipeline", 8539.0, [3578.0, 3578.0], ["cpu0", "cpu1"], CPU_ENGINE_HEADROOM,
                            reached=8539.0) is None
    assert engine_shortfall("pipeline", 8539.0, [3578.0, 3578.0], ["cpu0", "cpu1"], CPU_ENGINE_HEADROOM) is not None
    assert engine_shortfall("pipeline", 9999.0, [3578.0, 3578.0], ["a", "b"], CPU_ENGINE_HEADROOM,
                            reached=8539.0) is not None  # a faster trial of another kind still refuses it


def test_an_engines_devices_are_figured_as_the_engine_runs_them() -> None:
    """``device_figures``: a GPU at its CUDA graph's figure (an engine runs its stages so, never as inductor
    or plain eager), else another whole GPU's of the host (the tune measures each backend on one of them),
    else its best at any backend; a CPU group at its eager figure, else its best at any backend; None for a
    device never measured. On two H200s resnet18's engine trials were bounded by inductor's 78166 img/s a GPU
    and each ran until the trial timeout cut it (BENCHMARKS.md 43); by the CUDA graph's 48429 they are refused
    against the GPUs together."""
    from autohet.executors import ExecutorSpec
    from autohet.tuning.trainable import ENGINE_HEADROOM, engine_shortfall

    gpus = [ExecutorSpec(f"gpu{g}", "gpu", (g,), g, batch=256) for g in (0, 1)]
    base = PoolSpec("two", [*gpus, ExecutorSpec("cpu0", "cpu", (2, 3), batch=16)])
    manager = _manager(base)
    manager.acquire({}, {})
    gpu0, gpu1, group = base.executors
    values = manager.standalone_cache.values

    def measured(spec: ExecutorSpec, backend: str, ips: float) -> None:
        values[(executor_class(spec.with_params({"backend": backend})), None)] = ips

    measured(gpu1, "inductor", 78166.0)
    measured(gpu1, "eager", 40000.0)  # a launch-bound model's eager figure: under its CUDA graph's
    assert manager.device_figures([1, 2]) == [78166.0, None]  # exact: only inductor's is an engine's bound
    measured(gpu0, "cudagraphs", 48429.0)
    measured(group, "onnxruntime", 416.0)
    # gpu1 takes gpu0's CUDA graph, the group its ONNX Runtime figure
    assert manager.device_figures([0, 1, 2, 99]) == [48429.0, 48429.0, 416.0, None]  # exact: the test's own figures
    measured(group, "eager", 120.0)
    assert manager.device_figures([2]) == [120.0]  # exact: as above
    # §43's tune: the best trial 157953 img/s, the GPUs together
    names = ["gpu0", "gpu1", "cpu0"]
    assert engine_shortfall("pipeline", 157953.0, manager.device_figures([0, 1, 2]), names, ENGINE_HEADROOM)
    assert engine_shortfall("pipeline", 157953.0, [78166.0, 78166.0, 416.0], names, ENGINE_HEADROOM) is None


def test_an_engine_trials_figure_counts_for_its_devices_and_any_that_hold_them() -> None:
    """``engine_reached``: the best an engine trial ran on a set of executors, for those executors or more
    of them, by executor identity; a single's figure is no engine trial's."""
    manager = PoolManager(load_pool("actors/cpu2.yaml"), ModelSpec("lenet"),
                          Workload(np.zeros((1, 1, 28, 28), dtype=np.float32), 8), "t", pool_factory=FakePool)
    manager.acquire({}, {})
    manager.record_speed(9000.0)  # a single
    assert manager.engine_reached([0, 1]) is None
    manager.record_speed(8539.0, [0, 1])
    manager.record_speed(7000.0, [0, 1])
    manager.record_speed(5000.0, [1])
    assert manager.engine_reached([0, 1]) == 8539.0  # exact: the test's own figures
    assert manager.engine_reached([1]) == 5000.0  # exact: as above
    assert manager.engine_reached([0]) is None


def test_a_trial_runs_at_least_two_batches_of_each_executor() -> None:
    from autohet.tuning.trainable import TrialSizing, trial_images

    sizing = TrialSizing(target_s=3.0, min_images=32, max_images=1_000_000, base_ips=4.0)  # vgg16, 2 cores
    two_groups = load_pool("actors/cpu2.yaml").with_executor_params({"cpu": {"batch": 16}})
    assert sizing.images(None) == 32 and trial_images(sizing, None, two_groups) == 64
    assert trial_images(sizing, 4000.0, two_groups) == sizing.images(4000.0)  # a fast model: its time decides


class _Remote:
    """A manager method called as ``manager.method.remote(...)``, answered at once (ray.get patched)."""

    def __init__(self, fn: Any) -> None:
        self.remote = fn


def test_a_single_is_timed_by_its_own_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_trial's sizing decision without Ray: a single's executor measured alone first (once per
    configuration), then sized and cut by that speed, slower or faster than the fastest trial so far;
    other strategies by the fastest trial."""
    import ray

    from autohet.core.objectives import TrialKey
    from autohet.tuning import trainable

    monkeypatch.setattr(ray, "get", lambda value: value)
    measured: list[int] = []

    class Manager:  # executor 0's figure is known; the others are measured when asked
        standalone_of = _Remote(lambda i, seconds: 70_000.0 if i == 0 else measured.append(i) or 900.0)
        best_speed = _Remote(lambda: 70_000.0)

    setup = trainable.TrialSetup(ModelSpec("lenet"), Workload(np.zeros((1, 1, 28, 28), np.float32), 8),
                                 "throughput", "m", 16, 0.5, 10, cut_factor=4.0)
    phases = {TrialKey.STANDALONE: 0.0}
    own = trainable._single_speed
    # exact: Python float arithmetic on the test's own figures
    assert own("single", {"executor": 1}, Manager, setup, phases) == 900.0 and measured == [1]
    assert own("single", {"executor": 0}, Manager, setup, phases) == 70_000.0 and measured == [1]  # known
    assert own("hat", {}, Manager, setup, phases) is None and measured == [1]
    sizing = trainable.TrialSizing(target_s=3.0, min_images=32, max_images=1_000_000, base_ips=120.0)
    spec = load_pool("actors/cpu2.yaml")
    assert trainable.trial_images(sizing, None, spec, own_ips=1041.0, single=0) == 2896  # not 362 at 120 img/s
    assert trainable.trial_images(sizing, None, spec) == 362
    assert trainable._cut_deadline(Manager, setup, 2896, 900.0) == pytest.approx(4 * 2896 / 900)
    assert trainable._cut_deadline(Manager, setup, 2896) == trainable.CUT_FLOOR_S  # 4 x 2896 / 70000 s


def test_an_estimated_busy_time_is_labelled_in_the_metrics_and_the_report() -> None:
    """Issue 50: a busy time extrapolated from a few timed frames is never logged or printed as measured."""
    from autohet.commands.run import report
    from autohet.core.measurement import ExecutorReport, Measurement
    from autohet.tuning.trainable import trial_metrics

    m = Measurement("lenet", "coedge", {}, 100, 2.0, 50.0, 60.0, 50 / 60, True, 0.0, 1e-3,
                    [ExecutorReport("cpu0", "cpu[0]", 100, 1.5, 30.0),
                     ExecutorReport("cpu1", "cpu[1]", 100, 1.0, 30.0, busy_estimated=True)])
    metrics = trial_metrics(m)
    assert metrics["busy.cpu0"] == pytest.approx(0.75) and metrics["busy_est.cpu1"] == pytest.approx(0.5)
    assert "busy.cpu1" not in metrics
    text = report(m)
    assert "~1" in text and "estimated from a few timed frames" in text
    assert m.to_dict()["executors"][1]["busy_estimated"] is True


class FakeAhead:
    """Records the ahead work the manager starts and waits for; each job "compiled" for 2 s; the loads of
    actors started ahead (strings, ``FakePool.launch``) end at once, or fail where ``failing`` names them."""

    def __init__(self, failing: tuple[Any, ...] = (), hanging: tuple[Any, ...] = ()) -> None:
        self.started: list[tuple[Any, dict[str, Any], frozenset[int]]] = []
        self.aside: list[tuple[Any, dict[str, Any], frozenset[int]]] = []  # handles ("aside", i)
        self.waited: list[Any] = []
        self.failing, self.hanging = failing, hanging
        self.timeouts: list[float | None] = []
        self.ended_at: float | None = None  # when each job says it ended (None: not said)
        self.after: dict[int, Any] = {}  # a job started after another (its index -> that one's handle)
        self.standbys: list[tuple[Any, frozenset[int]]] = []
        self.log: list[tuple[str, Any]] = []  # ("start", index) and ("wait", handle), in order

    def start(self, actor: Any, params: dict[str, Any], cores: frozenset[int], after: Any = None) -> int:
        self.started.append((actor, params, cores))
        self.log.append(("start", len(self.started) - 1))
        if after is not None:
            self.after[len(self.started) - 1] = after
        return len(self.started) - 1

    def standby(self, actor: Any, cores: frozenset[int]) -> None:
        self.standbys.append((actor, cores))

    def start_aside(self, actor: Any, params: dict[str, Any], cores: frozenset[int]) -> tuple[str, int]:
        self.aside.append((actor, params, cores))
        return ("aside", len(self.aside) - 1)

    def wait(self, handle: Any, timeout: float | None = None) -> Ready | None:
        self.waited.append(handle)
        self.log.append(("wait", handle))
        self.timeouts.append(timeout)
        if handle in self.failing or handle in self.hanging:  # a hanging one "runs" past any timeout
            return None
        return Ready(0.0) if isinstance(handle, str) else Ready(2.0, self.ended_at)


@pytest.fixture
def two_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> PoolSpec:
    """auto on a pretend 10-core machine with two GPUs: gpu0 and gpu1 fed by cores 0 and 1, two groups of four."""
    monkeypatch.setattr(pool_spec_module.os, "sched_getaffinity", lambda _pid: set(range(10)), raising=False)
    monkeypatch.setattr(pool_spec_module, "_local_gpus", lambda: 2)
    FakePool.made = []
    return load_pool("actors/auto.yaml")


_INDUCTOR = {"backend": "inductor", "batch": 256}
_PLAN = [{"gpu": _INDUCTOR}, {"gpu": {**_INDUCTOR, "batch": 512}}]


def _ahead_manager(base: PoolSpec, ahead: FakeAhead, plan: list | None = None, killed: list | None = None
                   ) -> PoolManager:
    workload = Workload(np.zeros((2, 1, 28, 28), dtype=np.float32), 64)
    sink = killed if killed is not None else []
    manager = PoolManager(base, ModelSpec("lenet"), workload, "t", pool_factory=FakePool, kill=sink.append,
                          ahead=ahead, cores=frozenset(range(10)), max_live_actors=64)
    manager.plan_ahead(_PLAN if plan is None else plan)
    return manager


def test_an_idle_gpu_compiles_the_coming_settings_ahead_off_the_feeding_cores(two_gpu_machine: PoolSpec) -> None:
    """Issue 46: a two-GPU tune's inductor compiles were 49.7 s of efficientnet_b0's acquiring, each run
    while the other GPU idled (BENCHMARKS.md 39). While a single runs on gpu0, gpu1 compiles the plan's
    settings on the cores no GPU feeds, the second in a child process beside the first (BENCHMARKS.md 42: one
    after the other, the walk's single waited 39 s); a trial that needs one waits for it, not compiling it
    again, and gpu1 then sets up from the cache the one its child compiled."""
    assert [(e.kind, e.cores) for e in two_gpu_machine.executors][:2] == [("gpu", (0,)), ("gpu", (1,))]
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead)
    manager.acquire({}, {})  # every executor runs: none is idle
    assert ahead.started == [] and ahead.aside == []
    _, actors, _ = manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    off_feeders = frozenset(range(2, 10))  # not cores 0 and 1
    assert ahead.started == [(actors[1], _INDUCTOR, off_feeders)]
    assert ahead.aside == [(actors[1], {**_INDUCTOR, "batch": 512}, off_feeders)]
    manager.standalone(0.1, 500, used=[0])  # the single's limit after its run: gpu0's alone, gpu1 left to its jobs
    assert ahead.waited == [] and FakePool.made[-1].measured[-1] == [0]
    manager.acquire({}, {"gpu": {"backend": "cudagraphs"}}, only=[0])  # needs nothing gpu1 holds
    assert ahead.waited == [] and len(ahead.started) == 1
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])  # the setting gpu1 compiles: that job waited for
    assert ahead.waited == [0] and len(ahead.started) == 1  # gpu1's child still compiles: nothing new on it
    manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[0])  # the child's setting: waited for
    assert ahead.waited == [0, ("aside", 0)]
    assert ahead.started[1] == (actors[1], {**_INDUCTOR, "batch": 512}, off_feeders)  # from the cache, on gpu1
    together, _, _ = manager.acquire({"max_cpu_groups": 0}, {"gpu": {**_INDUCTOR, "batch": 512}})  # waits for it
    assert ahead.waited == [0, ("aside", 0), 1] and [e.kind for e in together.executors] == ["gpu", "gpu"]
    manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[0])
    assert len(ahead.started) == 2 and len(ahead.aside) == 1  # the plan is done: each GPU holds both
    stats = manager.stats()
    assert (stats["compiled_ahead"], stats["compiled_ahead_s"]) == (3, 6)


def test_a_trial_on_a_cpu_group_or_an_engine_waits_for_the_ahead_work_and_starts_none(
        two_gpu_machine: PoolSpec) -> None:
    """Ahead compiles run on the CPU groups' cores: a trial measured there must not share them; an engine
    family (no actor runs: ``only`` is empty) runs on the devices themselves."""
    for trial in ([2], []):
        ahead = FakeAhead()
        manager = _ahead_manager(two_gpu_machine, ahead)
        manager.acquire({}, {}, only=[0])
        assert len(ahead.started) == 1
        manager.acquire({}, {"cpu": {"batch": 8}}, only=trial)
        assert ahead.waited == [0, ("aside", 0)] and len(ahead.started) == 1


def test_the_gpus_the_first_trial_leaves_idle_start_on_the_plan_as_it_is_given(two_gpu_machine: PoolSpec) -> None:
    """BENCHMARKS.md 43: Ray Tune took 9 s to start its trial process while both GPUs idled. With the first
    trial's topology live (the calibration's) and its executors given, the others start on the plan at once;
    the first trial then waits for nothing. Each job that ends says when it was ready."""
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead, plan=[])
    manager.plan_ahead(_PLAN, ({}, [0]))  # nothing live yet: nothing to start on
    _, actors, _ = manager.acquire({}, {})  # the calibration: every executor
    # not given; another topology; every executor; one past the topology (the strategy's to refuse); a bad dim
    for first in (None, ({"max_cpu_groups": 0}, [0]), ({}, None), ({}, [99]), ({"cpu_group_size": "x"}, [0])):
        manager.plan_ahead(_PLAN, first)
        assert ahead.started == [] and ahead.aside == []
    manager.plan_ahead(_PLAN, ({"max_cpu_groups": "all"}, [0]))
    off_feeders = frozenset(range(2, 10))
    assert ahead.started == [(actors[1], _INDUCTOR, off_feeders)]
    assert ahead.aside == [(actors[1], {**_INDUCTOR, "batch": 512}, off_feeders)]
    manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])  # the first trial
    assert ahead.waited == [] and len(ahead.started) == 1
    job = manager.ahead.jobs[0]
    ahead.ended_at = job.started_at + 41.0
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[1])  # on gpu1: waits for its actor's job and its child's
    jobs = manager.stats()["ahead_jobs"]
    assert jobs[0] == "gpu1 inductor b256 cold: ready after 41 s, 2 s compiling"
    assert len(jobs) == 2 and jobs[1].startswith("gpu1 (child) inductor b512 cold: ready after ")


def test_a_setting_a_trial_set_up_is_not_compiled_ahead_and_one_gpu_has_no_idle_gpu(
        two_gpu_machine: PoolSpec, nine_core_gpu_machine: PoolSpec) -> None:
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead)
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])  # the first planned setting, set up by the trial
    # gpu1: b512, which nobody holds, first; b256 then from the cache gpu0's set-up filled, on the same actor
    assert [params for _, params, _ in ahead.started] == [{**_INDUCTOR, "batch": 512}, _INDUCTOR]
    ahead = FakeAhead()
    manager = _ahead_manager(nine_core_gpu_machine, ahead)
    for only in (None, [0], [3]):
        manager.acquire({}, {}, only=only)
    assert ahead.started == []  # one GPU: a single on a CPU group leaves it idle, but the cores are the group's


_ONE_GROUP = {"pool": {"cpu_group_size": "all"}}


def test_the_cpu_singles_group_starts_ahead_while_a_gpu_single_runs_and_is_adopted_once_loaded(
        nine_core_gpu_machine: PoolSpec) -> None:
    """A tune's first CPU single waited 10-13 s for its group of every core to start (BENCHMARKS.md 34, 39):
    the group's actor is created and loads while the GPU's singles run, on the cores they leave idle."""
    ahead = FakeAhead()
    manager = _ahead_manager(nine_core_gpu_machine, ahead, [_ONE_GROUP])
    manager.acquire({}, {})  # every executor runs: nothing starts ahead
    assert len(FakePool.made) == 1
    manager.acquire({}, {"gpu": {"backend": "cudagraphs"}}, only=[0])
    early = FakePool.made[-1]
    assert len(FakePool.made) == 2 and [e.cores for e in early.spec.executors][1:] == [tuple(range(1, 9))]
    assert list(manager.loading.values()) == [f"load {early.actors[1]}"]
    assert manager.stats()["actors_started_ahead"] == 1
    manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])  # nothing waits on it yet
    assert ahead.waited == []
    spec, actors, _ = manager.acquire({"cpu_group_size": "all"}, {}, only=[1])  # its load waited for, then adopted
    assert ahead.waited == [f"load {early.actors[1]}"] and actors[1] == early.actors[1] and not manager.loading
    assert spec.executors[1].cores == tuple(range(1, 9)) and manager.stats()["actors_adopted"] >= 2


def test_an_actor_started_ahead_that_failed_to_load_is_ended_and_started_again(nine_core_gpu_machine: PoolSpec) -> None:
    killed: list = []
    ahead = FakeAhead(failing=("load t-a0/cpu0",))
    manager = _ahead_manager(nine_core_gpu_machine, ahead, [_ONE_GROUP], killed)
    manager.acquire({}, {}, only=[0])
    assert FakePool.made[-1].actors[1] == "t-a0/cpu0"
    _, actors, _ = manager.acquire({"cpu_group_size": "all"}, {}, only=[1])
    assert killed == ["t-a0/cpu0"] and actors[1] != "t-a0/cpu0"  # the topology started its own


def test_a_topology_starts_ahead_only_once_the_compiles_ahead_are_done(two_gpu_machine: PoolSpec) -> None:
    """Both use the cores no GPU feeds: the compiles go first (their settings are needed sooner)."""
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead, [*_PLAN, _ONE_GROUP])
    manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])
    assert len(ahead.started) + len(ahead.aside) == 2 and not manager.loading  # b512 compiling beside gpu1
    manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[0])  # waits for it; gpu1 sets it up from
    assert ahead.waited == [0, ("aside", 0)] and not manager.loading  # the cache: the group still waits
    manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[0])  # gpu1 done: then the group starts
    assert ahead.waited == [0, ("aside", 0)] and not manager.loading and len(ahead.started) == 2
    manager.acquire({"max_cpu_groups": 0}, {"gpu": {**_INDUCTOR, "batch": 512}})  # the GPUs together, after
    assert ahead.waited == [0, ("aside", 0), 1] and len(manager.loading) == 1  # gpu1's job: the group starts
    manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[0])  # a GPU trial: no wait on the load
    assert ahead.waited == [0, ("aside", 0), 1]


def test_a_compile_ahead_that_failed_ends_its_executor_and_the_topology_starts_a_fresh_one(
        two_gpu_machine: PoolSpec) -> None:
    """Its actor may have died (a GPU out of memory) or hold a setting it could not set up."""
    killed: list = []
    ahead = FakeAhead(failing=(0,))
    manager = _ahead_manager(two_gpu_machine, ahead, killed=killed)
    _, before, _ = manager.acquire({}, {}, only=[0])
    _, after, _ = manager.acquire({}, {}, only=[1])  # gpu1's own trial: waits for its job, which failed
    assert ahead.waited == [0] and killed == [before[1]]  # the child's job went with its actor
    assert after[1] != before[1] and after[0] == before[0]  # gpu1 started afresh, the rest adopted


def test_an_executor_index_past_the_topology_is_left_to_the_strategy_to_refuse(two_gpu_machine: PoolSpec) -> None:
    """A single's index is drawn for the largest topology: ahead work neither fails on it nor runs beside it."""
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead)
    manager.acquire({}, {}, only=[0])
    spec, _, _ = manager.acquire({}, {}, only=[len(two_gpu_machine.executors) + 5])
    assert ahead.waited == [0, ("aside", 0)] and len(ahead.started) == 1
    assert len(spec.executors) == len(two_gpu_machine.executors)


def test_the_first_trial_is_handed_to_the_manager_only_where_its_point_fixes_its_topology(
        two_gpu_machine: PoolSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan-time start needs the first trial's topology and executors: decoded from the first point, and
    only where that point sets every pool dim the sampler would otherwise draw."""
    import ray

    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning.initial import staged_points
    from autohet.tuning.space import load_search_space
    from autohet.tuning.study import _opening
    from autohet.tuning.tuner import _plan_ahead

    space = load_search_space("search_spaces").for_pool(two_gpu_machine)
    first = staged_points(space, two_gpu_machine)
    point = _opening(first, space, pool_dims=True)
    assert point == first.singles[0] and point["strategy"] == "single"
    drawn = dict(first.singles[0])
    drawn.pop("pool.cpu_group_size")  # a pool file's value outside the space's choices: the sampler's to draw
    first.singles[0] = drawn
    assert _opening(first, space, pool_dims=True) is None and _opening(first, space, pool_dims=False) == drawn

    class Recording:
        def __init__(self) -> None:
            self.asked: list[Any] = []
            self.plan_ahead = self

        def remote(self, plan: Any, first: Any) -> Any:
            self.asked.append((plan, first))
            return None

    monkeypatch.setattr(ray, "get", lambda ref: ref)
    manager = Recording()
    _plan_ahead(manager, _PLAN, ObjectiveSet.parse("throughput"), point)
    pool = {k.removeprefix("pool."): v for k, v in point.items() if k.startswith("pool.")}
    assert manager.asked == [(_PLAN, (pool, [point["single.executor"]]))]
    _plan_ahead(manager, _PLAN, ObjectiveSet.parse("throughput"), None)
    assert manager.asked[-1] == (_PLAN, None)


def test_a_tune_with_an_energy_objective_plans_nothing_ahead() -> None:
    """The energy meter counts every GPU of the pool and the CPU packages during a run."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.tuning.tuner import _plan_ahead

    class Unreachable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the manager was asked: {name}")

    _plan_ahead(Unreachable(), _PLAN, ObjectiveSet.parse("throughput,energy"))
    _plan_ahead(Unreachable(), [], ObjectiveSet.parse("throughput"))
    assert ObjectiveSet.parse("latency,energy").meters_energy and not ObjectiveSet.parse("throughput").meters_energy


def test_each_idle_gpu_sets_up_the_planned_settings_it_lacks_cold_ones_first(two_gpu_machine: PoolSpec) -> None:
    """Issue 46: in a two-GPU tune the GPUs-together trial waited 22.7 s for the walk's compile ahead on the
    GPU it needed (BENCHMARKS.md 42). A GPU sets up ahead what it lacks, a setting no executor holds first;
    a trial whose executors hold their settings waits for no job compiling them elsewhere; an ended actor's
    settings are forgotten."""
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead)
    b512 = {**_INDUCTOR, "batch": 512}
    _, actors, _ = manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])  # gpu0 sets b256 up itself
    # gpu1: b512, which nobody holds, first; then b256 from the cache, one after the other on its actor
    assert [(actor, params) for actor, params, _ in ahead.started] == [(actors[1], b512), (actors[1], _INDUCTOR)]
    manager.acquire({}, {"gpu": b512}, only=[0])  # gpu0 lacks it: waits for its compile, not for the b256 job
    assert ahead.waited == [0]
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])  # gpu0 holds b256: gpu1's job on it is no reason to wait
    assert ahead.waited == [0]
    manager.acquire({"max_cpu_groups": 0}, {"gpu": _INDUCTOR})  # both GPUs: gpu1's job first
    assert ahead.waited == [0, 1]
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])
    assert len(ahead.started) == 2  # each GPU holds the whole plan
    manager.replace([1])  # a cut trial ends gpu1: a fresh one lacks both, and sets them up from the cache
    _, fresh, _ = manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])
    assert fresh[1] != actors[1] and [(a, p) for a, p, _ in ahead.started[2:]] == [(fresh[1], _INDUCTOR),
                                                                                   (fresh[1], b512)]


def test_on_four_gpus_two_cold_compiles_run_at_once_and_no_setting_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_spec_module.os, "sched_getaffinity", lambda _pid: set(range(12)), raising=False)
    monkeypatch.setattr(pool_spec_module, "_local_gpus", lambda: 4)
    FakePool.made = []
    four = load_pool("actors/auto.yaml")
    assert [e.gpu for e in four.executors if e.is_gpu] == [0, 1, 2, 3]
    ahead = FakeAhead()
    manager = PoolManager(four, ModelSpec("lenet"), Workload(np.zeros((2, 1, 28, 28), dtype=np.float32), 64), "t",
                          pool_factory=FakePool, kill=[].append, ahead=ahead, cores=frozenset(range(12)),
                          max_live_actors=64)
    manager.plan_ahead(_PLAN)
    _, actors, _ = manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    b512 = {**_INDUCTOR, "batch": 512}
    assert [(actor, params) for actor, params, _ in ahead.started] == [
        (actors[1], _INDUCTOR), (actors[2], b512), (actors[3], _INDUCTOR), (actors[3], b512)]
    assert ahead.after == {2: 0, 3: 1}  # gpu3: both are compiling; each set up from the cache once it is there
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])  # waits for gpu1's compile; gpu1 then queues gpu2's b512
    assert ahead.waited == [0] and [(a, p["batch"]) for a, p, _ in ahead.started[4:]] == [(actors[1], 512)]
    assert ahead.after[4] == 1
    manager.acquire({}, {"gpu": b512}, only=[0])  # waits for gpu2's; gpu2 sets b256 up from the cache
    assert ahead.waited == [0, 1] and [(a, p["batch"]) for a, p, _ in ahead.started[5:]] == [(actors[2], 256)]


def test_a_setting_no_gpu_holds_is_compiled_on_one_gpu_and_set_up_on_the_others_from_the_cache(
        two_gpu_machine: PoolSpec) -> None:
    """Issue 46: a data-parallel trial drawn at a GPU setting no executor held had both GPUs compile it cold
    at once (BENCHMARKS.md 48: 16.4 s of compiling for a tf32 setting). gpu0 compiles it, then gpu1 sets it
    up from the cache; the CPU groups, on cores of their own, are set up beside gpu0."""
    manager = _ahead_manager(two_gpu_machine, FakeAhead(), plan=[])
    manager.acquire({}, {})
    pool = FakePool.made[-1]
    tf32 = {"gpu": {**_INDUCTOR, "precision": "tf32"}, "cpu": {"batch": 8}}
    _, _, compile_s = manager.acquire({}, tf32)
    assert pool.pushed[-2:] == [[0, 2, 3], [1]] and pool.unconfigured == set()
    assert compile_s == 4.0  # exact: the fake's 1 s for each of the four set-ups, none twice
    manager.acquire({}, tf32)  # every executor holds it now: all at once (a no-op where unchanged)
    assert pool.pushed[-1] == [0, 1, 2, 3]
    manager.acquire({}, {"gpu": {"backend": "cudagraphs", "batch": 64}})  # a backend that compiles nothing
    assert pool.pushed[-1] == [0, 1, 2, 3]
    b512 = {"gpu": {**_INDUCTOR, "batch": 512, "precision": "fp16"}}
    manager.acquire({}, b512, only=[1])  # a single's GPU compiles it; the others wait for a run that uses them
    assert pool.pushed[-1] == [1] and pool.unconfigured == {0, 2, 3}
    manager.acquire({"max_cpu_groups": 0}, b512)  # the GPUs together: gpu1 holds it, gpu0 sets it up warm
    assert FakePool.made[-1].pushed[-1] == [0, 1]


def test_the_gpus_together_on_live_actors_do_not_wait_for_a_cpu_group_loading(two_gpu_machine: PoolSpec) -> None:
    """The group of every core loads on the cores no GPU feeds; a trial of the GPUs alone runs beside it, as a
    GPU single does; a topology that starts actors of its own, or a trial on a CPU group, waits for it."""
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead, [_ONE_GROUP])
    manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    assert len(manager.loading) == 1
    together, _, _ = manager.acquire({"max_cpu_groups": 0}, {"gpu": {"backend": "eager"}})
    assert [e.kind for e in together.executors] == ["gpu", "gpu"] and ahead.waited == [] and manager.loading
    manager.acquire({"cpu_group_size": 2}, {}, only=[0])  # new CPU actors of its own: waits first
    assert len(ahead.waited) == 1 and not manager.loading


def test_in_a_two_gpu_tunes_order_each_gpu_is_set_up_before_the_trial_that_needs_it(two_gpu_machine: PoolSpec) -> None:
    """The first points' order on two GPUs (``staged_points``): gpu0's plain singles, the compiled single on gpu1,
    the walk on gpu0, then both GPUs. gpu1 compiles b256 itself and b512 in a child; its single waits for its own
    compiles and sets nothing up. gpu0, idle while it runs, queues both before that single's wait, each set up
    from the cache once compiled (BENCHMARKS.md 46: it had started them only once the wait was over)."""
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead)
    b512 = {**_INDUCTOR, "batch": 512}
    _, actors, _ = manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    manager.acquire({}, {"gpu": {"backend": "cudagraphs"}}, only=[0])
    assert [(a, p) for a, p, _ in ahead.started] == [(actors[1], _INDUCTOR)] and ahead.aside[0][:2] == (actors[1], b512)
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[1])  # its GPU's jobs: both waited for
    assert ahead.waited == [0, ("aside", 0)]
    # gpu0 queued both first, each after the cold compile of it
    assert [(a, p) for a, p, _ in ahead.started[1:]] == [(actors[0], _INDUCTOR), (actors[0], b512)]
    assert ahead.after == {1: 0, 2: ("aside", 0)}
    assert ahead.log[1:] == [("start", 1), ("start", 2), ("wait", 0), ("wait", ("aside", 0))]  # before the wait
    assert [job.cold for job in manager.ahead.jobs] == [False, False]  # no trial waits for them as cold compiles
    manager.acquire({}, {"gpu": b512}, only=[0])  # the walk on gpu0 waits for its jobs; gpu1, idle, sets b512 up
    assert ahead.waited == [0, ("aside", 0), 1, 2] and ahead.started[3][:2] == (actors[1], b512)
    assert ahead.log[-3:] == [("start", 3), ("wait", 1), ("wait", 2)]  # from the cache, before that wait
    manager.acquire({"max_cpu_groups": 0}, {"gpu": b512})  # both GPUs: gpu1's job first
    assert ahead.waited == [0, ("aside", 0), 1, 2, 3] and len(ahead.started) == 4 and 3 not in ahead.after


def test_a_set_up_queued_after_a_cold_compile_that_failed_holds_nothing_and_ends_no_executor(
        two_gpu_machine: PoolSpec) -> None:
    """The executor reports it set nothing up (``skipped``): it holds what it held, and the trial that needs the
    setting sets it up itself, meeting the compile's failure, if any, as its own."""
    killed: list = []
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead, killed=killed)
    manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[1])  # gpu0 queues b256 after gpu1's cold compile (job 0)
    assert ahead.after[1] == 0
    skipped = manager.ahead.jobs[0]
    ahead.wait = lambda handle, timeout=None: Ready(0.0, None, held=False)  # type: ignore[method-assign]
    assert manager.ahead.settle([skipped]) == [] and killed == []
    assert not manager.ahead.holds(two_gpu_machine.executors[0].with_params(_INDUCTOR))
    assert manager.stats()["ahead_jobs"][-1] == ("gpu0 inductor b256 warm after another's cold compile: set "
                                                 "nothing up (the compile it waited for failed)")


def test_the_gpus_get_children_on_standby_after_the_calibration_where_two_or_more_compile_ahead(
        two_gpu_machine: PoolSpec, nine_core_gpu_machine: PoolSpec) -> None:
    """A child started cold spent 12-16 s on top of its compile (BENCHMARKS.md 46): each GPU's actor keeps one on
    standby from the calibration on, its imports made on the cores ahead work uses. One GPU has no idle GPU to
    compile aside on: none there."""
    ahead = FakeAhead()
    manager = _ahead_manager(two_gpu_machine, ahead)
    manager.calibrate(0.01)
    actors = FakePool.made[-1].actors
    assert ahead.standbys == [(actors[0], frozenset(range(2, 10))), (actors[1], frozenset(range(2, 10)))]
    ahead = FakeAhead()
    _ahead_manager(nine_core_gpu_machine, ahead).calibrate(0.01)
    assert ahead.standbys == []


def test_work_ahead_still_running_past_its_bound_is_given_up_with_its_executor(
        two_gpu_machine: PoolSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung compile held every later trial of a tune: a job is waited for until ``AHEAD_GIVE_UP_S`` after it
    started, and one still running then (a child's too) has its executor ended, its child with it."""
    import autohet.tuning.ahead as ahead_module
    from autohet.core.settings import AHEAD_GIVE_UP_S

    killed: list = []
    ahead = FakeAhead(hanging=(("aside", 0),))
    manager = _ahead_manager(two_gpu_machine, ahead, killed=killed)
    _, actors, _ = manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])  # waits for gpu1's b256, within the bound
    assert ahead.waited == [0] and AHEAD_GIVE_UP_S - 60 < ahead.timeouts[0] <= AHEAD_GIVE_UP_S
    monkeypatch.setattr(ahead_module, "AHEAD_GIVE_UP_S", 0.0)  # the child's job is past its bound
    _, fresh, _ = manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[1])
    assert ahead.waited == [0, ("aside", 0)] and ahead.timeouts[1] == 0.0  # exact: max(0.0, a past bound)
    assert killed == [actors[1]] and fresh[1] != actors[1]
    assert manager.stats()["ahead_jobs"][-1] == "gpu1 (child) inductor b512 cold: given up after 0 s"


def test_an_aside_compile_that_failed_leaves_its_executor_and_a_failed_job_ends_only_its_own_actor(
        two_gpu_machine: PoolSpec) -> None:
    """A child's failure costs its setting only (the trial that needs it sets it up, and meets the failure as
    its own); an actor ended for its failed job takes its other jobs with it, so a fresh actor of the same
    GPU is neither ended for them nor made to wait on them."""
    killed: list = []
    ahead = FakeAhead(failing=(("aside", 0),))
    manager = _ahead_manager(two_gpu_machine, ahead, killed=killed)
    _, actors, _ = manager.acquire({}, {"gpu": {"backend": "eager"}}, only=[0])
    manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[0])  # waits for the child: it failed
    assert ahead.waited == [("aside", 0)] and killed == []
    killed.clear()
    ahead = FakeAhead(failing=(0,))
    manager = _ahead_manager(two_gpu_machine, ahead, plan=[{"gpu": _INDUCTOR}, {"gpu": {**_INDUCTOR, "batch": 512}},
                                                            {"gpu": {**_INDUCTOR, "batch": 128}}], killed=killed)
    _, actors, _ = manager.acquire({}, {"gpu": _INDUCTOR}, only=[0])  # gpu1: b512 on its actor, then b128 aside
    assert [p["batch"] for _, p, _ in ahead.started] == [512, 256] and [p["batch"] for _, p, _ in ahead.aside] == [128]
    _, fresh, _ = manager.acquire({}, {"gpu": {**_INDUCTOR, "batch": 512}}, only=[0])  # its job failed: ended
    assert ahead.waited == [0] and killed == [actors[1]] and fresh[1] != actors[1]
    # the fresh gpu1's jobs only (b128, cold again: its child went with the old actor; then b256, b512 warm)
    assert [job.handle for job in manager.ahead.jobs] == [2, 3, 4] and len(ahead.aside) == 1
    assert [(a, p["batch"]) for a, p, _ in ahead.started[2:]] == [(fresh[1], 128), (fresh[1], 256), (fresh[1], 512)]
    manager.acquire({"max_cpu_groups": 0}, {"gpu": _INDUCTOR})  # waits for the fresh gpu1's jobs: all went well
    assert ahead.waited == [0, 2, 3, 4] and killed == [actors[1]]


def test_a_topology_that_only_regroups_a_negligible_cpu_is_refused_before_it_starts(
        nine_core_gpu_machine: PoolSpec) -> None:
    """``cpu_regroup`` and ``regroup_shortfall``: a trial whose topology starts CPU groups alone, where all the
    CPU's cores at the best per-core figure add under ``NEGLIGIBLE_SHARE`` of the best trial and its GPUs
    already reach the best, is refused before they start; an early best its GPUs can beat, a CPU that
    matters, or a live topology is not (two H200s: fifteen 2-core groups acquired for 32 s, BENCHMARKS.md 45)."""
    from autohet.tuning.trial_setup import regroup_shortfall

    manager = _manager(nine_core_gpu_machine)
    assert manager.cpu_regroup({"cpu_group_size": 4}) is None  # nothing live, nothing measured yet
    manager.calibrate(0.1)  # the GPU at 256000 img/s, each one-core group at 10
    regrouped = manager.cpu_regroup({"cpu_group_size": 4})
    assert regrouped == (2, 80.0, 256000.0)  # exact: two new 4-core groups; 8 cores x 10; the test's own figures
    assert manager.cpu_regroup({}) is None  # the live topology
    why = regroup_shortfall(256000.0, *regrouped, {"cpu_group_size": 4})
    assert why is not None and "cpu_group_size=4" in why and "2 CPU group(s)" in why
    assert regroup_shortfall(120000.0, *regrouped, {"cpu_group_size": 4}) is None  # its GPU can beat this best
    assert regroup_shortfall(3000.0, 2, 80.0, 0.0, {"cpu_group_size": 4}) is None  # a CPU that matters
    assert regroup_shortfall(None, *regrouped, {"cpu_group_size": 4}) is None  # no best yet
    manager.acquire({"cpu_group_size": 4}, {})
    assert manager.cpu_regroup({"cpu_group_size": 4}) is None  # live now


def _stopping_manager(monkeypatch: pytest.MonkeyPatch, cpu_regroup: Any, partition_gain: Any, best: float,
                      cpu_gain: tuple[str, float] | None = None) -> tuple[Any, list[dict]]:
    """run_trial against a stand-in manager answering the refusals' questions, whose ``acquire`` records the
    pool params it was asked for and stops the trial there: (a throughput trial's setup, those records)."""
    import ray

    from autohet.tuning import trainable

    monkeypatch.setattr(ray, "get", lambda value: value)
    acquired: list[dict] = []

    def _acquire(pool_params: dict, exec_params: dict, only: Any) -> None:
        acquired.append(pool_params)
        raise trainable.UserError("stop here: acquired")

    manager = SimpleNamespace(cpu_regroup=_Remote(cpu_regroup), partition_gain=_Remote(partition_gain),
                              best_speed=_Remote(lambda: best), acquire=_Remote(_acquire),
                              cpu_gain=_Remote(lambda: cpu_gain))
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace=None: manager)
    setup = trainable.TrialSetup(ModelSpec("lenet"), Workload(np.zeros((1, 1, 28, 28), np.float32), 8),
                                 "throughput", "m", 16, 0.5, 10)
    return setup, acquired


def test_a_trial_on_a_negligible_cpu_regroup_is_refused_without_acquiring(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_trial asks ``cpu_regroup`` before ``acquire``: a refused data-parallel trial starts nothing; a
    ``single`` on the same topology is acquired (the CPU singles find the groups' figures), as is a per-request
    trial."""
    from autohet.tuning import trainable

    # two new 2-core groups of a CPU at 10 img/s a core, beside a GPU that ran the best
    setup, acquired = _stopping_manager(monkeypatch, lambda pool_params: (2, 40.0, 256000.0),
                                        lambda pool_params: None, 256000.0)
    fifo = trainable.run_trial({"strategy": "fifo", "pool.cpu_group_size": 2}, setup)
    assert fifo["status"] == "refused" and "2 CPU group(s)" in fifo["error"] and acquired == []
    single = trainable.run_trial({"strategy": "single", "single.executor": 1, "pool.cpu_group_size": 2}, setup)
    assert single["error"] == "stop here: acquired" and acquired == [{"cpu_group_size": 2}]
    latency = dataclasses.replace(setup, objective="latency")
    assert trainable.run_trial({"strategy": "fifo", "pool.cpu_group_size": 2}, latency)["error"].startswith("stop")


def test_other_cpu_groups_are_refused_where_groups_working_beside_the_gpus_added_nothing(
        nine_core_gpu_machine: PoolSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two H200s: resnet18's fifo ran 141887 img/s with 4-core groups beside the GPUs against 159540 without, yet
    the groups' standalone figures bounded what the CPU could add at 4.8% of the best, so a sampled regroup into
    fifteen 2-core groups started and cost 25 s of acquiring (BENCHMARKS.md 47). The manager keeps each
    data-parallel strategy's best with CPU groups taking work and without (``cpu_gain``); where the groups added
    under ``NEGLIGIBLE_SHARE`` to every strategy measured both ways, a topology of other groups is refused."""
    from autohet.tuning import trainable
    from autohet.tuning.trial_setup import regroup_shortfall

    manager = _manager(nine_core_gpu_machine)
    assert manager.cpu_gain() is None
    manager.record_speed(159540.0, None, "fifo", False)
    manager.record_speed(141887.0, None, "fifo", True)
    manager.record_speed(147000.0, None, "hat", True)  # one way only: no comparison
    name, gain = manager.cpu_gain()
    assert name == "fifo" and gain == pytest.approx(141887.0 / 159540.0 - 1.0)
    why = regroup_shortfall(159540.0, 15, 7622.0, 158020.0, {"cpu_group_size": 2}, cpu_gain=(name, gain))
    assert why is not None and "15 CPU group(s)" in why and "fifo's best by -11.1%" in why
    assert regroup_shortfall(159540.0, 15, 7622.0, 158020.0, {"cpu_group_size": 2}) is None  # the bound alone
    assert regroup_shortfall(159540.0, 15, 7622.0, 158020.0, {"cpu_group_size": 2}, cpu_gain=("fifo", 0.05)) is None
    manager.record_speed(175000.0, None, "fast_split", True)  # a strategy the groups helped: not refused
    manager.record_speed(160000.0, None, "fast_split", False)
    assert manager.cpu_gain()[0] == "fast_split"
    setup, acquired = _stopping_manager(monkeypatch, lambda pool_params: (15, 7622.0, 158020.0),
                                        lambda pool_params: None, 159540.0, ("fifo", gain))
    fifo = trainable.run_trial({"strategy": "fifo", "pool.cpu_group_size": 2}, setup)
    assert fifo["status"] == "refused" and "against the GPUs alone" in fifo["error"] and acquired == []


def test_partitions_of_a_gpu_already_full_at_its_batches_are_refused_before_they_start(
        nine_core_gpu_machine: PoolSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """``batch_doubling_gain``, ``partition_gain`` and ``partition_shortfall``: a topology that would start GPU
    partitions is refused where a whole GPU rose under ``SATURATED_GAIN`` from a batch to twice it; a GPU that
    still gained, a pair not measured, or partitions already live are not (two H200s: one sampled partitioned
    vgg16 trial cost 57 s of acquiring, BENCHMARKS.md 46)."""
    from autohet.tuning.trial_setup import partition_shortfall

    monkeypatch.setattr(pool_spec_module, "_local_sm_shares", lambda parts: [64])
    manager = _manager(nine_core_gpu_machine, max_live_actors=64)
    assert manager.partition_gain({"gpu_partitions": 2}) is None  # nothing live
    manager.calibrate(0.1)
    assert manager.partition_gain({"gpu_partitions": 2}) is None  # one batch measured: no pair
    manager.acquire({}, {"gpu": {"batch": 512}})
    manager.standalone(0.1, None)  # the fake GPU runs 1000 img/s per image of its batch: twice the batch, 2x
    assert manager.partition_gain({"gpu_partitions": 2}) == 1.0  # exact: 512000 / 256000 - 1
    assert manager.partition_gain({"cpu_group_size": 4}) is None  # no partition in that topology
    whole = nine_core_gpu_machine.executors[0]
    cache = manager.standalone_cache.values
    cache[(executor_class(whole), None)] = 14000.0  # vgg16's walk on an H200: b256 14000, b512 13800, b128 13840
    cache[(executor_class(whole.with_params({"batch": 512})), None)] = 13800.0
    cache[(executor_class(whole.with_params({"batch": 128})), None)] = 13840.0
    gain = manager.partition_gain({"gpu_partitions": 2})
    assert gain == pytest.approx(14000.0 / 13840.0 - 1)
    why = partition_shortfall(gain, {"gpu_partitions": 2})
    assert why is not None and "gpu_partitions=2" in why and "+1.2%" in why
    assert partition_shortfall(0.05, {"gpu_partitions": 2}) is None  # a GPU that still gains: partitions may add
    assert partition_shortfall(None, {"gpu_partitions": 2}) is None
    manager.acquire({"gpu_partitions": 2}, {})
    assert manager.partition_gain({"gpu_partitions": 2}) is None  # live now: starting costs nothing


def test_a_trial_on_partitions_of_a_full_gpu_is_refused_without_acquiring(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_trial asks ``partition_gain`` before ``acquire``: a throughput trial on partitions of a full GPU
    starts nothing; a per-request trial is acquired."""
    from autohet.tuning import trainable

    setup, acquired = _stopping_manager(
        monkeypatch, lambda pool_params: None,
        lambda pool_params: 0.011 if pool_params.get("gpu_partitions", 1) > 1 else None, 28000.0)
    fifo = trainable.run_trial({"strategy": "fifo", "pool.gpu_partitions": 2}, setup)
    assert fifo["status"] == "refused" and "GPU partitions" in fifo["error"] and acquired == []
    whole = trainable.run_trial({"strategy": "fifo", "pool.gpu_partitions": 1}, setup)
    assert whole["error"] == "stop here: acquired" and acquired == [{"gpu_partitions": 1}]
    latency = dataclasses.replace(setup, objective="latency")
    assert trainable.run_trial({"strategy": "fifo", "pool.gpu_partitions": 2}, latency)["error"].startswith("stop")


def test_a_data_parallel_trial_beside_gpus_is_recorded_with_whether_cpu_groups_took_work() -> None:
    """What ``cpu_gain`` compares: a data-parallel trial over GPUs names its strategy and whether a CPU group
    took any image; a single, an engine family or a pool without a GPU is not compared."""
    from autohet.core.measurement import ExecutorReport, Measurement
    from autohet.executors import ExecutorSpec
    from autohet.tuning.trainable import _beside_gpus

    spec = PoolSpec("p", [ExecutorSpec("gpu0", "gpu", (0,), gpu=0), ExecutorSpec("cpu0", "cpu", (1,))])

    def measured(cpu_images: int) -> Measurement:
        reports = [ExecutorReport("gpu0", "cuda:0", 100 - cpu_images), ExecutorReport("cpu0", "cpu", cpu_images)]
        return Measurement("lenet", "fifo", {}, 100, 2.0, 50.0, 60.0, 50 / 60, True, 0.0, 1e-3, reports)

    assert _beside_gpus(measured(10), "fifo", spec) == ("fifo", True)
    assert _beside_gpus(measured(0), "fifo", spec) == ("fifo", False)  # the groups idle: the GPUs' own figure
    assert _beside_gpus(measured(10), "single", spec) == (None, None)
    assert _beside_gpus(measured(10), "pipeline", spec) == (None, None)
    cpus = PoolSpec("c", [ExecutorSpec("cpu0", "cpu", (0,)), ExecutorSpec("cpu1", "cpu", (1,))])
    assert _beside_gpus(measured(10), "fifo", cpus) == (None, None)


def test_the_manager_says_which_step_of_a_trials_call_it_is_in(nine_core_gpu_machine: PoolSpec) -> None:
    """What a trial stopped at the search's budget was waiting for (``now``, logged with it): the topology being
    started, the executors being set up, the standalone measurement; after a call, the call and its idle time,
    also where the call failed."""
    seen: list[dict[str, Any]] = []

    class Watched(FakePool):
        def start(self, model: ModelSpec, workload: Workload, adopt: dict[tuple, Any] | None = None) -> None:
            seen.append(manager.now())
            super().start(model, workload, adopt)

        def _apply_config(self, indices: list[int]) -> list[dict[str, Any]]:
            seen.append(manager.now())
            return super()._apply_config(indices)

        def standalone_ips(self, seconds: float, max_images: int | None = None,
                           indices: list[int] | None = None) -> list[float]:
            seen.append(manager.now())
            return super().standalone_ips(seconds, max_images, indices)

    manager = PoolManager(nine_core_gpu_machine, ModelSpec("lenet"),
                          Workload(np.zeros((1, 1, 28, 28), dtype=np.float32), 8), "t", pool_factory=Watched)
    assert manager.now() == {}
    manager.acquire({}, {"gpu": {"batch": 128}}, only=[0])
    assert [s["doing"] for s in seen] == [
        "acquiring executors: starting the topology gpu0, cpu0, cpu1, cpu2 and 5 more (9 new)",
        "acquiring executors: setting up gpu0 with the trial's executor params"]
    assert all(s["for_s"] >= 0 for s in seen)
    after = manager.now()
    assert after["after"] == "acquire" and after["idle_s"] >= 0 and "doing" not in after
    manager.standalone(0.1, None, used=[0])
    assert seen[-1]["doing"] == "measuring standalone figures" and manager.now()["after"] == "standalone measurement"

    def broken(spec: PoolSpec, prefix: str) -> Any:
        raise RuntimeError("no actor")

    manager.pool_factory = broken
    with pytest.raises(RuntimeError):
        manager.acquire({"cpu_group_size": 2}, {})
    assert manager.now()["after"] == "acquire"
