"""Real Ray actors on this machine: LeNet on pinned cores, declared fake GPU resources, a killed executor."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from autohet.context import RunContext
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, build_model
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec
from autohet.pool import PoolSpec, RayPool, load_pool
from autohet.strategies._driver import RAISE_MARGIN
from autohet.strategy_run import run_strategy
from autohet.tuning.ahead import RayAhead
from tests.numerics import assert_run_fp32_close

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # actors start in 5-20 s each on the 2-core box


def test_lenet_on_ray_actors_fast_split_output_ok(ray_local):
    workload = Workload.from_spec(WorkloadSpec(3000, (1, 28, 28)))
    pool = RayPool(load_pool("actors/cpu2.yaml"))
    try:
        m = run_strategy("fast_split", {}, pool, RunContext(ModelSpec("lenet"), workload,
                                                            standalone_seconds=0.3))
    finally:
        pool.shutdown()
    assert_run_fp32_close(m, build_model("lenet"))
    assert all(e.images > 0 and e.standalone_ips > 0 for e in m.executors)
    assert 0 < m.efficiency <= RAISE_MARGIN  # a group faster than its standalone figure raises the limit


def test_actors_are_reused_across_runs_and_reconfigured(ray_local):
    workload = Workload.from_spec(WorkloadSpec(500, (1, 28, 28)))
    pool = RayPool(load_pool("actors/cpu2.yaml"))
    try:
        ctx = RunContext(ModelSpec("lenet"), workload, standalone_seconds=0.1)
        run_strategy("fifo", {}, pool, ctx)
        first = list(pool.actors)
        pool.configure({"cpu": {"batch": 8}})
        m = run_strategy("hat", {}, pool, ctx)
        assert pool.actors == first
        assert m.output_ok
        assert all(e["batch"] == 8 for e in ray_local.get([a.configure.remote({}) for a in pool.actors]))
        # an idle executor set up ahead (``autohet.tuning.ahead``) holds that setting until the pool's next push
        runner = RayAhead()
        asked = time.time()
        job = runner.start(pool.actors[1], {"batch": 4}, frozenset(pool.spec.executors[1].cores))
        done = runner.wait(job)
        assert done is not None and done.compile_s == 0.0  # exact: eager compiles nothing
        assert done.ended_at is not None and asked <= done.ended_at <= time.time()  # one machine's clock
        assert ray_local.get(pool.actors[1].configure.remote({}))["batch"] == 4
        # or in a child of the actor's process (the one it keeps on standby), beside it: the actor holds nothing
        # new after; another actor's set-up queued after that child waits for its end, then holds the setting
        asked = time.time()
        runner.standby(pool.actors[1], frozenset(pool.spec.executors[1].cores))
        beside = runner.start_aside(pool.actors[1], {"batch": 2}, frozenset(pool.spec.executors[1].cores))
        queued = runner.start(pool.actors[0], {"batch": 2}, frozenset(pool.spec.executors[0].cores), after=beside)
        done = runner.wait(beside)
        assert done is not None and done.compile_s == 0.0  # exact: eager compiles nothing
        assert done.ended_at is not None and asked <= done.ended_at <= time.time()
        assert ray_local.get(pool.actors[1].configure.remote({}))["batch"] == 4
        after = runner.wait(queued)
        assert after is not None and after.held and after.ended_at >= done.ended_at
        assert ray_local.get(pool.actors[0].configure.remote({}))["batch"] == 2
        # queued after work that failed: it sets nothing up, and says so
        failed = ray_local.remote(num_cpus=0)(_fail).remote()
        skipped = runner.wait(runner.start(pool.actors[0], {"batch": 16}, frozenset(), after=failed))
        assert skipped is not None and not skipped.held
        assert ray_local.get(pool.actors[0].configure.remote({}))["batch"] == 2
        # work still running at its bound is given up (a task that ends in a minute, or never starts)
        hung = ray_local.remote(num_cpus=0)(_sleep).remote(60)
        assert runner.wait(hung, timeout=0.2) is None
        ray_local.cancel(hung, force=True)
    finally:
        pool.shutdown()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _fail() -> None:
    raise RuntimeError("a compile that failed")


def test_declared_fake_gpu_is_taken_by_the_simulated_gpu_executor(ray_local):
    workload = Workload.from_spec(WorkloadSpec(2000, (1, 28, 28)))
    pool = RayPool(load_pool("actors/sim_gpu.yaml"))
    try:
        pool.start(ModelSpec("lenet"), workload)
        assert ray_local.available_resources().get("GPU", 0) == 0  # the fake GPU is held
        m = run_strategy("fast_split", {}, pool, RunContext(ModelSpec("lenet"), workload))
        assert m.output_ok and m.simulated
        assert [e.device for e in m.executors] == ["simulated-gpu", "simulated"]
    finally:
        pool.shutdown()
    two = PoolSpec("two", [ExecutorSpec(f"g{i}", "sim", needs_gpu=True, speed_ips=10.0) for i in range(2)])
    with pytest.raises(UserError, match="needs 2 GPUs but the Ray cluster has 1"):
        RayPool(two).start(ModelSpec("lenet"), workload)


def test_an_executor_that_cannot_be_placed_ends_the_start_in_one_line(ray_local, monkeypatch):
    """The GPU held by another pool's actor: the new pool's GPU actor cannot start; the start ends
    with an error naming it instead of waiting forever."""
    import autohet.pool.ray_pool as pools

    workload = Workload.from_spec(WorkloadSpec(64, (1, 28, 28)))
    holder = RayPool(load_pool("actors/sim_gpu.yaml"))
    waiting = RayPool(PoolSpec("late", [ExecutorSpec("g9", "sim", needs_gpu=True, speed_ips=10.0)]))
    try:
        holder.start(ModelSpec("lenet"), workload)  # at the real bound: a loaded machine starts actors slowly
        monkeypatch.setattr(pools, "ACTOR_START_TIMEOUT_S", 3.0)  # the one that never starts: a short wait
        with pytest.raises(UserError, match=r"executors g9 did not start within 3 s"):
            waiting.start(ModelSpec("lenet"), workload)
    finally:
        waiting.shutdown()
        holder.shutdown()


def test_killed_executor_mid_run_work_is_redispatched(ray_local):
    spec = PoolSpec("sim3", [ExecutorSpec(f"s{i}", "sim", batch=10, speed_ips=4000.0) for i in range(3)])
    workload = Workload.from_spec(WorkloadSpec(3000, (1, 28, 28)))
    pool = RayPool(spec)
    seen = []

    def kill_second_after_first_completions(done):
        seen.append(done)
        if len(seen) == 3:
            pool.kill(1)

    try:
        ctx = RunContext(ModelSpec("lenet"), workload, on_event=kill_second_after_first_completions)
        m = run_strategy("fifo", {"c": 50}, pool, ctx)
    finally:
        pool.shutdown()
    assert m.output_ok, m.failures
    assert sum(e.images for e in m.executors) == 3000
    died = [e.name for e in m.executors if e.died]
    assert died == ["s1"]
    assert any("s1 died" in f for f in m.failures)
    units = sorted((u.start_image, u.size) for u in m.timeline if u.ok)
    covered = np.zeros(3000, int)
    for s, z in units:
        covered[s : s + z] += 1
    assert (covered == 1).all()


def test_large_units_run_as_parts_in_order_and_a_death_mid_unit_fails_the_whole_unit(ray_local):
    """batch 10 -> parts of 80 images; the executor dies on its 4th call, inside a 500-image unit."""
    spec = PoolSpec("parts", [ExecutorSpec("dies", "sim", batch=10, speed_ips=20000.0, extra={"die_after_units": 3}),
                              ExecutorSpec("lives", "sim", batch=10, speed_ips=20000.0)])
    workload = Workload.from_spec(WorkloadSpec(1000, (1, 28, 28)))
    pool = RayPool(spec)
    try:
        pool.start(ModelSpec("lenet"), workload)
        disp = pool.dispatcher()
        disp.submit(1, 0, 500)
        done = disp.wait_any()
        assert done.ok and done.outputs[:, 0].tolist() == list(range(500))
        disp.submit(0, 500, 500)
        failed = disp.wait_any()
        assert not failed.ok and (failed.start, failed.size) == (500, 500)
        m = run_strategy("fifo", {"c": 300}, pool, RunContext(ModelSpec("lenet"), workload))
        assert m.output_ok and [e.died for e in m.executors] == [True, False]
        assert m.executors[1].images == 1000
    finally:
        pool.shutdown()


def _fast_beside_slow(name: str, fast_ips: float, images: int, deadline_s: float) -> tuple[RayPool, RunContext]:
    """A pool (not started) of a fast simulated executor beside one at 10 img/s, and a run context
    over ``images`` lenet images cut at ``deadline_s``."""
    spec = PoolSpec(name, [ExecutorSpec("fast", "sim", speed_ips=fast_ips),
                           ExecutorSpec("slow", "sim", speed_ips=10.0)])
    workload = Workload.from_spec(WorkloadSpec(images, (1, 28, 28)))
    ctx = RunContext(ModelSpec("lenet"), workload, standalone_seconds=0.05, deadline_s=deadline_s)
    return RayPool(spec, f"{name}-test"), ctx


def test_a_run_past_its_deadline_is_cut_and_the_busy_executor_replaced(ray_local):
    """A hopeless unit (1000 images on a 10 img/s executor: 100 s) is cut at the 2 s deadline while it
    still runs; the replaced actor answers the next run (5 images, 0.5 s of work) within that run's
    own 30 s deadline instead of queueing behind the abandoned work. No speed is asserted: a run that
    waited for the hopeless unit, or a replacement behind it, ends in the wrong way, not a slow one."""
    from dataclasses import replace

    from ray.exceptions import RayActorError

    from autohet.core.errors import RunTimeout

    pool, ctx = _fast_beside_slow("cut", 50000.0, 2000, 2.0)
    try:
        pool.start(ModelSpec("lenet"), ctx.workload)
        # one unit each: the fast one's is done, the slow one's cannot be (not counted, still busy)
        with pytest.raises(RunTimeout, match=r"within 2 s \(1000 of 2000 images done; still busy: slow\)") as info:
            run_strategy("fifo", {"c": 1000}, pool, ctx)
        assert info.value.busy == [1]
        assert info.value.settle(0.2) == [1]  # its part (100 s of work) is not done after a short wait
        old = pool.actors[1]
        pool.replace(info.value.busy)
        assert pool.actors[1] is not old
        with pytest.raises(RayActorError):  # killed, not left running its 100 s unit (bounded: 30 s)
            ray_local.get(old.ping.remote(), timeout=30)
        try:
            m = run_strategy("single", {"executor": 1}, pool, replace(ctx, deadline_s=30.0).with_images(5))
        except RunTimeout as exc:
            pytest.fail(f"the replaced executor queued behind the abandoned unit: {exc}")
        assert m.output_ok and m.images == 5 and [e.images for e in m.executors] == [0, 5]
    finally:
        pool.shutdown()


def test_a_cut_run_names_only_the_executors_whose_sent_parts_do_not_finish_within_the_wait(ray_local):
    """A unit of 2.5 s on an executor cut at 1 s: after waiting 5 s for its sent parts it is done and
    needs no replacing (settle names nobody); the actor then runs the next run at once."""
    from autohet.core.errors import RunTimeout

    spec = PoolSpec("settle", [ExecutorSpec("quick", "sim", speed_ips=200.0)])
    workload = Workload.from_spec(WorkloadSpec(500, (1, 28, 28)))
    pool = RayPool(spec, "settle-test")
    try:
        pool.start(ModelSpec("lenet"), workload)
        ctx = RunContext(ModelSpec("lenet"), workload, standalone_seconds=0.05, deadline_s=1.0)
        with pytest.raises(RunTimeout) as info:
            run_strategy("single", {"executor": 0}, pool, ctx)
        assert info.value.busy == [0] and info.value.settle(30.0) == []
        m = run_strategy("single", {"executor": 0}, pool, ctx.with_images(20))
        assert m.output_ok and m.images == 20
    finally:
        pool.shutdown()


def test_a_cut_run_keeps_an_executor_done_at_once_beside_one_that_stays_busy(ray_local):
    """Both executors busy at the cut: the fast one's parts end in milliseconds, the slow one's unit
    (200 images at 10 img/s) outlives the wait. Only the slow one is named: the fast one's drain was
    not left waiting until the slow one's parts had used the whole wait (it then had none)."""
    from autohet.core.errors import RunTimeout

    pool, ctx = _fast_beside_slow("settle2", 4000.0, 40000, 1.0)
    try:
        pool.start(ModelSpec("lenet"), ctx.workload)
        with pytest.raises(RunTimeout) as info:
            run_strategy("fifo", {"c": 200}, pool, ctx)
        assert 1 in info.value.busy
        assert info.value.settle(2.0) == [1]
    finally:
        pool.shutdown()


def test_a_new_topology_adopts_the_actors_it_shares_with_the_old_one(ray_local):
    from ray.exceptions import RayActorError

    from autohet.pool import identity

    workload = Workload.from_spec(WorkloadSpec(200, (1, 28, 28)))
    gpu = ExecutorSpec("simgpu", "sim", needs_gpu=True, speed_ips=3000.0, overhead_s=0.001)
    old = RayPool(PoolSpec("old", [gpu, ExecutorSpec("a", "sim", speed_ips=500.0)]))
    new = RayPool(PoolSpec("new", [gpu, ExecutorSpec("b", "sim", speed_ips=800.0)]))
    try:
        old.start(ModelSpec("lenet"), workload)
        kept = {identity(gpu): old.actors[0]}
        new.start(ModelSpec("lenet"), workload, adopt=kept)
        assert new.actors[0] is kept[identity(gpu)] and new.adopted == 1
        old.kill(1)
        deadline = time.monotonic() + 60  # the old topology's own executor is independent: it dies
        while True:  # ray.kill lands asynchronously: a ping sent before it still runs
            try:
                ray_local.get(old.actors[1].ping.remote(), timeout=60)
            except RayActorError:
                break
            assert time.monotonic() < deadline, "the killed executor still answers pings 60 s later"
        m = run_strategy("fifo", {"c": 20}, new, RunContext(ModelSpec("lenet"), workload, standalone_seconds=0.05))
        assert m.output_ok and all(e.images > 0 for e in m.executors)
    finally:
        new.shutdown()
        old.shutdown()


class _RecordingActor:
    """Stands in for an executor actor in the dispatcher's protocol: each call is answered at once
    (an object already in the store) and recorded with the part it announced as next."""

    def __init__(self, ray) -> None:
        self.ray = ray
        self.calls: list[tuple[int, int, tuple[int, int] | None]] = []
        self.run = self

    def remote(self, start: int, size: int, following: tuple[int, int] | None = None):
        from autohet.executors.sim import sim_outputs

        self.calls.append((start, size, following))
        return self.ray.put((sim_outputs(start, size), size / 1000.0))


@pytest.mark.parametrize("lookahead", [True, False])
def test_lookahead_calls_name_the_next_units_first_part(ray_local, lookahead):
    """With lookahead the GPU's calls form one chain across unit boundaries (each names the call
    after it); without it the chain breaks at every unit's last part."""
    from autohet.pool.ray_dispatch import RayDispatcher
    from autohet.strategies import get_strategy
    from autohet.strategies._driver import drive

    gpu, cpu = _RecordingActor(ray_local), _RecordingActor(ray_local)
    disp = RayDispatcher(["gpu", "cpu"], [gpu, cpu], max_unit=[100, 40], lookahead=[True, False])
    fifo = get_strategy("fifo")
    result = drive(fifo, fifo.validate({"c": 250}), disp, 3000, lookahead=lookahead)
    assert result.coverage.tolist() == [1] * 3000
    # exact: simulated executors output the image indices
    assert np.array_equal(result.outputs[:, 0], np.arange(3000, dtype=np.float32))
    chain = [(s, z) for s, z, _ in gpu.calls]
    announced = [f for _, _, f in gpu.calls]
    assert len(chain) >= 6
    gpu_units = [u for u in result.timeline if u.executor == "gpu"]
    assert len(gpu_units) >= 2
    if lookahead:  # every announcement names the call after it, and the chain runs across unit boundaries;
        # the tail may break it: which unit comes last depends on which executor's answer the driver
        # reads first (a 3-image unit decided after the GPU's part before it had been sent, in one CI run)
        assert all(a is None or a == nxt for a, nxt in zip(announced, [*chain[1:], None], strict=True))
        assert announced[-1] is None and announced.count(None) < len(gpu_units)
    else:  # every unit's last call announces nothing
        assert announced.count(None) == len(gpu_units)
    cpu_announced = [f for _, _, f in cpu.calls]
    assert cpu_announced.count(None) == len([u for u in result.timeline if u.executor == "cpu"])


def test_a_simulated_gpu_dying_with_its_next_unit_queued_loses_neither(ray_local):
    """The GPU dies on its 4th call; the unit it ran and the one queued behind it are both re-dispatched."""
    spec = PoolSpec("ahead", [ExecutorSpec("gpu", "sim", needs_gpu=True, batch=10, speed_ips=20000.0,
                                           extra={"die_after_units": 3}),
                              ExecutorSpec("cpu", "sim", batch=10, speed_ips=5000.0)])
    workload = Workload.from_spec(WorkloadSpec(2000, (1, 28, 28)))
    pool = RayPool(spec)
    try:
        m = run_strategy("fifo", {"c": 50}, pool, RunContext(ModelSpec("lenet"), workload, standalone_seconds=0.05))
    finally:
        pool.shutdown()
    assert m.output_ok, m.failures
    assert [e.died for e in m.executors] == [True, False]
    assert len([f for f in m.failures if "gpu died" in f]) == 2
    assert sum(e.images for e in m.executors) == 2000


def _gated_pool(gate: str) -> Any:
    """A fake pool (``tests.test_manager.FakePool``) whose start waits until the file ``gate`` exists: an
    acquire held in the manager actor for as long as the test wants, on no clock."""
    from pathlib import Path

    from tests.test_manager import FakePool

    class Gated(FakePool):
        def start(self, model: Any, workload: Any, adopt: Any = None) -> None:
            for _ in range(1200):  # at most 60 s: the test opens the gate as soon as it has asked
                if Path(gate).exists():
                    break
                time.sleep(0.05)
            super().start(model, workload, adopt)

    return Gated


def test_the_manager_actor_says_what_it_does_while_an_acquire_holds_it(ray_local, tmp_path):
    """A trial the search's time budget stopped is logged with what the manager was doing for it
    (``study.stopped_trials``): the actor as a tune starts it answers ``now`` from its own thread while an
    acquire still holds it, and its other calls still go one at a time."""
    import functools

    from autohet.tuning.manager import ask_now, remote_manager

    gate = tmp_path / "open"
    spec = PoolSpec("p", [ExecutorSpec("cpu0", "cpu", (0,)), ExecutorSpec("cpu1", "cpu", (1,))])
    manager = remote_manager(f"autohet-manager-now-{time.time_ns()}").remote(
        spec, ModelSpec("lenet"), Workload(np.zeros((1, 1, 28, 28), dtype=np.float32), 8), "now",
        pool_factory=functools.partial(_gated_pool_factory, str(gate)))
    try:
        assert ask_now(manager, 60.0) == {}
        acquired = manager.acquire.remote({}, {})
        for _ in range(600):  # until the acquire has begun: the status thread answers meanwhile
            now = ask_now(manager, 5.0)
            if now and "doing" in now:
                break
            time.sleep(0.05)
        assert now["doing"] == "acquiring executors: starting the topology cpu0, cpu1 (2 new)"
        queued = manager.best_speed.remote()  # the default group: behind the acquire
        assert ray_local.wait([queued], timeout=0.5)[0] == []
        gate.write_text("")
        ray_local.get(acquired, timeout=60)
        assert ray_local.get(queued, timeout=60) is None and ask_now(manager, 60.0)["after"] == "acquire"
    finally:
        gate.write_text("")
        ray_local.kill(manager)


def _gated_pool_factory(gate: str, spec: PoolSpec, prefix: str) -> Any:
    return _gated_pool(gate)(spec, prefix)
