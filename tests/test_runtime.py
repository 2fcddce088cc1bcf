"""``autohet.load``: every family's exported config returns the single-device reference's outputs for
one call, a stream and two threads at once; plans are taken from the config or measured once at
load; bad input is one line; a Ray executor killed mid-call loses nothing."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import autohet
from autohet.config import RunConfig, write_config
from autohet.context import TOLERANCE
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, build_model, input_shape
from autohet.executors import ExecutorSpec
from autohet.pool import LocalPool, PoolSpec, load_pool
from autohet.strategies import get_strategy

CPU2 = "actors/cpu2.yaml"


def write(tmp_path, model: str, strategy: str, params: dict, objective: str = "throughput", images: int = 64,
          plan: dict | None = None):
    config = RunConfig(ModelSpec(model), load_pool(CPU2), strategy, params, images=images, objective=objective,
                       plan=plan or {})
    return write_config(config, tmp_path / f"{model}-{strategy}-{objective}.yaml")


def family_params(model: str, family: str) -> tuple[str, str, dict]:
    """(strategy, objective, params) of a small given plan of each family on actors/cpu2.yaml, sized
    from the strategy's own vector lengths for the model."""
    spec = load_pool(CPU2)
    if family == "data_parallel":
        return "fast_split", "throughput", {"w_s": 2, "threshold": 2}
    if family == "single_latency":
        return "single", "latency", {"executor": 1}
    if family == "placement":
        blocks = get_strategy("placement").space_sizes(ModelSpec(model), spec)["blocks"]
        vector = [0] * (blocks // 2) + [1] * (blocks - blocks // 2)
        return "placement", "latency", {"start": "given", "assignment": vector, "x": 0}
    if family == "pipeline":
        blocks = get_strategy("pipeline").space_sizes(ModelSpec(model), spec)["blocks"]
        return "pipeline", "throughput", {"start": "given", "cuts": [blocks // 2], "stages": [0, 1], "batch": 2}
    if family == "split":
        return "split", "throughput", {"start": "given", "ratios": [0.5], "rest": 0, "batch": 2}
    if family == "coedge":
        return "coedge", "latency", {"ratios": [0.4, 0.6], "rest": 1}
    layers = get_strategy("channels").space_sizes(ModelSpec(model), spec)["layers"]
    return "channels", "throughput", {"start": "given", "shares": [0.5] * layers, "rest": 0, "batch": 2}


FAMILIES = ["data_parallel", "single_latency", "placement", "pipeline", "split", "coedge", "channels"]


def reference(model: str, images: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return build_model(ModelSpec(model))(torch.from_numpy(images)).numpy()


def close_to(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.shape == ref.shape and out.dtype == np.float32
    tol = TOLERANCE["fp32"] * float(np.abs(ref).max())
    assert float(np.abs(out - ref).max()) <= tol


@pytest.mark.parametrize("model", ["lenet", pytest.param("resnet18", marks=pytest.mark.slow)])  # resnet18: 10-20 s
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_returns_the_reference_for_a_call_a_stream_and_two_threads(tmp_path, model, family):
    strategy, objective, params = family_params(model, family)
    x = np.random.default_rng(1).standard_normal((9, *input_shape(model)), dtype=np.float32)
    ref = reference(model, x)
    with autohet.load(write(tmp_path, model, strategy, params, objective)) as runner:
        close_to(runner(x[:3]), ref[:3])  # one call (the checked one)
        assert runner.checked and runner.check_result["max_abs_diff"] <= runner.check_result["tolerance"]
        stream = list(runner.map([x[3:5], x[5:5], x[5:6]]))  # an empty batch keeps its place
        assert [len(o) for o in stream] == [2, 0, 1]
        close_to(np.concatenate(stream), ref[3:6])
        got: dict[int, np.ndarray] = {}
        barrier = threading.Barrier(2)

        def call(k: int) -> None:
            barrier.wait(60)
            got[k] = runner(x[6 + k * 2 : 8 + k * 2][:2 - k])

        threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert set(got) == {0, 1}, f"calls from two threads did not both return within 120 s: {sorted(got)}"
        close_to(got[0], ref[6:8])
        close_to(got[1], ref[8:9])
        assert runner.deaths == []


@pytest.mark.slow  # more than 10 s on the 2-core box
@pytest.mark.parametrize("family", ["placement", "pipeline", "split", "coedge", "channels"])
def test_a_greedy_config_is_planned_once_at_load_and_its_export_runs_the_planned_vectors(tmp_path, family):
    """The run's plan (``plan_params``, what the tuner exports under ``plan``) loads as given and
    nothing is measured; the same config without it is planned once, at load."""
    from autohet.context import RunContext
    from autohet.core.workload import workload_for
    from autohet.strategy_run import run_strategy

    strategy, objective, given = family_params("lenet", family)
    params = {k: v for k, v in given.items() if k in ("batch", "x")} | {"runs": 1}
    if family == "channels":
        params["compare"] = False
    ctx = RunContext(ModelSpec("lenet"), workload_for("lenet", 16), check_images=8, mode=objective, latency_runs=4,
                     standalone_seconds=0.05)
    m = run_strategy(strategy, params, LocalPool(load_pool(CPU2)), ctx)
    assert m.output_ok, m.failures
    plan = get_strategy(strategy).plan_params(m.params, m.extra)
    assert plan
    x = np.random.default_rng(2).standard_normal((3, 1, 28, 28), dtype=np.float32)
    with autohet.load(write(tmp_path, "lenet", strategy, params, objective, plan=plan)) as runner:
        served = runner.describe()["served"]
        close_to(runner(x), reference("lenet", x))
    assert served.get("planned") is not True and not served.get("measured_alone")
    ran = {"placement": ("assignment", "assignment_vector"), "pipeline": ("cuts", "cuts"),
           "split": ("ratios", "ratios"), "coedge": ("ratios", "ratios"), "channels": ("pairing", "pairing")}[family]
    assert served[ran[0]] == m.extra[ran[1]]
    with autohet.load(write(tmp_path, "lenet", strategy, params, objective)) as greedy:
        close_to(greedy(x), reference("lenet", x))
        served = greedy.describe()["served"]
    assert served.get("planned") is True or served.get("measured_alone")


def test_bad_input_is_one_line_naming_the_fix(tmp_path):
    import torch

    with autohet.load(write(tmp_path, "lenet", "fifo", {"c": 8})) as runner:
        image = np.zeros((1, 28, 28), np.float32)
        cases = [(image, "add the batch axis"), (np.zeros((2, 3, 28, 28), np.float32), "resize and crop"),
                 (np.zeros((2, 1, 28, 28)), "astype(numpy.float32)"), ([image], "numpy array or a torch tensor"),
                 (torch.zeros((2, 1, 28, 28), dtype=torch.float64), "x.float()")]
        for bad, fix in cases:
            with pytest.raises(UserError, match=re.escape(fix)) as info:
                runner(bad)
            assert len(str(info.value).splitlines()) == 1
        assert runner(np.zeros((0, 1, 28, 28), np.float32)).shape == (0, 10)
        out = runner(torch.zeros((3, 1, 28, 28)))
        assert isinstance(out, torch.Tensor) and out.shape == (3, 10)
        with pytest.raises(UserError, match="dtype is float64"):
            list(runner.map([np.zeros((1, 1, 28, 28), np.float32), np.zeros((1, 1, 28, 28))]))
    with pytest.raises(UserError, match="closed"):
        runner(np.zeros((1, 1, 28, 28), np.float32))


def test_a_config_whose_outputs_differ_fails_its_first_call(tmp_path, monkeypatch):
    """A device that computes wrong (simulated: the served outputs perturbed) fails the first call's
    check in one line; check=False serves it unchecked."""
    from autohet.strategies.data_parallel import DataParallelServed

    real = DataParallelServed.__call__
    monkeypatch.setattr(DataParallelServed, "__call__", lambda self, images: real(self, images) + 1.0)
    path = write(tmp_path, "lenet", "fifo", {"c": 8})
    x = np.zeros((4, 1, 28, 28), np.float32)
    with autohet.load(path) as runner:
        with pytest.raises(UserError, match="does not reproduce its outputs on this machine") as info:
            runner(x)
        assert len(str(info.value).splitlines()) == 1 and not runner.checked
    with autohet.load(path, check=False) as unchecked:
        assert unchecked(x).shape == (4, 10)


def test_load_serves_other_weights_another_pool_and_one_executor(tmp_path):
    """``checkpoint=`` reaches every family's model (placement's blocks included); ``pool=`` runs the
    config on another pool file; ``executor=`` one executor of a data-parallel config."""
    import torch

    weights = tmp_path / "trained.pt"
    torch.save(build_model(ModelSpec("lenet", seed=7)).state_dict(), weights)
    x = np.random.default_rng(4).standard_normal((4, 1, 28, 28), dtype=np.float32)
    with torch.inference_mode():
        trained = build_model(ModelSpec("lenet", 0, str(weights)))(torch.from_numpy(x)).numpy()
    strategy, objective, params = family_params("lenet", "placement")
    with autohet.load(write(tmp_path, "lenet", strategy, params, objective), checkpoint=str(weights)) as runner:
        close_to(runner(x), trained)
    fifo = write(tmp_path, "lenet", "fifo", {"c": 2})
    with autohet.load(fifo, pool="actors/cpu1.yaml") as one:
        close_to(one(x), reference("lenet", x))
        assert one.describe()["served"]["executors"] == ["cpu[0,1]"]
    with autohet.load(fifo, executor=1) as replica:  # one executor of the config, as a service replica
        close_to(replica(x), reference("lenet", x))
        assert replica.describe()["served"]["executors"] == ["cpu[1]"] and replica.cores == {1}
    with pytest.raises(UserError, match="executor= serves one executor of a data-parallel config"):
        autohet.load(write(tmp_path, "lenet", strategy, params, objective), executor=0)


def test_load_refuses_what_cannot_run_in_one_line(tmp_path):
    lenet = write(tmp_path, "lenet", "placement", {"start": "given", "assignment": [0, 1, 5], "x": 0}, "latency")
    with pytest.raises(UserError, match="assignment has device index 5"):
        autohet.load(lenet)
    with pytest.raises(UserError, match="unknown model"):
        autohet.load(write(tmp_path, "lenet", "fifo", {}), model="vgg17")
    with pytest.raises(UserError, match="not found"):
        autohet.load(tmp_path / "none.yaml")


def test_a_large_copy_split_over_threads_gives_the_same_rows():
    """``host_copy.copy_rows`` (a window's join, a GPU's staging): row chunks on threads, a dtype
    conversion included, equal to one copy; its threads are not pinned by the thread that made them."""
    import os

    import torch

    from autohet.platform.host_copy import _cores, _pool, copy_rows, copy_threads

    src = torch.randn(40, 1024, 1024)  # 160 MB: several chunks
    dst = torch.empty(40, 1024, 1024, dtype=torch.float16)
    copy_rows(dst, src)
    assert torch.equal(dst, src.half())  # exact: one correctly rounded conversion either side
    assert _pool(copy_threads()).submit(lambda: os.sched_getaffinity(0)).result(timeout=60) == _cores()


def test_a_copy_thread_copies_on_a_team_of_one_whatever_count_an_executor_set():
    """torch makes a thread's intra-op team at its first parallel op, of the process-wide count the last
    ``torch.set_num_threads`` stored: after a CPU group of eight cores had set its own, each of sixteen copy
    threads staging a stream copied on a team of eight. The pool's threads are the copy's parallelism: a
    team of one each (3, the count set here, before)."""
    import torch

    from autohet.platform.cores import own_threads
    from autohet.platform.host_copy import _pool

    threads = torch.get_num_threads()
    try:
        own_threads(3)  # a CPU group's thread: the process-wide count is 3 now
        pool = _pool(5)  # a fresh pool, its threads made after that
        teams = {pool.submit(torch.get_num_threads).result(timeout=60) for _ in range(10)}
    finally:
        torch.set_num_threads(threads)
    assert teams == {1}


def test_the_copy_threads_use_the_process_cores_after_an_executor_pinned_the_main_thread(monkeypatch):
    """A Ray actor runs its methods on the process's main thread, and a GPU executor pins that thread to
    its one feeding core: the copy threads, sized and unpinned by the main thread's affinity, were one."""
    import os

    import torch

    import autohet.executors.cpu as cpu
    from autohet.platform import host_copy

    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a process of two cores or more that can pin threads")
    monkeypatch.delenv("AUTOHET_COPY_THREADS", raising=False)
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        cpu.pin_thread((min(cores),))  # the main thread, as an executor in a Ray actor pins it
        assert os.sched_getaffinity(os.getpid()) == {min(cores)}
        assert host_copy._cores() == cores
        assert host_copy.copy_threads() == min(host_copy.MAX_THREADS, len(cores))
    finally:
        os.sched_setaffinity(0, cores)
        cpu._PINNED.cores = None
        torch.set_num_threads(threads)


def test_the_copy_threads_leave_a_gpu_feeders_cores_to_it(monkeypatch):
    """A GPU executor pins its launching thread to its feeding core. Sixteen copy threads staging a
    float32 stream on all sixteen cores of the H200 box shared that core with it: taken by turns on one
    box, the mixed stream ran at 0.66-0.92 of its run that way and 0.76-0.96 with the copy threads on the
    other cores (BENCHMARKS.md 38). They run on the process's other cores (a fresh pool once a feeder is
    noted), on all of them where no other is left or ``AUTOHET_COPY_ON_FEEDERS=1``."""
    import os

    from autohet.platform import cores as cores_module
    from autohet.platform import host_copy

    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a process of two cores or more that can pin threads")
    monkeypatch.delenv("AUTOHET_COPY_THREADS", raising=False)
    monkeypatch.delenv("AUTOHET_COPY_ON_FEEDERS", raising=False)
    monkeypatch.setattr(cores_module, "_FEEDER_CORES", set())
    everything = frozenset(os.sched_getaffinity(0))
    feeder = min(everything)
    assert host_copy._cores() == everything
    assert host_copy._pool(2).submit(lambda: os.sched_getaffinity(0)).result(timeout=60) == everything
    cores_module.note_feeder_cores((feeder,))
    assert host_copy._cores() == everything - {feeder}
    assert host_copy.copy_threads() == min(host_copy.MAX_THREADS, len(everything) - 1)
    affinity = host_copy._pool(2).submit(lambda: os.sched_getaffinity(0)).result(timeout=60)
    assert affinity == everything - {feeder}  # the pool made before the note is replaced
    monkeypatch.setenv("AUTOHET_COPY_ON_FEEDERS", "1")
    assert host_copy._cores() == everything
    monkeypatch.delenv("AUTOHET_COPY_ON_FEEDERS")
    cores_module.note_feeder_cores(tuple(everything))  # every core feeds a GPU: the copies share them
    assert host_copy._cores() == everything


def test_the_copy_threads_follow_their_setting_and_a_lanes_piece_uses_them_all(monkeypatch):
    """``AUTOHET_COPY_THREADS`` (a bench's A/B of the staging threads) sizes the copy pool; unset, the
    process's cores up to the cap. A copy of a few tens of MB (a lane's piece of a window) is cut into
    as many chunks as there are threads: at a 32 MB floor a 300 MB piece used 9 threads of 28
    (BENCHMARKS.md 33). The rows land the same either way."""
    import torch

    from autohet.platform import host_copy

    monkeypatch.delenv("AUTOHET_COPY_THREADS", raising=False)
    assert host_copy.copy_threads() == min(host_copy.MAX_THREADS, len(host_copy._cores()))
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("AUTOHET_COPY_THREADS", bad)
        with pytest.raises(UserError, match="AUTOHET_COPY_THREADS"):
            host_copy.copy_threads()
    monkeypatch.setenv("AUTOHET_COPY_THREADS", "4")
    assert host_copy.copy_threads() == 4
    src = torch.randn(24, 1024, 1024)  # 48 MB of float16 rows
    dst = torch.empty(24, 1024, 1024, dtype=torch.float16)
    pool = host_copy._pool(4)
    chunks = []
    submit = pool.submit
    monkeypatch.setattr(pool, "submit", lambda fn: chunks.append(fn) or submit(fn))
    host_copy.copy_rows(dst, src)
    assert host_copy._POOL_KEY[0] == 4 and pool._max_workers == 4
    assert len(chunks) == 4
    assert torch.equal(dst, src.half())  # exact: one correctly rounded conversion either side


def test_parts_copied_at_once_land_in_order():
    """``host_copy.copy_parts`` (a window's batches into one buffer): every part's chunks on the threads
    at once, each landing at its own rows, a dtype conversion included, small parts too."""
    import torch

    from autohet.platform.host_copy import copy_parts

    parts = [torch.randn(n, 512, 1024) for n in (70, 3, 41, 1)]  # 140 MB, 6 MB, 86 MB, 2 MB
    dst = torch.zeros(sum(len(p) for p in parts) + 5, 512, 1024, dtype=torch.float16)
    copy_parts(dst[:-5], parts)
    assert torch.equal(dst[:-5], torch.cat(parts).half())  # exact: one correctly rounded conversion either side
    assert not dst[-5:].any()  # nothing past the parts' rows


def test_import_autohet_stays_light():
    import subprocess
    import sys

    code = "import sys, autohet; print(int('autohet.runtime' in sys.modules), int('ray' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["0", "0"]


@pytest.mark.ray
@pytest.mark.slow  # with its Ray start, more than 10 s on the 2-core box
def test_a_ray_executor_that_dies_mid_call_loses_nothing(tmp_path, ray_local, caplog):
    """SIMULATED executors on Ray actors (outputs are image indices): s1's process exits on its third
    unit, inside a call; its unit is re-run on the others, every output comes back in order, the
    death is reported, and the next call gives s1 no work."""
    spec = PoolSpec("sim3", [ExecutorSpec("s0", "sim", batch=10, speed_ips=20000.0),
                             ExecutorSpec("s1", "sim", batch=10, speed_ips=20000.0, extra={"die_after_units": 2}),
                             ExecutorSpec("s2", "sim", batch=10, speed_ips=20000.0)])
    x = np.zeros((1000, 1, 28, 28), np.float32)
    config = RunConfig(ModelSpec("lenet"), spec, "fifo", {"c": 50})  # a RunConfig loads as a file would
    with autohet.load(config, ray=True) as runner:
        out = runner(x)
        # exact: simulated executors output the image indices
        assert np.array_equal(out[:, 0], np.arange(1000, dtype=np.float32)) and runner.checked
        assert len(runner.deaths) == 1 and "s1 died" in runner.deaths[0] and "re-dispatched" in runner.deaths[0]
        assert "s1 died" in caplog.text
        again = runner(x[:300])
        # exact: simulated executors output the image indices
        assert np.array_equal(again[:, 0], np.arange(300, dtype=np.float32)) and len(runner.deaths) == 1


def _stream_check(runner, x: np.ndarray, ref: np.ndarray) -> None:
    """The checked call, then a stream of 2-image batches with a call from another thread mid-stream,
    then a stream closed early (must not hang), then a call: every output the reference's (40 images)."""
    runner(x[:2])  # the checked call
    side: list[np.ndarray] = []
    outs = []
    for k, out in enumerate(runner.map([x[i : i + 2] for i in range(2, 34, 2)])):
        outs.append(out)
        if k == 3:  # mid-stream, from another thread: runs between two windows
            t = threading.Thread(target=lambda: side.append(runner(x[34:37])))
            t.start()
            t.join(60)
    close_to(np.concatenate(outs), ref[2:34])
    close_to(side[0], ref[34:37])
    early = runner.map([x[i : i + 2] for i in range(0, 40, 2)])
    close_to(next(early), ref[:2])
    early.close()  # must not hang on the stager waiting for a window
    close_to(runner(x[37:40]), ref[37:40])


def test_a_long_stream_runs_a_lane_per_executor_and_a_call_from_another_thread_runs_between(tmp_path,
                                                                                            monkeypatch):
    """After the checked first call, a stream over two executors goes through their lanes (issue 49):
    each window split between them once, each executor's pieces staged on its own feeder thread while its
    lane runs the one before, outputs in order; a call from another thread mid-stream gets its own
    outputs; a stream closed early stops its reader and stager; each executor's images, busy and device
    seconds in a stream are in the stats, counted afresh per stream."""
    from autohet.executors.cpu import CpuExecutor
    from autohet.strategies.data_parallel import DataParallelServed

    staged_on: list[tuple[str, str]] = []
    real = CpuExecutor.stage_piece

    def stage_piece(ex, parts):
        staged_on.append((ex.spec.name, threading.current_thread().name))
        return real(ex, parts)

    monkeypatch.setattr(CpuExecutor, "stage_piece", stage_piece)
    x = np.random.default_rng(2).standard_normal((40, *input_shape("lenet")), dtype=np.float32)
    ref = reference("lenet", x)
    with autohet.load(write(tmp_path, "lenet", "fifo", {"c": 3}), window=4) as runner:
        assert isinstance(runner.served, DataParallelServed)
        _stream_check(runner, x, ref)
        assert runner.describe()["served"]["stream"] == "a lane per executor"
        close_to(np.concatenate(list(runner.map([x[i : i + 2] for i in range(0, 32, 2)]))), ref[:32])
        stats = runner.describe()["stream"]  # the last stream's own figures
    assert len(staged_on) >= 7 and all(thread == f"autohet-{name}-feed" for name, thread in staged_on)
    assert {name for name, _ in staged_on} == {"cpu0", "cpu1"}  # both executors got pieces
    assert set(stats["executors"]) == {"cpu0", "cpu1"}
    assert sum(e["images"] for e in stats["executors"].values()) == 32
    assert all(e["busy_s"] > 0 and e["device_s"] > 0 for e in stats["executors"].values() if e["images"])


def test_a_cpu_lane_runs_a_pieces_whole_batches_where_they_lie(tmp_path, monkeypatch):
    """A CPU group's lane runs a piece's parts as they lie when each but the last is whole batches (no
    joined copy: a float32 stream's joins took 5-6% of the 2-core box's CPU), and joins them otherwise;
    the outputs are the reference's either way."""
    from autohet.executors.cpu import CpuExecutor

    batch = load_pool(CPU2).executors[0].batch
    pieces: list[int] = []  # parts in each piece a lane staged
    joins: list[int] = []  # parts in each join
    real_piece, real_stage = CpuExecutor.stage_piece, CpuExecutor.stage
    monkeypatch.setattr(CpuExecutor, "stage_piece", lambda ex, parts: pieces.append(len(parts))
                        or real_piece(ex, parts))
    monkeypatch.setattr(CpuExecutor, "stage", lambda ex, parts: joins.append(len(parts)) or real_stage(ex, parts))
    x = np.random.default_rng(5).standard_normal((16 * batch, *input_shape("lenet")), dtype=np.float32)
    ref = reference("lenet", x)
    with autohet.load(write(tmp_path, "lenet", "fifo", {"c": 1}), window=8 * batch) as runner:
        runner(x[:batch])  # the checked call
        close_to(np.concatenate(list(runner.map([x[i : i + batch] for i in range(0, len(x), batch)]))), ref)
        assert max(pieces) > 1 and [n for n in joins if n > 1] == []  # pieces of several batches, none joined
        pieces.clear()
        half = max(1, batch // 2)
        if half < batch:  # parts of half a batch: joined, so the calls stay whole batches
            close_to(np.concatenate(list(runner.map([x[i : i + half] for i in range(0, len(x), half)]))), ref)
            assert max(pieces) > 1 and max(joins) > 1


def test_a_single_config_starts_only_its_executor(tmp_path):
    """The tuned pool's other executors would hold memory and cores for nothing (and keep decoding off
    the cores they pin): on the H100 box's auto pool, four idle CPU groups beside the GPU."""
    x = np.random.default_rng(4).standard_normal((5, *input_shape("lenet")), dtype=np.float32)
    with autohet.load(write(tmp_path, "lenet", "single", {"executor": 1})) as runner:
        assert [e.name for e in runner.pool.spec.executors] == ["cpu1"] and runner.cores == frozenset({1})
        close_to(runner(x), reference("lenet", x))
        assert (runner.executions, runner.inferences) == (1, 5)  # the device calls and their images
        list(runner.map([x[:2], x[2:], x]))
        described = runner.describe()
        assert described["inferences"] == 15 and 2 <= described["executions"] <= 4


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_gpu_stream_copies_page_locked_batches_from_where_they_lie(tmp_path, monkeypatch, precision):
    """Batches already page-locked (a GPU replica's registered request bodies, a DataLoader's pinned
    float32 batches) are not staged by copy: the GPU reads them in place, float32 converted there to
    the compute dtype, and the outputs are the reference's."""
    import torch

    from autohet.executors.gpu import GpuExecutor

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    staged: list[str] = []
    real = GpuExecutor.stage

    def spy(self, parts, *rows):
        out = real(self, parts, *rows)
        staged.append(type(out).__name__)
        return out

    monkeypatch.setattr(GpuExecutor, "stage", spy)
    gpu = PoolSpec("gpu", [ExecutorSpec("gpu0", "gpu", (0,), 0, batch=4, precision=precision)])
    path = write_config(RunConfig(ModelSpec("lenet"), gpu, "single", {"executor": 0}, images=64),
                        tmp_path / "gpu.yaml")
    x = np.random.default_rng(11).standard_normal((40, *input_shape("lenet")), dtype=np.float32)
    pinned = torch.empty(x.shape, dtype=torch.float32, pin_memory=True)
    pinned.copy_(torch.from_numpy(x))
    xs = pinned.numpy()
    with autohet.load(path, window=6) as runner:
        first = runner(xs[:2])  # the checked call
        outs = list(runner.map([xs[i : i + 2] for i in range(2, 40, 2)]))
    out, ref = np.concatenate([first, *outs]), reference("lenet", x)
    assert out.shape == ref.shape and out.dtype == np.float32
    assert float(np.abs(out - ref).max()) <= TOLERANCE[precision] * float(np.abs(ref).max())
    assert "_InPlaceParts" in staged, staged


class _Part:
    """What ``read_in_place`` reads of a part (a CPU-only torch cannot page-lock memory)."""

    def __init__(self, dtype, pinned: bool = True, contiguous: bool = True) -> None:
        self.dtype, self.pinned, self.contiguous = dtype, pinned, contiguous

    def is_pinned(self) -> bool:
        return self.pinned

    def is_contiguous(self) -> bool:
        return self.contiguous


def test_a_gpu_reads_page_locked_parts_in_its_staged_dtype_or_float32_in_place_and_stages_the_rest():
    """Page-locked float32 inputs are left where they lie for an fp16 GPU (converted on the GPU, no
    host copy), as parts in the staged dtype already were; anything not page-locked or contiguous, or
    a dtype the GPU neither stages nor converts, is staged by copy."""
    import torch

    from autohet.executors.gpu_staging import read_in_place

    f32, f16, u8 = torch.float32, torch.float16, torch.uint8
    assert read_in_place([_Part(f32), _Part(f32)], f16)  # a pinned float32 source: converted on the GPU
    assert read_in_place([_Part(f16)], f16) and read_in_place([_Part(u8)], u8)  # the staged dtype
    assert read_in_place([_Part(f32)], f32)
    assert not read_in_place([_Part(f32), _Part(f32, pinned=False)], f16)
    assert not read_in_place([_Part(f32, contiguous=False)], f16)
    assert not read_in_place([_Part(f32), _Part(f16)], f16)  # one dtype for the whole window
    assert not read_in_place([_Part(torch.bfloat16)], f16)


def _pixels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *input_shape("lenet")), dtype=np.uint8)


def test_uint8_pixels_reach_each_cpu_group_as_pixels_and_are_scaled_on_its_own_thread(tmp_path, monkeypatch):
    """Issue 49: pixels (numpy or torch uint8) go to the devices as uint8, whatever the config's mix; a
    CPU group scales its own rows by the config's preprocess mean and std on its own thread (not the
    caller's), for calls and for a stream's lanes, and they give the outputs of the scaled inputs; a
    window joining pixels and inputs reaches the groups as float32 inputs, in order."""
    import torch

    from autohet.config import Preprocess
    from autohet.executors.cpu import CpuExecutor

    seen: list[tuple[np.dtype, str]] = []
    real = CpuExecutor._inputs

    def spy(ex, rows):
        seen.append((rows.dtype, threading.current_thread().name))
        return real(ex, rows)

    monkeypatch.setattr(CpuExecutor, "_inputs", spy)
    pixels = _pixels(16, 5)
    config = RunConfig(ModelSpec("lenet"), load_pool(CPU2), "fifo", {"c": 4}, images=64,
                       preprocess=Preprocess(mean=(0.5,), std=(0.25,)))
    inputs = ((pixels.astype(np.float32) / 255 - 0.5) / 0.25).astype(np.float32)
    ref = reference("lenet", inputs)
    with autohet.load(write_config(config, tmp_path / "lenet.yaml"), window=4) as runner:
        seen.clear()
        close_to(runner(pixels[:12]), ref[:12])
        assert runner.device_pixels is True
        assert {d for d, _ in seen} == {np.dtype(np.uint8)}
        assert {t for _, t in seen} == {"autohet-cpu0", "autohet-cpu1"}  # each group's own thread
        out = runner(torch.from_numpy(pixels[:3]))
        assert isinstance(out, torch.Tensor)
        close_to(out.numpy(), ref[:3])
        seen.clear()
        close_to(np.concatenate(list(runner.map([pixels[i : i + 2] for i in range(0, 16, 2)]))), ref)
        assert len(seen) >= 4 and {d for d, _ in seen} == {np.dtype(np.uint8)}  # a piece a window at least
        seen.clear()
        close_to(np.concatenate(runner._run([pixels[:3], inputs[3:6]])), ref[:6])
        assert {d for d, _ in seen} == {np.dtype(np.float32)}
        outs = list(runner.map([pixels[:4], inputs[4:8], pixels[8:]]))
        close_to(np.concatenate(outs), ref)


def test_a_window_is_handed_back_while_the_source_waits_for_it(tmp_path, monkeypatch):
    """A producer that sends its next batch only after it has the previous batch's outputs (a client
    answering its requests one by one) gets them: a window queued back to back is not held until the
    next one arrives. Bounded: a hang fails the test after 60 s."""
    from autohet.executors.cpu import CpuExecutor

    monkeypatch.setattr(CpuExecutor, "launches_async", True)
    x = np.random.default_rng(9).standard_normal((12, *input_shape("lenet")), dtype=np.float32)
    answered = threading.Event()
    outs: list[np.ndarray] = []

    def producer():
        for i in range(0, 12, 2):
            if i and not answered.wait(60):
                raise AssertionError(f"batch {i // 2 - 1}'s outputs never came while the source waited")
            answered.clear()
            yield x[i : i + 2]

    with autohet.load(write(tmp_path, "lenet", "single", {"executor": 0}), window=4) as runner:
        runner(x[:2])  # the checked call: the stream then goes through stream_windows
        assert runner.pool.overlaps_windows()
        done = threading.Thread(target=lambda: [outs.append(o) or answered.set() for o in runner.map(producer())])
        done.start()
        done.join(120)
        assert not done.is_alive()
    close_to(np.concatenate(outs), reference("lenet", x))


def test_one_asynchronous_executor_streams_windows_back_to_back(tmp_path, monkeypatch):
    """A stream of one executor that queues units asynchronously (a GPU) goes through
    ``LocalPool.stream_windows`` (the next window queued before the current one is collected): outputs
    in order, a call from another thread between windows, an early close that does not hang. The test
    double: a CPU executor marked asynchronous (its launch runs at once)."""
    from autohet.executors.cpu import CpuExecutor

    used: list[int] = []
    real = LocalPool.stream_windows

    def spy(pool, windows, lock):
        used.append(1)
        yield from real(pool, windows, lock)

    monkeypatch.setattr(CpuExecutor, "launches_async", True)
    monkeypatch.setattr(LocalPool, "stream_windows", spy)
    x = np.random.default_rng(7).standard_normal((40, *input_shape("lenet")), dtype=np.float32)
    with autohet.load(write(tmp_path, "lenet", "single", {"executor": 0}), window=4) as runner:
        _stream_check(runner, x, reference("lenet", x))
        stats = runner.describe()["stream"]  # where the windows' time went (a service's /healthz shows it)
    assert used
    assert stats["windows"] >= 8 and 32 <= stats["images"] <= 72  # the first stream's 32 in windows of 4
    assert stats["device_s"] > 0 and stats["stage_s"] > 0 and stats["wait_s"] >= 0


@pytest.mark.gpu
def test_a_gpu_stream_of_windows_queued_back_to_back_returns_the_reference(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpu = PoolSpec("gpu", [ExecutorSpec("gpu0", "gpu", (0,), 0, batch=4, precision="fp32")])
    path = write_config(RunConfig(ModelSpec("lenet"), gpu, "single", {"executor": 0}, images=64),
                        tmp_path / "gpu.yaml")
    x = np.random.default_rng(8).standard_normal((40, *input_shape("lenet")), dtype=np.float32)
    with autohet.load(path, window=6) as runner:
        assert runner.pool.overlaps_windows()
        _stream_check(runner, x, reference("lenet", x))


def _two_gpus() -> None:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudagraphs", "inductor"])
def test_two_gpus_of_one_process_run_a_call_and_a_stream_on_their_lanes_with_the_reference(tmp_path, backend):
    """Issue 46/49: a data-parallel config over two GPUs (in-process: their loads one at a time where they
    compile) returns the reference for a call, a stream on a lane per GPU (uint8 pixels scaled on each GPU
    too), and a call from another thread mid-stream; both GPUs ran images of the stream."""
    _two_gpus()
    gpus = PoolSpec("gpus", [ExecutorSpec(f"gpu{g}", "gpu", (g,), g, batch=8, precision="fp32", backend=backend)
                             for g in (0, 1)])
    path = write_config(RunConfig(ModelSpec("lenet"), gpus, "fifo", {"c": 2, "unit": "batches"}, images=64),
                        tmp_path / "gpus.yaml")
    x = np.random.default_rng(10).standard_normal((40, *input_shape("lenet")), dtype=np.float32)
    with autohet.load(path, window=12) as runner:
        ref = reference("lenet", x)
        _stream_check(runner, x, ref)
        close_to(np.concatenate(list(runner.map([x[i : i + 4] for i in range(0, 40, 4)]))), ref)
        stats = runner.describe()["stream"]["executors"]  # the last stream's
        assert set(stats) == {"gpu0", "gpu1"} and sum(s["images"] for s in stats.values()) == 40
        assert all(s["images"] > 0 and s["device_s"] > 0 for s in stats.values())
        pixels = _pixels(24, 11)
        ref = reference("lenet", runner._pixel_scale().apply(pixels))
        close_to(np.concatenate(list(runner.map([pixels[i : i + 4] for i in range(0, 24, 4)]))), ref)
        assert runner.device_pixels


def test_a_window_past_the_devices_batch_ends_at_its_last_whole_batch():
    """Requests of 64 images on a 256-image compiled batch: a window of ten ends after eight (512
    images), the last two go into the next window; sizes that never end a whole batch, a window below
    one batch and no batch to fill take everything there."""
    from autohet.runtime._inputs import ReadAhead

    def sizes(batches: list[int], granule: int | None) -> list[list[int]]:
        reader = ReadAhead([np.zeros((n, 1, 2, 2), np.float32) for n in batches], (1, 2, 2), "t", 1 << 30)
        reader.thread.join(10)  # every batch read ahead before the first take
        windows, ended = [], False
        while not ended:
            taken, error, ended = reader.take(10_000, None, granule)
            assert error is None
            if taken:
                windows.append([len(b.images) for b in taken])
        assert reader.held == 0
        return windows

    assert sizes([64] * 10, 256) == [[64] * 8, [64] * 2]
    assert sizes([64] * 3, 256) == [[64] * 3]
    assert sizes([100] * 6, 256) == [[100] * 6]
    assert sizes([200, 56, 300], 256) == [[200, 56], [300]]
    assert sizes([64] * 10, None) == [[64] * 10]


def _sim_lanes(speeds: list[float], priors: list[float]):
    from autohet.core.workload import workload_for

    spec = PoolSpec("sims", [ExecutorSpec(f"sim{i}", "sim", batch=10, speed_ips=v) for i, v in enumerate(speeds)])
    pool = LocalPool(spec)
    pool.start(ModelSpec("lenet"), workload_for("lenet", 40, 0))
    lanes = pool.lanes(list(priors), [True] * len(speeds))
    assert lanes is not None
    return pool, lanes


def _windows(lanes, count: int) -> None:
    x = np.zeros((40, 1, 28, 28), np.float32)
    outs = list(lanes.run(iter([[x]] * count)))
    assert [o[:, 0].tolist() for o in outs] == [list(range(40))] * count


def test_a_lane_left_out_on_a_stale_speed_gets_work_again_and_a_streams_first_piece_sets_no_speed(monkeypatch):
    """Issue 49: on four GPUs one lane ran no image of a whole stream: its speed, measured on pieces that
    met a one-off stall, priced it out of every window and it never ran again to correct it. A lane left
    out of ``STALE_WINDOWS`` windows with nothing queued is given a batch whose speed replaces its old one;
    a stream's first piece on a lane (its buffers, its warm-up) is not a speed sample. SIMULATED executors
    (equal speeds); the probes' gap in seconds set to none (its own test below)."""
    from autohet.core.settings import STALE_WINDOWS
    from autohet.pool import lanes as lanes_module

    monkeypatch.setattr(lanes_module, "PROBE_GAP_BATCHES", 0)
    pool, lanes = _sim_lanes([4000.0, 4000.0], [4000.0, 4000.0])
    try:
        lanes.lanes[1].recent.extend([(10, 5.0)] * 8)  # a stall's samples: 2 img/s
        _windows(lanes, 3 * STALE_WINDOWS)
        ran = {name: s.images for name, s in lanes.stats().items()}
        assert ran["sim1"] >= 10 * STALE_WINDOWS and sum(ran.values()) == 120 * STALE_WINDOWS, ran
        lanes.lanes[0].recent.clear()
        _windows(lanes, 1)  # one window: each lane's first pieces of this stream (a batch, then two)
        assert lanes.stats()["sim0"].pieces == 2 and len(lanes.lanes[0].recent) == 1
        lanes.close()
    finally:
        pool.shutdown()


def test_a_lane_left_out_is_measured_again_on_one_batch_not_given_the_calls_figure(monkeypatch):
    """On one H200 a 15-core CPU group left out of the stream was given the call's speed again, which
    overrated it: it took a piece in each window, each held its window open past the GPU's work on the
    windows ahead, and the GPU waited (BENCHMARKS.md 37). Its retry is now one batch, whose speed is its
    speed from then on. SIMULATED: 4000 and 100 img/s; the slow one's call figure 4000, its samples a
    stall's (2 img/s); the probes' gap in seconds set to none."""
    from autohet.core.settings import STALE_WINDOWS
    from autohet.pool import lanes as lanes_module

    monkeypatch.setattr(lanes_module, "PROBE_GAP_BATCHES", 0)
    pool, lanes = _sim_lanes([4000.0, 100.0], [4000.0, 4000.0])
    try:
        slow = lanes.lanes[1]
        slow.recent.extend([(10, 5.0)] * 8)
        _windows(lanes, STALE_WINDOWS + 2)
        assert slow.retries == 1 and lanes.stats()["sim1"].images == 10  # one batch, then nothing more
        assert 50.0 < slow.speed < 150.0, slow.speed  # the batch's own figure: neither the call's nor the stall's
        lanes.close()
    finally:
        pool.shutdown()


def test_a_lane_left_out_is_probed_only_after_its_batches_seconds_not_windows_alone(monkeypatch):
    """On one H200 the GPU's windows took 0.04 s: a CPU group left out was probed after 8 of them, then 16,
    each probe's batch took 0.11-0.16 s on cores the GPU's float32 staging needed, and the streams it fell
    in ran at 0.91-0.93 of those it did not (BENCHMARKS.md 38). A probe is now also ``PROBE_GAP_BATCHES``
    of the lane's batches' seconds (at its best speed known) after it last ran, doubled with each retry.
    The rule's arithmetic; then SIMULATED lanes (4000 and 100 img/s, both known at 4000) with a gap no
    test outlasts: past ``STALE_WINDOWS`` windows the slow lane still runs nothing."""
    from autohet.core.settings import PROBE_GAP_BATCHES, STALE_WINDOWS
    from autohet.pool import lanes as lanes_module

    batch_s = 16 / 450.0  # a 15-core group's batch at the call's figure
    gap = PROBE_GAP_BATCHES * batch_s
    assert not lanes_module.probe_due(STALE_WINDOWS, 0, 0.99 * gap, batch_s)  # enough windows, too soon
    assert not lanes_module.probe_due(STALE_WINDOWS - 1, 0, 10 * gap, batch_s)  # long enough, too few windows
    assert lanes_module.probe_due(STALE_WINDOWS, 0, 1.01 * gap, batch_s)
    assert not lanes_module.probe_due(2 * STALE_WINDOWS, 1, 1.5 * gap, batch_s)  # the second waits twice as long
    assert lanes_module.probe_due(2 * STALE_WINDOWS, 1, 2.01 * gap, batch_s)

    monkeypatch.setattr(lanes_module, "PROBE_GAP_BATCHES", 10**9)
    pool, lanes = _sim_lanes([4000.0, 100.0], [4000.0, 4000.0])
    try:
        slow = lanes.lanes[1]
        slow.recent.extend([(10, 5.0)] * 8)  # a stall's samples: 2 img/s, left out of every window
        _windows(lanes, 3 * STALE_WINDOWS)
        assert slow.retries == 0 and lanes.stats()["sim1"].images == 0
        lanes.close()
    finally:
        pool.shutdown()


def test_a_window_rounded_to_whole_batches_gives_a_slow_lane_no_batch_that_would_end_after_the_others():
    """Issue 49: a GPU (48000 img/s, batches of 64, 0.05 s queued) beside a 15-core CPU group (150 img/s,
    batches of 16). The even finish gives the group 13 of a 1792-image window; given the images left
    after the whole batches by deficit, it got a batch of 16 (0.107 s) that ended after the GPU's whole
    queue (0.087 s); by the earliest finish, the GPU takes them. Pure arithmetic."""
    from autohet.planners.shares import even_finish_shares, whole_batch_shares

    speeds, backlog = [48000.0, 150.0], [0.05, 0.0]
    shares = even_finish_shares(1792, speeds, backlog, [True, True])
    assert shares is not None and 12 < shares[1] < 14
    assert whole_batch_shares(shares, [64, 16], 1792, speeds, backlog) == [1792, 0]
    # the group takes batches while they end by the GPU's 0.535 s (80 images: 0.533 s), the GPU the last 16
    # (a partial batch), a dead lane (no speed) none
    assert whole_batch_shares([1700.0, 60.0, 0.0], [64, 16, 8], 1760, [48000.0, 150.0, None],
                              [0.5, 0.0, 0.0]) == [1680, 80, 0]


def test_a_lane_that_runs_dry_takes_the_waiting_pieces_of_a_lane_slower_than_its_estimate():
    """A window is split by estimated speeds; where one lane runs slower than its estimate (a noisy box's
    CPU group), its last pieces held the stream's end while the other stood idle: the 2-core box's `fifo`
    stream had one group idle for its last 0.42 s of 7.1 s (BENCHMARKS.md 37). A lane with nothing queued
    now takes the last waiting piece of a lane that would finish it later. SIMULATED: 4000 and 1000 img/s,
    both estimated at 4000; one window of 400 images, split 200 / 200."""
    pool, lanes = _sim_lanes([4000.0, 1000.0], [4000.0, 4000.0])
    try:
        x = np.zeros((400, 1, 28, 28), np.float32)
        outs = list(lanes.run(iter([[x]])))
        # exact: simulated executors output the image indices: each image once, in order
        assert len(outs) == 1 and np.array_equal(outs[0][:, 0], np.arange(400))
        ran = {name: s.images for name, s in lanes.stats().items()}
        # without: 200 / 200; the slow lane's pieces 10, 20, 40, 80, 50, of which those past its two slots
        # wait: at least its last (50) goes to the fast lane
        assert ran["sim0"] >= 250 and ran["sim0"] + ran["sim1"] == 400, ran
        lanes.close()
    finally:
        pool.shutdown()


def test_a_lanes_collector_collects_a_piece_only_once_it_is_done(monkeypatch):
    """A GPU's ``collect`` waits on a CUDA event, which spins a core while it waits (one context on a
    many-core host): the collector polls ``ready`` and collects only a finished piece. SIMULATED
    executors whose pieces are ready 20 ms after their launch."""
    import time as clock

    from autohet.executors.sim import SimExecutor

    launched: dict[int, float] = {}
    early: list[int] = []
    real_launch, real_collect = SimExecutor.launch_staged, SimExecutor.collect

    def launch(ex, staged, start, count):
        handle = real_launch(ex, staged, start, count)
        launched[id(handle)] = clock.perf_counter()
        return handle

    def collect(ex, handle):
        if clock.perf_counter() - launched[id(handle)] < 0.02:
            early.append(id(handle))
        return real_collect(ex, handle)

    monkeypatch.setattr(SimExecutor, "launch_staged", launch)
    monkeypatch.setattr(SimExecutor, "collect", collect)
    monkeypatch.setattr(SimExecutor, "ready", lambda ex, handle: clock.perf_counter() - launched[id(handle)] >= 0.02,
                        raising=False)
    pool, lanes = _sim_lanes([4000.0, 4000.0], [4000.0, 4000.0])
    try:
        _windows(lanes, 2)
        assert launched and not early, (len(launched), len(early))
        lanes.close()
    finally:
        pool.shutdown()


def test_a_piece_of_a_stream_that_ended_is_dropped_when_its_staging_comes_late():
    """A piece taken from another lane as a stream closes may reach its feeder after the stream settled:
    staged in the next stream, it would run there and count in that stream's figures. It is dropped.
    SIMULATED executors."""
    from autohet.pool.lanes import _Piece, _Window

    pool, lanes = _sim_lanes([4000.0, 4000.0], [4000.0, 4000.0])
    try:
        _windows(lanes, 1)
        lane, before = lanes.lanes[0], lanes.stats()["sim0"].images
        lanes._stop.clear()  # as the next stream's start does
        window = _Window([np.zeros((10, 1, 28, 28), np.float32)], 10, 10, lanes.streams - 1)
        lanes._feed(_Piece(window, 0, 10, lane))
        lane.feeder.call(lambda: None)
        assert lane.queued == 0 and not lane.waiting and window.left == 10
        assert lanes.stats()["sim0"].images == before
        _windows(lanes, 1)  # the lane runs the next stream as before
        lanes.close()
    finally:
        pool.shutdown()


def test_a_lane_whose_one_batch_outlasts_the_others_window_takes_none_of_it():
    """Issue 49: a CPU group's batch (16 images at 150 img/s: 0.107 s) beside a GPU's 1792-image window
    (0.037 s) held the window open while the GPU ran ahead and waited; it takes none of such a window, but
    does of one long enough, and two equal lanes, or the fastest, always take theirs. Pure arithmetic."""
    from autohet.planners.shares import batch_outlasts_window

    assert batch_outlasts_window(1792, [48000.0, 150.0], [256, 16]) == [False, True]
    assert batch_outlasts_window(8000, [48000.0, 150.0], [256, 16]) == [False, False]
    assert batch_outlasts_window(8, [40.0, 40.0, None], [16, 16, 16]) == [False, False, False]
    assert batch_outlasts_window(100, [48000.0, 48000.0, 150.0], [256, 256, 16]) == [False, False, True]


def test_a_lanes_queue_counts_what_its_running_piece_has_left_and_its_pieces_start_at_a_batch():
    """A lane's backlog is its queued images at its speed less what its running piece has done (counted
    whole, a piece near its end made a slow lane's batch look as if it ended in time: the stream's tail).
    A stream's pieces on a lane start at one batch and double up to a unit, so the device starts after a
    batch's staging; past a unit, a lane's images are cut into even pieces of whole batches, not units and
    a batch left over (whose staging slot held up the next unit). SIMULATED executors."""
    import time as clock

    from autohet.pool.lanes import _piece_size

    def cut(left: int, most: int) -> list[int]:
        out = []
        while left:
            out.append(_piece_size(left, most, 256))
            left, most = left - out[-1], min(4096, 2 * most)
        return out

    assert cut(4352, 4096) == [2304, 2048] and cut(1792, 4096) == [1792] and cut(4130, 4096) == [2304, 1826]
    assert cut(4352, 256) == [256, 512, 1024, 1280, 1280]

    pool, lanes = _sim_lanes([4000.0, 4000.0], [4000.0, 4000.0])
    try:
        lane, now = lanes.lanes[0], clock.perf_counter()
        lane.queued, lane.free_at = 480, now - 1.0
        assert lane.backlog_s(4000.0, now) == pytest.approx(0.12)  # nothing running: all of it
        lane.started.append(now - 0.05)
        assert lane.backlog_s(4000.0, now) == pytest.approx(0.07)
        # exact: a running piece past its queued work leaves max(0.0, ...), the 0.0 itself
        assert lane.backlog_s(4000.0, now + 1.0) == 0.0
        lane.started.clear()
        lane.queued = 0
        sizes: list[tuple[str, int]] = []
        real = lanes._feed
        lanes._feed = lambda piece: sizes.append((piece.lane.executor.spec.name, piece.count)) or real(piece)
        x = np.zeros((400, 1, 28, 28), np.float32)
        assert sum(len(o) for o in lanes.run(iter([[x]]))) == 400
        unit = lane.executor.spec.max_unit_images  # 80: batches of 10, 8 a unit
        for name in ("sim0", "sim1"):
            mine = [n for who, n in sizes if who == name]
            assert mine[:3] == [10, 20, 40] and max(mine) <= unit and all(n % 10 == 0 for n in mine), mine
        lanes.close()
    finally:
        pool.shutdown()


def test_a_slow_lane_that_the_calls_figure_overrates_is_tried_again_ever_more_seldom():
    """A CPU group beside a GPU streams slower than the call measured it: each retry on the call's figure
    costs a window a slow piece, so the retries back off (8, 16, 32 windows). SIMULATED: 4000 and 100
    img/s, both starting from 4000."""
    pool, lanes = _sim_lanes([4000.0, 100.0], [4000.0, 4000.0])
    try:
        _windows(lanes, 60)
        slow = lanes.stats()["sim1"].pieces
        # 60 windows hold the retries after 8, 16 and 32 windows left out; retried on every window left out
        # instead, it ran a piece in about one window of two (25)
        assert lanes.lanes[1].retries <= 3 and 1 <= slow <= 12, (lanes.lanes[1].retries, slow)
        lanes.close()
    finally:
        pool.shutdown()


def test_a_multi_executor_stream_never_restarts_its_scheduler_nor_waits_at_a_window_end(tmp_path, monkeypatch):
    """Issue 49: a stream over a fast and a slow executor (SIMULATED, 4000 and 1000 img/s) runs no
    scheduler per window (``drive`` only for the checked call), the fast one starts a later window's piece
    while the slow one still runs an earlier window's (no barrier at a window's end), and the split follows
    the measured speeds. Outputs: the image indices, in order."""
    import time as clock

    from autohet.executors.sim import SimExecutor
    from autohet.strategies import data_parallel

    drives: list[int] = []
    real_drive = data_parallel.drive
    monkeypatch.setattr(data_parallel, "drive", lambda *a, **k: drives.append(1) or real_drive(*a, **k))
    spans: list[tuple[str, float, float, int]] = []
    real_run = SimExecutor.run

    def run(ex, start, size):
        t0 = clock.perf_counter()
        out = real_run(ex, start, size)
        spans.append((ex.spec.name, t0, clock.perf_counter(), size))
        return out

    monkeypatch.setattr(SimExecutor, "run", run)
    spec = PoolSpec("sims", [ExecutorSpec("fast", "sim", batch=20, speed_ips=4000.0),
                             ExecutorSpec("slow", "sim", batch=20, speed_ips=1000.0)])
    x = np.zeros((1200, 1, 28, 28), np.float32)
    with autohet.load(RunConfig(ModelSpec("lenet"), spec, "fifo", {"c": 20}, images=200)) as runner:
        runner(x[:200])  # the checked call (and load's warm-up): the tuned scheduler
        called = len(drives)
        spans.clear()
        outs = list(runner.map([x[i : i + 100] for i in range(0, 1200, 100)]))
        assert len(drives) == called  # no scheduler per window
    # exact: simulated executors output the image indices in their window: each batch's run in order
    assert [len(o) for o in outs] == [100] * 12 and all(np.array_equal(o[:, 0], o[0, 0] + np.arange(100)) for o in outs)
    fast = [s for s in spans if s[0] == "fast"]
    slow = [s for s in spans if s[0] == "slow"]
    assert sum(s[3] for s in fast) > 2.5 * sum(s[3] for s in slow)  # shares follow the speeds (4:1)
    overlaps = sum(1 for _, f0, _, _ in fast for _, s0, s1, _ in slow if s0 < f0 < s1)
    assert overlaps >= 2  # the fast one kept going while the slow one ran: no barrier between windows
