"""Each scheduler's rule, on a deterministic virtual clock (no Ray, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from autohet.pool import VirtualClockDispatcher
from autohet.strategies import get_strategy
from autohet.strategies._driver import drive, split_by_weights


def run(name: str, speeds, total=10000, overheads=None, die_at=None, lookahead=None, on=True, **params):
    """``lookahead`` marks the executors that may queue a next unit; ``on`` is the driver's switch."""
    strategy = get_strategy(name)
    checked = strategy.validate(params)
    names = [f"e{i}" for i in range(len(speeds))]
    disp = VirtualClockDispatcher(names, list(speeds), overheads, die_at, lookahead)
    result = drive(strategy, checked, disp, total, lookahead=on)
    return result, checked


def units_of(result, executor=None):
    return [u for u in result.timeline if executor is None or u.executor == executor]


def assert_exactly_once_in_order(result, total):
    assert result.coverage.tolist() == [1] * total
    # exact: simulated executors output the image indices
    assert np.array_equal(result.outputs[:, 0], np.arange(total, dtype=np.float32))


def test_split_by_weights_sums_exactly_and_is_proportional():
    assert split_by_weights(10, [1, 1, 1]) == [4, 3, 3]
    assert split_by_weights(100, [1, 3]) == [25, 75]
    assert sum(split_by_weights(997, [0.3, 2.2, 9.1])) == 997
    assert split_by_weights(5, [0, 0]) == [3, 2]  # no information: equal
    assert split_by_weights(0, [1, 2]) == [0, 0]


@pytest.mark.parametrize("name", ["single", "static", "quick", "chunk", "hat", "fifo", "fast_split"])
def test_every_image_exactly_once_and_in_order(name):
    result, _ = run(name, [1000.0, 3000.0, 500.0], total=5003, overheads=[0.01, 0.002, 0.0])
    assert_exactly_once_in_order(result, 5003)
    assert sum(result.images_by_executor) == 5003


def test_single_uses_one_executor():
    result, _ = run("single", [1000.0, 3000.0], executor=1)
    assert [u.executor for u in result.timeline] == ["e1"]
    assert result.images_by_executor == [0, 10000]


def test_static_shares_follow_ratios_or_are_equal():
    result, _ = run("static", [1000.0, 3000.0], total=1000, ratios=[1, 3])
    assert result.images_by_executor == [250, 750]
    result, _ = run("static", [1000.0, 3000.0, 10.0], total=1000)
    assert result.images_by_executor == [334, 333, 333]


def test_quick_probes_then_splits_once_by_measured_speed():
    result, _ = run("quick", [1000.0, 3000.0], total=10000, p=100)
    sizes = [(u.executor, u.size) for u in result.timeline]
    assert sorted(sizes[:2]) == [("e0", 100), ("e1", 100)]
    assert len(sizes) == 4
    second = dict(sizes[2:])
    assert second == {"e0": 2450, "e1": 7350}  # 9800 split 1:3


def test_chunk_rounds_total_w_with_barrier_and_speed_split():
    result, _ = run("chunk", [1000.0, 3000.0], total=2000, w=400)
    rounds = [result.timeline[i : i + 2] for i in range(0, len(result.timeline), 2)]
    assert sorted(u.size for u in rounds[0]) == [200, 200]  # round 1: equal
    for prev, nxt in zip(rounds, rounds[1:], strict=False):
        assert min(u.start_s for u in nxt) >= max(u.end_s for u in prev) - 1e-12  # barrier
        assert sum(u.size for u in nxt) == 400
        assert {u.executor: u.size for u in nxt} == {"e0": 100, "e1": 300}


def test_hat_doubles_while_finish_times_differ_then_splits_the_rest():
    # overheads make small rounds unbalanced: doubling until little is left
    result, _ = run("hat", [1000.0, 3000.0], total=10000, overheads=[0.05, 0.0], s=100, tol=0.01)
    per_round = {}
    for u in result.timeline:
        per_round.setdefault(round(u.start_s, 9), 0)
        per_round[round(u.start_s, 9)] += u.size
    totals = [per_round[k] for k in sorted(per_round)]
    assert totals[0] == 100
    for a, b in zip(totals[:-2], totals[1:-1], strict=False):
        assert b == 2 * a
    assert totals[-1] == 10000 - sum(totals[:-1])
    assert totals[-1] <= 2 * totals[-2] * 2


def test_hat_sends_everything_once_finish_times_are_close():
    result, _ = run("hat", [1000.0, 1000.0], total=10000, s=100, tol=0.1)
    assert [u.size for u in result.timeline] == [50, 50, 4950, 4950]


def test_fifo_hands_fixed_chunks_without_barrier():
    result, _ = run("fifo", [1000.0, 3000.0], total=1000, c=50)
    assert all(u.size == 50 for u in result.timeline)
    fast = units_of(result, "e1")
    slow = units_of(result, "e0")
    assert len(fast) > 2 * len(slow)  # the fast executor is not held back by the slow one
    assert len(result.timeline) == 20


def test_fast_split_probe_phase_then_proportional_then_rest():
    speeds = [1000.0, 4000.0]
    result, params = run("fast_split", speeds, total=10000, w_s=100, r=0.5, threshold=100)
    tl = result.timeline
    # probe phase: the fast executor gets probe chunks again until the slow one finished its first
    slow_first_end = units_of(result, "e0")[0].end_s
    probes = [u for u in tl if u.start_s < slow_first_end]
    assert all(u.size == 100 for u in probes)
    assert len(units_of(result, "e1")) >= 3 and units_of(result, "e1")[2].size == 100
    # thereafter: w_i = remaining * r * v_i / max(v), with remaining as seen at the time
    remaining = 10000 - sum(u.size for u in probes)
    later = sorted((u for u in tl if u.start_s >= slow_first_end), key=lambda u: (u.start_s, u.executor))
    assert later
    capped = 0
    for u in later:
        v = speeds[int(u.executor[1])]
        # below the threshold: all of the rest at once
        rule = max(1, int(remaining * 0.5 * v / max(speeds))) if remaining >= 100 else remaining
        assert 1 <= u.size <= rule
        capped += u.size < rule  # the driver's even-finish cap, only in the tail
        remaining -= u.size
    assert remaining == 0 and capped <= 2


def test_fast_split_gives_all_the_rest_below_threshold():
    result, _ = run("fast_split", [1000.0, 1000.0], total=1000, w_s=100, r=0.5, threshold=300)
    sizes = [u.size for u in sorted(result.timeline, key=lambda u: u.start_s)]
    # both probes end at t=0.1; e0 is seen first while e1 has not reported, so e0 probes again;
    # then 700 left -> 350 (e1); 350 -> 175 (e0); 175 < 300 -> all of it to e0 (idle at 0.375), but the
    # driver's even-finish cap leaves e1 (busy until 0.45) its share: 125 and 50, both end at 0.5
    assert sizes == [100, 100, 100, 350, 175, 125, 50]
    assert [u.end_s for u in result.timeline if u.size in (125, 50)] == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("params", [{"w_s": 1, "r": 0.996, "threshold": 1, "unit": "batches"},
                                    {"c": 1, "unit": "batches"}])
@pytest.mark.parametrize("total", [64, 103, 1000])
def test_dynamic_schedulers_end_together_on_equal_executors(params, total):
    # vgg16 on two 1-core groups (2.5 img/s, batches of 16): fast_split's r ~ 1 handed one core 70 of
    # the last 71 images while the other idled; the driver caps each unit at an even finish
    name = "fast_split" if "w_s" in params else "fifo"
    strategy = get_strategy(name)
    disp = VirtualClockDispatcher(["e0", "e1"], [2.5, 2.5], None, None, [True, True])
    result = drive(strategy, strategy.validate(params), disp, total, batches=[16, 16])
    ends = [max(u.end_s for u in units_of(result, e)) for e in ("e0", "e1")]
    assert result.coverage.tolist() == [1] * total
    assert max(ends) <= total / 5.0 + 1 / 2.5 + 1e-9  # within one image of the ideal makespan
    assert abs(ends[0] - ends[1]) <= 1 / 2.5 + 1e-9


@pytest.mark.parametrize("name", ["static", "quick", "chunk", "hat", "fifo", "fast_split"])
def test_dead_executor_work_is_redispatched_exactly_once(name):
    result, _ = run(name, [1000.0, 1000.0, 1000.0], total=3000, die_at={1: 0.05})
    assert_exactly_once_in_order(result, 3000)
    assert result.died == [False, True, False]
    assert result.failures and "e1 died" in result.failures[0]
    assert result.images_by_executor[1] < 1000


def test_all_executors_dead_is_an_error():
    from autohet.core.errors import UserError

    with pytest.raises(UserError, match="every executor died"):
        run("fifo", [1000.0, 1000.0], total=3000, die_at={0: 0.01, 1: 0.01})


def run_batched(name: str, speeds, batches, total=10000, **params):
    strategy = get_strategy(name)
    checked = strategy.validate(params)
    disp = VirtualClockDispatcher([f"e{i}" for i in range(len(speeds))], list(speeds))
    return drive(strategy, checked, disp, total, batches=batches), checked


@pytest.mark.parametrize(("name", "params"), [("fifo", {"c": 2}), ("quick", {"p": 2}),
                                              ("fast_split", {"w_s": 2})])
def test_unit_batches_sizes_fixed_work_in_each_executors_batches(name, params):
    """unit=batches: the first fixed size is that many of each executor's own batches."""
    result, _ = run_batched(name, [100.0, 10000.0], [8, 256], unit="batches", **params)
    first = {u.executor: u.size for u in reversed(result.timeline)}
    assert first == {"e0": 16, "e1": 512}
    assert_exactly_once_in_order(result, 10000)
    images, _ = run_batched(name, [100.0, 10000.0], [8, 256], **params)  # the seed's rule: images
    assert {u.executor: u.size for u in reversed(images.timeline)} == {"e0": 2, "e1": 2}


def test_a_deadline_cuts_the_run_and_names_the_busy_executors():
    from autohet.core.errors import RunTimeout

    strategy = get_strategy("static")
    disp = VirtualClockDispatcher(["fast", "slow"], [1000.0, 1.0])
    with pytest.raises(RunTimeout, match="static did not finish within 5 s") as info:
        drive(strategy, strategy.validate({}), disp, 2000, deadline_s=5.0)
    assert info.value.busy == [1] and info.value.settle(60.0) == [1]  # it cannot wait: every busy one
    result = drive(strategy, strategy.validate({}), VirtualClockDispatcher(["a", "b"], [1000.0, 1000.0]), 2000,
                   deadline_s=5.0)
    assert_exactly_once_in_order(result, 2000)


def run_ahead(name: str, speeds, lookahead, **kwargs):
    return run(name, speeds, lookahead=lookahead, **kwargs)[0]


def no_overlap_per_executor(result):
    for name in {u.executor for u in result.timeline}:
        units = sorted((u for u in result.timeline if u.executor == name), key=lambda u: u.start_s)
        for a, b in zip(units, units[1:], strict=False):
            assert b.start_s >= a.end_s - 1e-12, (name, a, b)


@pytest.mark.parametrize("name", ["static", "quick", "chunk", "hat", "fifo", "fast_split"])
def test_lookahead_keeps_every_image_exactly_once_and_units_never_overlap(name):
    result = run_ahead(name, [1000.0, 30000.0], [False, True], total=5003, overheads=[0.01, 0.005])
    assert_exactly_once_in_order(result, 5003)
    no_overlap_per_executor(result)


def test_lookahead_queues_the_gpus_next_unit_and_hides_its_round_trip():
    """fifo with a 5 ms round trip per unit on the fast executor: with lookahead it is paid once."""
    args = ("fifo", [1000.0, 30000.0], [False, True])
    plain = run_ahead(*args, total=30000, overheads=[0.0, 0.005], on=False, c=300)
    ahead = run_ahead(*args, total=30000, overheads=[0.0, 0.005], c=300)
    assert_exactly_once_in_order(ahead, 30000)
    gpu = sorted(units_of(ahead, "e1"), key=lambda u: u.start_s)
    assert all(b.start_s == pytest.approx(a.end_s) for a, b in zip(gpu, gpu[1:], strict=False))
    assert ahead.wall_s < 0.8 * plain.wall_s
    # the slow executor has no lookahead: one unit at a time, each after a round trip of its own; each
    # executor's last unit is cut to an even finish
    last = {e: max(units_of(ahead, e), key=lambda u: u.start_s) for e in ("e0", "e1")}
    assert all(u.size == 300 for u in ahead.timeline if u not in last.values())


def test_barrier_strategies_ignore_lookahead():
    for name in ("chunk", "hat", "quick", "static"):
        plain = run_ahead(name, [1000.0, 3000.0], [True, True], total=4000, overheads=[0.01, 0.0], on=False)
        ahead = run_ahead(name, [1000.0, 3000.0], [True, True], total=4000, overheads=[0.01, 0.0])
        assert [(u.executor, u.start_image, u.size, u.end_s) for u in ahead.timeline] == \
            [(u.executor, u.start_image, u.size, u.end_s) for u in plain.timeline]


@pytest.mark.parametrize("name", ["fifo", "fast_split"])
def test_lookahead_executor_dying_with_two_units_queued_loses_neither(name):
    params = {"c": 200} if name == "fifo" else {}
    result = run_ahead(name, [1000.0, 20000.0, 1000.0], [False, True, False], total=6000, die_at={1: 0.03},
                       **params)
    assert_exactly_once_in_order(result, 6000)
    assert result.died == [False, True, False]
    assert len([f for f in result.failures if "e1 died" in f]) == 2  # the running unit and the queued one


class _AsyncFake:
    """A test double of an asynchronous executor (a GPU): ``launch`` queues a unit and returns, the unit
    runs for 20 ms on its own 'device' thread, ``collect`` waits for it. Outputs: the image indices."""

    launches_async = True

    def __init__(self, name: str, events: list) -> None:
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from autohet.executors import ExecutorSpec

        self.spec = ExecutorSpec(name, "sim", batch=10, speed_ips=500.0)
        self.device = ThreadPoolExecutor(1)  # its units run one after another, as a GPU stream's
        self.events, self.lock = events, threading.Lock()

    def launch(self, start: int, size: int):
        import time

        with self.lock:
            self.events.append(("launch", self.spec.name, start))

        def unit():
            time.sleep(0.02)
            return np.arange(start, start + size, dtype=np.float32).reshape(-1, 1)

        return start, self.device.submit(unit)

    def collect(self, handle):
        from autohet.executors.base import UnitResult

        start, future = handle
        outputs = future.result()
        with self.lock:
            self.events.append(("collected", self.spec.name, start))
        return UnitResult(outputs, 0.02)


def test_an_in_process_asynchronous_executor_gets_its_next_unit_while_the_current_one_runs():
    """Issue 46: two GPUs of one process (``LocalDispatcher``) each queue their next unit before the
    current one is collected (lookahead), so neither idles while the driver decides; every image once,
    in order."""
    from autohet.pool import LocalDispatcher
    from autohet.pool.worker import Worker

    events: list = []
    fakes = [_AsyncFake(f"g{k}", events) for k in range(2)]
    workers = [Worker(f.spec.name) for f in fakes]
    dispatcher = LocalDispatcher(fakes, workers)
    try:
        strategy = get_strategy("fifo")
        result = drive(strategy, strategy.validate({"c": 1, "unit": "batches"}), dispatcher, 200, batches=[10, 10])
    finally:
        for w in workers:
            w.close()
        for f in fakes:
            f.device.shutdown()
    # exact: the test double outputs the image indices
    assert np.array_equal(result.outputs[:, 0], np.arange(200, dtype=np.float32))
    for name in ("g0", "g1"):
        mine = [(kind, start) for kind, who, start in events if who == name]
        first_collect = next(k for k, (kind, _) in enumerate(mine) if kind == "collected")
        assert [kind for kind, _ in mine[:first_collect]].count("launch") >= 2  # the next unit queued first
