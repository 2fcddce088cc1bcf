"""Plain executor classes, no Ray: outputs equal the model's; the in-process pool end to end."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from autohet.context import RunContext
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, build_model
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec, make_executor
from autohet.pool import LocalPool, load_pool
from autohet.strategy_run import run_strategy
from tests.numerics import assert_fp32_close, assert_run_fp32_close, assert_within_product_tolerance


@pytest.fixture(scope="module")
def lenet_workload():
    return Workload.from_spec(WorkloadSpec(500, (1, 28, 28), seed=1))


def test_cpu_executor_outputs_equal_the_model_and_keep_order(lenet_workload):
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=32), ModelSpec("lenet"))
    ex.load(lenet_workload)
    unit = ex.run(100, 70)  # spans three batches, the last partial
    with torch.inference_mode():
        ref = build_model("lenet")(torch.from_numpy(lenet_workload.rows(100, 70))).numpy()
    assert unit.outputs.shape == (70, 10)
    assert_fp32_close(unit.outputs, ref, build_model("lenet"))  # one pinned thread against this thread's two
    assert unit.compute_s > 0
    assert torch.get_num_threads() == 1
    assert ex.standalone_ips(0.1) > 0


def test_cpu_executor_bf16_is_close(lenet_workload):
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=32, precision="bf16"), ModelSpec("lenet"))
    ex.load(lenet_workload)
    ref = make_executor(ExecutorSpec("c", "cpu", (0,), batch=32), ModelSpec("lenet"))
    ref.load(lenet_workload)
    a, b = ex.run(0, 64).outputs, ref.run(0, 64).outputs
    assert_within_product_tolerance(a, b, "bf16")


def test_local_pool_runs_fast_split_with_output_check(lenet_workload):
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    m = run_strategy("fast_split", {"w_s": 32}, pool, RunContext(ModelSpec("lenet"), lenet_workload,
                                                                 standalone_seconds=0.1))
    assert_run_fp32_close(m, build_model("lenet"))
    assert sum(e.images for e in m.executors) == 500
    assert not m.simulated


def test_a_singles_limit_is_its_own_executors_figure_and_the_other_is_not_measured(lenet_workload):
    """A single's limit used to be the pool's summed standalone figures (efficiency 0.497 on two GPUs,
    BENCHMARKS.md 39), and measuring them set up every other executor at the single's settings."""
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    measured: list[list[int] | None] = []

    def provider(p, share, used):
        measured.append(used)
        return [0.0 if used is not None and i not in used else 1e9 + i for i in range(len(p))]  # above the run

    m = run_strategy("single", {"executor": 1}, pool, RunContext(ModelSpec("lenet"), lenet_workload,
                                                                 standalone_provider=provider))
    assert measured == [[1]] and m.output_ok
    assert m.limit_ips == pytest.approx(1e9 + 1)
    assert [e.standalone_ips for e in m.executors] == pytest.approx([0, 1e9 + 1])
    assert [e.images for e in m.executors] == [0, 500]


def test_wrong_outputs_fail_the_check(lenet_workload):
    """A run whose outputs differ from the reference is reported invalid with its difference."""
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    ctx = RunContext(ModelSpec("lenet", seed=0), lenet_workload, standalone_seconds=0.1)
    pool.start(ModelSpec("lenet", seed=5), lenet_workload)  # executors hold other weights
    from autohet.strategies import get_strategy

    strategy = get_strategy("fifo")
    m = strategy.run(pool, ctx, strategy.validate({}))
    assert not m.output_ok
    assert m.max_abs_diff > m.tolerance
    assert any("differ" in f for f in m.failures)


@pytest.mark.gpu
def test_gpu_executor_matches_cpu_reference(lenet_workload):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    for precision, tol in (("fp32", 1e-3), ("fp16", 1e-2), ("bf16", 5e-2)):
        ex = make_executor(ExecutorSpec("g", "gpu", (), 0, batch=64, precision=precision,
                                        channels_last=True), ModelSpec("lenet"))
        ex.load(lenet_workload)
        with torch.inference_mode():
            ref = build_model("lenet")(torch.from_numpy(lenet_workload.rows(10, 300))).numpy()
        out = ex.run(10, 300).outputs  # 4 full batches and a partial one, padded to 64
        assert np.max(np.abs(out - ref)) <= tol * np.max(np.abs(ref))
        bank = ex.bank
        ex.configure({"batch": 24})  # batch-only change: same pinned bank, new buffers
        assert ex.bank is bank and ex.spec.batch == 24
        out = ex.run(10, 300).outputs
        assert np.max(np.abs(out - ref)) <= tol * np.max(np.abs(ref))
        assert ex.standalone_ips(0.05, 200) > 0


def test_gpu_partial_batches_run_at_a_few_padded_shapes():
    from autohet.executors.gpu import padded_batch

    shapes = {padded_batch(n, 256) for n in range(1, 257)}
    assert shapes == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert all(padded_batch(n, 256) >= n for n in range(1, 257))
    assert padded_batch(65, 100) == 100 and padded_batch(3, 100) == 4


@pytest.mark.gpu
def test_gpu_run_ahead_queues_the_announced_part_and_drops_a_wrong_guess(lenet_workload):
    """The actor names the next part; it is queued before this part's outputs return."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    ex = make_executor(ExecutorSpec("g", "gpu", (), 0, batch=32, precision="fp32"), ModelSpec("lenet"))
    ex.load(lenet_workload)
    with torch.inference_mode():
        ref = build_model("lenet")(torch.from_numpy(lenet_workload.rows(0, 600))).numpy()
    tol = 1e-3 * np.max(np.abs(ref))
    a = ex.run_ahead(0, 200, (200, 200))
    assert (200, 200) in ex._ahead
    b = ex.run_ahead(200, 200, (400, 100))  # found queued; announces a part that is never asked for
    c = ex.run_ahead(450, 150, None)  # the wrong guess is dropped, this part launched fresh
    assert not ex._ahead
    assert np.max(np.abs(np.concatenate([a.outputs, b.outputs]) - ref[:400])) <= tol
    assert np.max(np.abs(c.outputs - ref[450:600])) <= tol
    assert min(a.compute_s, b.compute_s, c.compute_s) > 0
    first, second = ex.launch(0, 64), ex.launch(64, 64)  # queued back to back, collected in order
    x, y = ex.collect(first), ex.collect(second)
    assert np.max(np.abs(np.concatenate([x.outputs, y.outputs]) - ref[:128])) <= tol


def test_standalone_counts_every_unit_it_launched(lenet_workload):
    """Standalone queues the next unit before collecting one; it must stop at max_images and count all."""
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16), ModelSpec("lenet"))
    ex.load(lenet_workload)
    calls: list[tuple[int, int]] = []
    real = ex.run

    def counting(start: int, size: int):
        calls.append((start, size))
        return real(start, size)

    ex.run = counting
    ips = ex.standalone_ips(min_seconds=60.0, max_images=64)
    assert ips > 0
    assert calls[0] == (0, 16)  # untimed warm-up unit
    assert [s for _, s in calls[1:]] == [16] * 4  # the 64-image cap, not the 60 s


def test_standalone_of_a_slow_synchronous_executor_runs_one_batch_when_warm(lenet_workload):
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=32), ModelSpec("lenet"))
    ex.load(lenet_workload)
    calls: list[int] = []
    run = ex.run
    ex.run = lambda start, size: calls.append(size) or run(start, size)  # type: ignore[method-assign]
    ex.standalone_ips(min_seconds=0.0)  # cold: one untimed warm-up batch, then one timed batch
    assert calls == [32, 32]
    calls.clear()
    ex.configure({"batch": 16})
    ex.run_ahead(0, 48, None)  # a trial's run at the new batch warms it
    calls.clear()
    ex.standalone_ips(min_seconds=0.0)
    assert calls == [16]  # no warm-up, and no second unit once min_seconds have passed


def test_an_in_process_pool_pins_its_own_threads_not_the_caller(lenet_workload):
    """Each executor runs on its own thread pinned to its cores; the caller's affinity and thread
    count are what they were (a pinned caller would run every executor on the last one's cores)."""
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    try:
        run_strategy("fifo", {"c": 50}, pool, RunContext(ModelSpec("lenet"), lenet_workload,
                                                           standalone_seconds=0.05))
        seen = [w.call(lambda: (os.sched_getaffinity(0), torch.get_num_threads())) for w in pool.workers]
    finally:
        pool.shutdown()
    assert seen == [({0}, 1), ({1}, 1)]
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == before


def test_an_in_process_pool_loads_its_gpu_executors_before_the_others(lenet_workload, monkeypatch):
    """A GPU's CUDA-graph capture beside a CPU backend's model export on another thread failed on the
    H200 box: a GPU executor's load ends before any other executor's load begins."""
    import time

    from autohet.executors.sim import SimExecutor
    from autohet.pool import PoolSpec

    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()
    load = SimExecutor.load

    def timed_load(self, workload):
        start = time.perf_counter()
        time.sleep(0.2 if self.spec.needs_gpu else 0.0)
        load(self, workload)
        with lock:
            spans[self.spec.name] = (start, time.perf_counter())

    monkeypatch.setattr(SimExecutor, "load", timed_load)
    spec = PoolSpec("mixed", [ExecutorSpec("cpu0", "sim", (0,), speed_ips=10.0),
                              ExecutorSpec("gpu0", "sim", (1,), needs_gpu=True, speed_ips=10.0),
                              ExecutorSpec("cpu1", "sim", (1,), speed_ips=10.0)])
    pool = LocalPool(spec)
    try:
        pool.start(ModelSpec("lenet"), lenet_workload)
    finally:
        pool.shutdown()
    assert spans["gpu0"][1] <= min(spans["cpu0"][0], spans["cpu1"][0]), spans


def test_a_cpu_group_keeps_its_team_when_another_thread_sets_one_thread():
    """A CPU group's thread sets its team, then (before its first op) a GPU executor's thread sets
    one thread for its feeder core: the group still runs on its own team. torch stores the count
    process-wide and a thread's first op resets its team to it; this failed (1 thread) before
    ``own_threads``."""

    from autohet.platform.cores import own_threads

    group_set, feeder_set = threading.Event(), threading.Event()
    seen: list[int] = []

    def cpu_group() -> None:
        own_threads(2)
        group_set.set()
        feeder_set.wait(60)
        torch.ones(64, 64) @ torch.ones(64, 64)  # its first op
        seen.append(torch.get_num_threads())

    def gpu_feeder() -> None:
        group_set.wait(60)
        own_threads(1)
        feeder_set.set()

    threads = [threading.Thread(target=cpu_group), threading.Thread(target=gpu_feeder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread still runs after 60 s"
    assert seen == [2]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_cpu_groups_team_is_bound_one_thread_to_a_core_where_asked(monkeypatch):
    """With ``AUTOHET_BIND_TEAMS=1`` the group's thread goes to its first core and its OpenMP team's
    other thread to the second; later parallel ops reuse that team (no new threads, still one to a
    core)."""

    monkeypatch.setenv("AUTOHET_BIND_TEAMS", "1")

    from autohet.executors.cpu import _PINNED, pin_thread

    seen: dict[str, object] = {}

    def group() -> None:
        pin_thread((0, 1))
        team = list(_PINNED.team)
        before = set(os.listdir("/proc/self/task"))
        torch.ones(1 << 22).mul_(2.0)
        seen.update(me=os.sched_getaffinity(0), team=[os.sched_getaffinity(t) for t in team],
                    new=set(os.listdir("/proc/self/task")) - before, threads=torch.get_num_threads())

    t = threading.Thread(target=group)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the group's thread still runs after 60 s"
    assert seen == {"me": {0}, "team": [{1}], "new": set(), "threads": 2}


@pytest.mark.parametrize("nice", ["10", "0"])
def test_a_cpu_groups_compute_threads_give_way_to_the_feeders(monkeypatch, nice):
    """A CPU group's thread (and a thread it makes after, as ONNX Runtime's workers) runs at nice
    AUTOHET_CPU_NICE; the main thread, whose later threads feed the GPUs, keeps its own."""
    if not hasattr(os, "setpriority"):
        pytest.skip("no thread priorities here")
    monkeypatch.setenv("AUTOHET_CPU_NICE", nice)
    from autohet.executors.cpu import pin_thread

    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    main_before = priority()
    seen: dict[str, int] = {}

    def group() -> None:
        before = priority()
        pin_thread((0,), yields=True)
        child = threading.Thread(target=lambda: seen.update(child=priority()))
        child.start()
        child.join()
        seen.update(before=before, me=priority())

    t = threading.Thread(target=group)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the group's thread still runs after 60 s"
    want = max(int(nice), seen["before"]) if nice != "0" else seen["before"]
    assert seen == {"before": seen["before"], "me": want, "child": want}
    pin_thread((0,), yields=True)  # on the main thread: nothing changes
    assert priority() == main_before


def test_a_latency_measurement_has_no_made_up_limit(lenet_workload):
    from autohet.tuning.trainable import trial_metrics

    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    ctx = RunContext(ModelSpec("lenet"), lenet_workload, mode="latency", latency_runs=5)
    try:
        m = run_strategy("single", {}, pool, ctx)
    finally:
        pool.shutdown()
    assert m.output_ok and m.limit_ips is None and m.efficiency is None and m.waste is None
    metrics = trial_metrics(m)
    assert "efficiency" not in metrics and "limit_ips" not in metrics and metrics["latency_p50_ms"] > 0


@pytest.mark.slow  # more than 10 s on the 2-core box
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_inductor_executor_matches_the_reference_and_compiles_once(lenet_workload, channels_last):
    """torch.compile on the CPU (lenet: the compile fits CI), partial batches padded to the compiled
    shape. Compiled once: an input that differs from the compile's example in a guarded property
    (inference-mode flag, layout of a padded batch) compiled every model a second time."""
    torch._dynamo.reset()
    spec = ExecutorSpec("c", "cpu", (0,), batch=32, backend="inductor", channels_last=channels_last)
    ex = make_executor(spec, ModelSpec("lenet"))
    with torch._dynamo.config.patch(error_on_recompile=True):
        ex.load(lenet_workload)  # its warm-up runs a padded partial batch
        assert ex.describe()["compile_s"] > 0
        with torch.inference_mode():
            ref = build_model("lenet")(torch.from_numpy(lenet_workload.rows(5, 45))).numpy()
        out = ex.run(5, 45).outputs  # one full batch and a partial one
    assert_within_product_tolerance(out, ref, "fp32")  # inductor fuses and reorders whole layers
    ex.configure({"batch": 32})  # unchanged: nothing compiled again
    assert ex.describe()["compile_s"] == 0.0  # exact: nothing compiled leaves it 0.0


@pytest.mark.gpu
def test_gpu_executor_runs_a_stream_staged_by_turns_from_parts(lenet_workload):
    """A stream's windows copied straight from their parts into two pinned buffers by turns: while
    the current window's units read one, the next is staged into the other."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    ex = make_executor(ExecutorSpec("g", "gpu", (), 0, batch=32, precision="fp16"), ModelSpec("lenet"))
    ex.load(lenet_workload)
    rows = lenet_workload.rows(0, 150)
    with torch.inference_mode():
        ref = build_model("lenet")(torch.from_numpy(np.ascontiguousarray(rows))).numpy()
    first = ex.stage([rows[:50], rows[50:70]])
    second = ex.stage([rows[70:150]])  # the other buffer: the first is untouched
    assert first.is_pinned() and first.data_ptr() != second.data_ptr()
    ex.use_staged(first)
    out_a = ex.run(0, 70).outputs
    ex.use_staged(second)
    out_b = ex.run(0, 80).outputs
    tol = 1e-2 * np.max(np.abs(ref))
    assert np.max(np.abs(np.concatenate([out_a, out_b]) - ref)) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_gpu_executor_scales_uint8_pixels_on_the_device(precision):
    """Pixels staged as uint8 (a stream's windows and a call's workload) are scaled on the GPU by the
    pixel scale: the outputs of the host-scaled float32 inputs, within the precision's tolerance; a
    float32 window after them still runs as inputs."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from autohet.core.workload import PixelScale, Workload

    scale = PixelScale((0.45,), (0.23,))
    pixels = np.random.default_rng(3).integers(0, 256, (150, 1, 28, 28), dtype=np.uint8)
    inputs = scale.apply(pixels)
    with torch.inference_mode():
        ref = build_model("lenet")(torch.from_numpy(inputs)).numpy()
    ex = make_executor(ExecutorSpec("g", "gpu", (), 0, batch=32, precision=precision, channels_last=True),
                       ModelSpec("lenet"))
    ex.load(Workload(inputs[:64], 64))
    assert ex.takes_pixels
    ex.pixel_scale = scale
    tol = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 5e-2}[precision] * np.max(np.abs(ref))
    ex.use_staged(ex.stage([pixels[:50], pixels[50:100]]))
    assert ex.bank.dtype == torch.uint8
    assert np.max(np.abs(ex.run(0, 100).outputs - ref[:100])) <= tol
    ex.set_workload(Workload(pixels[100:], 50))
    assert np.max(np.abs(ex.run(0, 50).outputs - ref[100:])) <= tol
    ex.use_staged(ex.stage([inputs[:40]]))
    assert np.max(np.abs(ex.run(0, 40).outputs - ref[:40])) <= tol
    ex.pixel_scale = None
    with pytest.raises(UserError, match="pixel scale"):
        ex.stage([pixels[:4]])


@pytest.mark.gpu
def test_gpu_inductor_replays_its_kernels_as_one_graph(lenet_workload):
    """inductor's default mode launches each kernel from Python; the executor captures the compiled
    call as a CUDA graph (full and partial batches, padded to the compiled shape) with the reference's
    outputs."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from autohet.executors.compiled import GraphedCall

    ex = make_executor(ExecutorSpec("g", "gpu", (), 0, batch=64, precision="fp16", backend="inductor"),
                       ModelSpec("lenet"))
    ex.load(lenet_workload)
    with torch.inference_mode():
        ref = build_model("lenet")(torch.from_numpy(lenet_workload.rows(0, 150))).numpy()
    out = ex.run(0, 150).outputs
    assert_within_product_tolerance(out, ref, "fp16")
    assert isinstance(ex.variant.graphs[64], GraphedCall)


@pytest.mark.gpu
def test_data_parallel_over_two_gpus_in_process_matches_the_reference_and_uses_both(lenet_workload):
    """Issue 46: fifo over two GPU executors of one process (LocalDispatcher's lookahead: each GPU queues
    its next unit while the current one runs), outputs checked against the fp32 reference."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    from autohet.pool import PoolSpec

    spec = PoolSpec("gpus", [ExecutorSpec(f"gpu{g}", "gpu", (g,), g, batch=32, precision="fp32") for g in (0, 1)])
    pool = LocalPool(spec)
    try:
        m = run_strategy("fifo", {}, pool, RunContext(ModelSpec("lenet"), lenet_workload, standalone_seconds=0.1))
    finally:
        pool.shutdown()
    assert m.output_ok, m.failures
    assert m.params["unit"] == "batches" and all(e.images > 0 for e in m.executors)


def test_a_compile_runs_on_every_core_of_the_process_and_the_thread_is_pinned_again(monkeypatch) -> None:
    """Inductor counts its compile workers from the calling thread's affinity and its worker processes
    inherit it: an executor's thread pinned to one feeder core compiled every kernel in turn."""
    import torch._inductor.config as inductor_config

    from autohet.executors.compiled import MAX_COMPILE_THREADS, compile_module
    from autohet.executors.cpu import pin_thread
    from autohet.platform.cores import process_cores

    cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    if len(cores) < 2 or not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs a process of two cores or more that can pin threads")
    seen: dict[str, object] = {}

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen["cores"], seen["workers"] = os.sched_getaffinity(0), inductor_config.compile_threads
            return x

    monkeypatch.setattr(torch, "compile", lambda module, **_: module)  # the compile's calling context only
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setattr(inductor_config, "compile_threads", 1)
    feeder = min(cores)

    def executor_thread() -> None:
        pin_thread((feeder,))  # as an executor pins its thread (the process's cores noted first)
        compile_module(Probe(), "default", torch.zeros(1))
        seen["after"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=executor_thread)
    thread.start()
    thread.join()
    assert set(process_cores()) == cores
    assert seen["cores"] == cores and seen["workers"] == min(MAX_COMPILE_THREADS, len(cores))
    assert seen["after"] == {feeder}


def test_a_compile_ahead_runs_on_the_cores_it_is_given_and_the_thread_is_pinned_again(monkeypatch) -> None:
    """An idle GPU's executor compiling a setting ahead (``prepare_ahead``) must leave the core that feeds
    the GPU being measured alone: its compile, workers and all, runs on the cores the manager gives it."""
    import torch._inductor.config as inductor_config

    from autohet.executors.compiled import compile_module, compiling_on
    from autohet.executors.cpu import pin_thread

    cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    if len(cores) < 2 or not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs a process of two cores or more that can pin threads")
    feeder, other = sorted(cores)[:2]
    seen: dict[str, object] = {}

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen["cores"], seen["workers"] = os.sched_getaffinity(0), inductor_config.compile_threads
            return x

    monkeypatch.setattr(torch, "compile", lambda module, **_: module)
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)

    def executor_thread() -> None:
        pin_thread((feeder,))
        with compiling_on(frozenset({other})):
            compile_module(Probe(), "default", torch.zeros(1))
        seen["ahead"] = dict(seen)
        compile_module(Probe(), "default", torch.zeros(1))  # outside it: the process's cores again
        seen["after"] = os.sched_getaffinity(0)

    # a worker an earlier compile started (inductor keeps its pool) is moved onto the given cores too
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        thread = threading.Thread(target=executor_thread)
        thread.start()
        thread.join()
        assert os.sched_getaffinity(worker.pid) == {other}
    finally:
        worker.kill()
        worker.wait()
    assert seen["ahead"]["cores"] == {other} and seen["ahead"]["workers"] == 1
    assert seen["cores"] == cores and seen["after"] == {feeder}


def test_a_setting_set_up_aside_runs_in_a_child_on_the_cores_given_and_a_failure_names_its_cause(
        monkeypatch) -> None:
    """Issue 46: a second cold compile beside the idle GPU's own (``autohet.executors.aside``): the child sets the
    setting up as its executor would, its compiles on the cores it is given, and reports on its last line; a
    setting it cannot set up fails with the child's own last line; a child whose parent is gone ends."""
    from autohet.core.models import ModelSpec
    from autohet.executors import ExecutorSpec
    from autohet.executors.aside import _BOOT, start_aside

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    given = cores[-1:]
    cpu = ExecutorSpec("cpu0", "cpu", tuple(cores[:1]) or (0,), batch=2)  # the executor pins its own core later
    report = start_aside(cpu, ModelSpec("lenet"), (1, 28, 28), frozenset(given)).wait(timeout=120)
    assert report["compile_s"] == 0.0  # exact: eager compiles nothing
    assert report["cores"] == given
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the child inherits it: no GPU there, on any machine
    gpu = ExecutorSpec("gpu0", "gpu", (), gpu=0, batch=2, precision="fp16")
    with pytest.raises(RuntimeError, match=r"exit 1\): .*asks for GPU 0 but this node has 0 CUDA GPUs"):
        start_aside(gpu, ModelSpec("lenet"), (1, 28, 28), frozenset(given)).wait(timeout=120)
    orphan = subprocess.run([sys.executable, "-c", _BOOT, str(os.getpid() + 10**6)], input=b"", timeout=60)
    assert orphan.returncode == 3  # not its parent's child: it ends before reading anything


def test_a_child_on_standby_makes_its_imports_first_then_sets_up_the_setting_it_is_given() -> None:
    """A child started cold spent 12-16 s on top of its compile on the H200x2 (BENCHMARKS.md 46): on standby it
    makes the set-up's imports on the cores given, says so, and waits; given a setting, it sets it up there."""
    from autohet.core.models import ModelSpec
    from autohet.executors import ExecutorSpec
    from autohet.executors.aside import spawn_aside

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    given = cores[-1:]
    aside = spawn_aside(frozenset(given))
    deadline = time.monotonic() + 120
    while not aside.warmed():
        assert aside.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert aside.waiting  # its imports made, nothing given yet
    cpu = ExecutorSpec("cpu0", "cpu", tuple(cores[:1]) or (0,), batch=2)
    aside.give(cpu, ModelSpec("lenet"), (1, 28, 28), frozenset(given))
    assert not aside.waiting
    report = aside.wait(timeout=120)
    assert report["standby_s"] > 0 and report["cores"] == given
    with pytest.raises(AssertionError, match="one setting"):
        aside.give(cpu, ModelSpec("lenet"), (1, 28, 28), frozenset(given))


@pytest.mark.gpu
def test_a_gpu_setting_set_up_aside_fills_the_cache_its_executor_then_reads(lenet_workload, tmp_path, monkeypatch):
    """The child compiles the graph the executor would: the executor's own set-up after it hits the cache, once:
    its warm-up and runs call the program on the kind of tensor it was compiled on (a plain example compiled
    every default-mode setting a second time, BENCHMARKS.md 43), whatever the layout."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from torch._dynamo.utils import counters

    from autohet.executors.aside import start_aside

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # a cache of this test's own
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    spec = ExecutorSpec("g", "gpu", (), 0, batch=32, precision="fp16", channels_last=True, backend="inductor")
    cores = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
    report = start_aside(spec, ModelSpec("lenet"), lenet_workload.shape, cores).wait(timeout=300)
    assert report["compile_s"] > 0
    counters.clear()
    ex = make_executor(spec, ModelSpec("lenet"))
    ex.load(lenet_workload)
    assert counters["inductor"]["fxgraph_cache_hit"] == 1 and counters["inductor"]["fxgraph_cache_miss"] == 0
    ex.run(0, 64)
    assert counters["inductor"]["fxgraph_cache_hit"] == 1 and counters["inductor"]["fxgraph_cache_miss"] == 0
    counters.clear()
    plain = make_executor(spec.with_params({"channels_last": False, "inductor_mode": "reduce-overhead"}),
                          ModelSpec("lenet"))
    plain.load(lenet_workload)  # called as it is (no graph of ours), on a view of a device buffer: once too
    plain.run(0, 64)
    assert counters["inductor"]["fxgraph_cache_hit"] + counters["inductor"]["fxgraph_cache_miss"] == 1


def test_an_actors_configure_collects_only_where_it_set_something_up(lenet_workload, monkeypatch):
    """A tune configures every live executor before each trial, most with the params they hold; the full
    collection after a set-up walks every object of a process holding a compiled model (0.3-0.5 s), so an
    unchanged configure skips it, and a change or a rebuild after a release runs it."""
    import autohet.pool.actors as actors

    settled = []
    monkeypatch.setattr(actors, "settle", lambda: settled.append(1))
    actor = actors.ExecutorActor(ExecutorSpec("c", "cpu", (0,), batch=16), ModelSpec("lenet"))
    actor.load(lenet_workload)
    assert len(settled) == 1  # the load's
    actor.configure({"batch": 16})
    assert len(settled) == 1
    actor.configure({"batch": 32})
    assert len(settled) == 2
    assert actor.executor.spec.batch == 32
    actor.release()  # its programs dropped (settled too)
    assert len(settled) == 3 and actor.executor.program is None
    actor.configure({"batch": 32})  # unchanged params, but the program is built again
    assert len(settled) == 4 and actor.executor.program is not None


def test_an_executor_that_lets_a_setting_go_makes_the_next_settle_whole(lenet_workload):
    """A settle walks the frozen heap again only after a ``let_go``: a changed setting or a release drops
    a program an earlier settle may have frozen (with its memory), an unchanged configure drops nothing."""
    from autohet.platform import gc_control

    executor = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16), ModelSpec("lenet"))
    executor.load(lenet_workload)
    try:
        gc_control.settle()
        assert not gc_control._Walks.let_go
        executor.configure({"batch": 16})
        assert not gc_control._Walks.let_go
        executor.configure({"batch": 32})
        assert gc_control._Walks.let_go
        gc_control.settle()
        executor.release()
        assert gc_control._Walks.let_go
    finally:
        gc.unfreeze()
