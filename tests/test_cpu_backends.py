"""CPU backends (eager, inductor, OpenVINO, ONNX Runtime): outputs equal the model's, conversions are
cached, what a machine cannot run is refused in one line. No Ray."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, build_model
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec, make_executor, runs_ahead
from autohet.executors.compiled import check_backend, unsupported
from tests.numerics import assert_within_product_tolerance

BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(importlib.util.find_spec(package) is None,
                                                     reason=f"{package} missing"))
            for b, package in (("openvino", "openvino"), ("onnxruntime", "onnxruntime"),
                               ("onnxruntime_nnpack", "onnxruntime"))]


def real_cpu_bf16() -> bool:
    """The CPU's own flags, not AUTOHET_CPU_FLAGS: a test that needs bf16 hardware asks this."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return "avx512_bf16" in text or "amx_bf16" in text


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOHET_COMPILE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def lenet_workload():
    return Workload.from_spec(WorkloadSpec(200, (1, 28, 28), seed=3))


def reference(workload: Workload, start: int, size: int) -> np.ndarray:
    with torch.inference_mode():
        return build_model("lenet")(torch.from_numpy(workload.rows(start, size))).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_converted_backend_equals_the_model_in_order_with_partial_batches(backend, cache, lenet_workload):
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=32, backend=backend), ModelSpec("lenet"))
    ex.load(lenet_workload)
    unit = ex.run(10, 75)  # two full batches and a partial one (padded where the shape is fixed)
    assert unit.outputs.shape == (75, 10)
    # another library's kernels (its own convolution algorithms and fusions): the output check's tolerance
    assert_within_product_tolerance(unit.outputs, reference(lenet_workload, 10, 75), "fp32")
    assert ex.describe()["backend"] == backend and ex.compile_s > 0
    assert list(cache.rglob("lenet-*"))  # the converted model is kept for the next executor


@pytest.mark.parametrize("backend", [pytest.param(*b.values, marks=[*b.marks, pytest.mark.slow])  # 3 conversions: ~9 s
                                     if b.values[0] == "openvino" else b for b in BACKENDS])
def test_a_second_executor_loads_the_converted_model_from_the_cache(backend, cache, lenet_workload):
    spec = ExecutorSpec("c", "cpu", (0,), batch=16, backend=backend)
    make_executor(spec, ModelSpec("lenet")).load(lenet_workload)
    files = {p: p.stat().st_mtime_ns for p in cache.rglob("lenet-*")}
    again = make_executor(spec, ModelSpec("lenet"))
    again.load(lenet_workload)
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("lenet-*")} == files  # nothing converted twice
    other = make_executor(spec, ModelSpec("lenet", seed=7))  # other weights: another file
    other.load(lenet_workload)
    assert len(list(cache.rglob("lenet-*"))) == 2 * len(files)


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino missing")
def test_openvino_streams_and_precision_are_what_ran(cache, lenet_workload):
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=8, backend="openvino", streams=1), ModelSpec("lenet"))
    ex.load(lenet_workload)
    info = ex.describe()
    assert (info["openvino_streams"], info["openvino_threads"], info["openvino_precision"]) == (1, 1, "f32")
    ex.configure({"batch": 16})  # another variant, the first kept
    assert ex.run(0, 40).outputs.shape == (40, 10)


def test_a_variant_the_executor_built_before_is_not_built_again(lenet_workload, monkeypatch):
    monkeypatch.setattr("autohet.executors.cpu.memory_available_share", lambda: 1.0)  # memory to spare
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16), ModelSpec("lenet"))
    ex.load(lenet_workload)
    ex.configure({"channels_last": True})
    layout = ex.program
    ex.configure({"channels_last": False})
    ex.configure({"channels_last": True, "batch": 32})  # eager runs any batch: the same program
    assert ex.program is layout


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_released_executor_builds_its_program_again_on_the_next_configure(backend, cache, lenet_workload):
    """What an idle topology's executor drops short of memory (``release``) comes back, from the cached
    conversion, when the tuner returns to it with the same settings."""
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16, backend=backend), ModelSpec("lenet"))
    ex.load(lenet_workload)
    ex.configure({"batch": 32})
    ex.release()
    assert ex.program is None and not ex._programs
    ex.configure({"batch": 32})
    assert_within_product_tolerance(ex.run(0, 40).outputs, reference(lenet_workload, 0, 40), "fp32")
    assert len(ex._programs) == 1


def test_with_memory_short_the_kept_variants_go_before_another_is_built(cache, lenet_workload, monkeypatch):
    """Below KEEP_VARIANTS_MIN_AVAILABLE of the machine's memory available, building a variant first
    drops those kept (each variant holds its own weights and buffers); the new one still runs."""
    from autohet.executors import cpu

    share = [1.0]
    monkeypatch.setattr(cpu, "memory_available_share", lambda: share[0])
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16), ModelSpec("lenet"))
    ex.load(lenet_workload)
    ex.configure({"channels_last": True})
    assert len(ex._programs) == 2
    share[0] = cpu.KEEP_VARIANTS_MIN_AVAILABLE / 2
    ex.configure({"channels_last": True, "batch": 32})  # a kept variant again: nothing built, nothing dropped
    assert len(ex._programs) == 2
    ex.configure({"channels_last": False, "precision": "fp32", "backend": "onnxruntime"})
    assert len(ex._programs) == 1 and ex.run(0, 20).outputs.shape == (20, 10)


def test_a_build_that_failed_after_the_drop_is_built_by_the_next_configure(cache, lenet_workload, monkeypatch):
    """The kept variants dropped and the new one's build failing leaves no program: the next configure
    with the same params builds it (its spec did not change, so the base class alone would not)."""
    from autohet.executors import cpu
    from autohet.executors.cpu_backends import _onnxruntime

    monkeypatch.setattr(cpu, "memory_available_share", lambda: 0.0)
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16), ModelSpec("lenet"))
    ex.load(lenet_workload)
    real, calls = _onnxruntime.OnnxRuntimeBackend.build, []

    def fails_once(self: Any, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the build failed")
        return real(self, *args)

    monkeypatch.setattr(_onnxruntime.OnnxRuntimeBackend, "build", fails_once)
    with pytest.raises(RuntimeError, match="the build failed"):
        ex.configure({"backend": "onnxruntime"})
    ex.drain()  # no program: nothing to wait for
    ex.configure({"backend": "onnxruntime"})
    assert len(calls) == 2 and ex.run(0, 20).outputs.shape == (20, 10)


def test_what_a_backend_cannot_run_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("AUTOHET_CPU_FLAGS", "-avx512_bf16,-amx_bf16")
    with pytest.raises(UserError, match="cudagraphs is a GPU backend; a CPU group runs eager, inductor, openvino"):
        check_backend("cpu", "cudagraphs", "fp32", "c")
    with pytest.raises(UserError, match="openvino is a CPU backend; a GPU runs eager, inductor, cudagraphs"):
        check_backend("gpu", "openvino", "fp32", "g")
    if importlib.util.find_spec("onnxruntime") is not None:
        with pytest.raises(UserError, match="backend onnxruntime: onnxruntime runs fp32 on a CPU"):
            check_backend("cpu", "onnxruntime", "bf16", "c")
    if importlib.util.find_spec("openvino") is not None:
        with pytest.raises(UserError, match="OpenVINO bf16 needs AVX512-BF16 or AMX.*set precision: fp32"):
            check_backend("cpu", "openvino", "bf16", "c")


def test_a_missing_package_leaves_its_backend_out_of_the_space(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_openvino(name, *args, **kwargs):
        if name.split(".")[0] == "openvino":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openvino)
    assert unsupported("cpu", "backend", "openvino") == "openvino is not installed (pip install openvino)"
    assert unsupported("cpu", "backend", "eager") is None
    with pytest.raises(UserError, match="executor c: backend openvino: openvino is not installed"):
        check_backend("cpu", "openvino", "fp32", "c")


@pytest.mark.skipif(not real_cpu_bf16() or importlib.util.find_spec("openvino") is None,
                    reason="needs a CPU with AVX512-BF16 or AMX, and openvino")
def test_openvino_bf16_runs_bf16_where_the_cpu_has_it(cache, lenet_workload):
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16, backend="openvino", precision="bf16"),
                       ModelSpec("lenet"))
    ex.load(lenet_workload)
    assert ex.describe()["openvino_precision"] == "bf16"
    ref = reference(lenet_workload, 0, 32)
    assert_within_product_tolerance(ex.run(0, 32).outputs, ref, "bf16")


def test_openvino_spreads_a_call_evenly_over_its_requests():
    """A call of several batches keeps every request busy with pieces of at most a batch (15 requests,
    batch 16: 128 images in pieces of 9, not 64 pieces of 2), and a single batch still uses them all."""
    from autohet.executors.cpu_backends._openvino import piece_size

    assert piece_size(128, 15, 16) == 9
    assert piece_size(16, 15, 16) == 2
    assert piece_size(512, 15, 16) == 16
    assert piece_size(3, 2, 16) == 2
    assert piece_size(1, 4, 16) == 1


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino missing")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0),
                    reason="needs cores 0 and 1: one core gives OpenVINO one stream")
def test_openvino_warms_every_request_and_measures_with_every_stream_busy(cache, lenet_workload):
    """A static-batch model (the peer's: a batch per request) warms with one batch per request, and its
    standalone calls hold half its requests' batches (two in flight fill them all; one batch a call
    would leave the other streams idle). One stream: the first batch warms it. The earlier dynamic-batch
    model warms a piece per request at the size a full call is cut into."""
    from autohet.executors.cpu_backends import cpu_backend
    from autohet.executors.cpu_backends._openvino import piece_size

    spec = ExecutorSpec("c", "cpu", (0, 1), batch=16, backend="openvino", streams=2)
    ex = make_executor(spec, ModelSpec("lenet"))
    ex.load(lenet_workload)
    requests = ex.program.requests  # 2, or 1 where an earlier test's compile sized OpenVINO's pool on one core
    assert ex.program.static
    assert ex.program.warm_images(spec.max_unit_images) == (16 * requests if requests > 1 else 0)
    assert ex.standalone_unit() == 16  # at most 2 requests: a batch a call, two calls in flight
    one = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16, backend="openvino", streams=1), ModelSpec("lenet"))
    one.load(lenet_workload)
    assert one.program.warm_images(128) == 0 and one.standalone_unit() == 16
    backend = cpu_backend("openvino")
    backend.dynamic_batch = True
    try:
        dyn = make_executor(spec, ModelSpec("lenet"))
        dyn.load(lenet_workload)
    finally:
        backend.dynamic_batch = False
    requests = dyn.program.requests
    assert not dyn.program.static or requests == 1  # one request: a static batch either way
    if requests > 1:
        unit = spec.max_unit_images
        assert dyn.program.warm_images(unit) == requests * piece_size(unit, requests, 16)


def test_a_batch_per_request_program_is_measured_in_calls_that_fill_its_requests():
    """15 requests of a batch each: standalone calls of 8 batches (two in flight: 16 pieces), at most a
    pool part; a program that spreads one batch over its requests keeps calls of a batch."""
    from autohet.executors.cpu import CpuExecutor

    ex = CpuExecutor.__new__(CpuExecutor)
    ex.spec = ExecutorSpec("c", "cpu", tuple(range(15)), batch=16, backend="openvino")
    ex.program, _ = _fake_program(15)
    assert ex.standalone_unit() == 128
    ex.program, _ = _fake_program(4)
    assert ex.standalone_unit() == 32
    ex.program, _ = _fake_program(40)
    assert ex.standalone_unit() == ex.spec.max_unit_images
    ex.program, _ = _fake_program(15, static=False)
    assert ex.standalone_unit() == 16


class _FakeCompiled:
    """What OpenVinoProgram reads of a compiled model: its requests, a static (or dynamic) batch, 4 classes."""

    class _Port:
        def __init__(self, static: bool) -> None:
            self.is_static = static

        def get_partial_shape(self):
            return self

        def __getitem__(self, k: int):
            return type("Dim", (), {"get_length": lambda _self: 4})()

    def __init__(self, requests: int, static: bool) -> None:
        self.requests, self.static = requests, static

    def get_property(self, name: str) -> int:
        assert name == "OPTIMAL_NUMBER_OF_INFER_REQUESTS"
        return self.requests

    def input(self, k: int):
        return self._Port(static=self.static)

    def output(self, k: int):
        return self._Port(static=True)


class _FakeQueue:
    """An AsyncInferQueue whose requests finish only when asked for one (``start_async`` with none
    free: the oldest running finishes first) or for all (``wait_all``): which pieces run when is fixed.
    A piece's outputs are its rows' sums (4 classes), so every row's place can be checked."""

    def __init__(self, requests: int) -> None:
        self.running: list[tuple[np.ndarray, object]] = []
        self.requests = requests
        self.started: list[tuple[int, int]] = []  # (id of the call's output array, offset) in start order

    def set_callback(self, callback) -> None:
        self.callback = callback

    def is_ready(self) -> bool:
        return len(self.running) < self.requests

    def _finish_oldest(self) -> None:
        rows, userdata = self.running.pop(0)
        sums = rows.reshape(len(rows), -1).sum(axis=1, dtype=np.float32)
        data = np.repeat(sums[:, None], 4, axis=1)
        self.callback(type("Request", (), {"get_output_tensor": lambda _self, k: type("T", (), {"data": data})()})(),
                      userdata)

    def start_async(self, inputs, userdata) -> None:
        if not self.is_ready():
            self._finish_oldest()
        self.running.append((np.array(inputs[0]), userdata))
        self.started.append((id(userdata[0]), userdata[1]))

    def wait_all(self) -> None:
        while self.running:
            self._finish_oldest()


def _fake_program(requests: int, static: bool = True):
    from autohet.executors.cpu_backends._openvino import OpenVinoProgram

    queue = _FakeQueue(requests)
    return OpenVinoProgram(_FakeCompiled(requests, static), 16, (1, 2, 2), queue=queue), queue


def _sums(x: np.ndarray) -> np.ndarray:
    return np.repeat(x.reshape(len(x), -1).sum(axis=1, dtype=np.float32)[:, None], 4, axis=1)


def test_openvino_queues_the_next_call_onto_the_requests_the_current_one_frees():
    """Issue 26: a call's 8 pieces over 3 requests end with one request idle through the last piece, and
    every request idle while the actor returns and takes the next call. A call launched behind it
    (``run_ahead``'s next part) starts on the requests the current call's last pieces free: when the
    current call is collected all 3 requests run the next call's pieces."""
    program, queue = _fake_program(3)
    x = np.arange(256 * 4, dtype=np.float32).reshape(256, 1, 2, 2)
    a = program.launch(x[:128], 16)
    b = program.launch(x[128:], 16)
    assert len(queue.running) == 3 and len(program.pending) == 13  # 5 of a's 8 pieces and b's 8 wait
    # exact: the fake computes with this same numpy call
    np.testing.assert_array_equal(program.collect(a), _sums(x[:128]))
    assert [u[0] for _, u in queue.running] == [b, b, b]  # no request idles at the boundary
    assert [off for _, off in queue.started] == [*range(0, 128, 16), 0, 16, 32]
    # exact: the fake computes with this same numpy call
    np.testing.assert_array_equal(program.collect(b), _sums(x[128:]))
    assert not queue.running and not program.pending


def test_openvino_drops_an_announced_call_that_is_not_asked_for():
    """A next part announced but never asked for: its pieces not yet started never start."""
    program, queue = _fake_program(2)
    x = np.arange(64 * 4, dtype=np.float32).reshape(64, 1, 2, 2)
    a = program.launch(x[:32], 16)
    b = program.launch(x[32:], 16)
    program.drop(b)
    # exact: the fake computes with this same numpy call
    np.testing.assert_array_equal(program.collect(a), _sums(x[:32]))
    c = program.launch(x[:16], 16)
    # exact: the fake computes with this same numpy call
    np.testing.assert_array_equal(program.collect(c), _sums(x[:16]))
    assert [call for call, _ in queue.started] == [id(a), id(a), id(c)]  # none of b's
    assert not program.pending


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino missing")
def test_an_openvino_executor_queues_the_announced_part_before_returning(cache, lenet_workload):
    """``run_ahead`` on an OpenVINO group launches the part the actor announces before waiting for the
    current one (as a GPU does); the announced part, asked for next, is the one already launched.
    Outputs in order."""
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16, backend="openvino"), ModelSpec("lenet"))
    ex.load(lenet_workload)
    a = ex.run_ahead(0, 64, (64, 64))
    queued = ex._ahead[(64, 64)]
    b = ex.run_ahead(64, 64, (128, 50))
    assert queued.handle.done.is_set() and (128, 50) in ex._ahead
    c = ex.run_ahead(150, 50, None)  # the announced (128, 50) was not asked for: dropped
    assert not ex._ahead and not ex.program.pending
    tol = 1e-4 * np.max(np.abs(reference(lenet_workload, 0, 200))) + 1e-5
    got = np.concatenate([a.outputs, b.outputs])
    assert np.max(np.abs(got - reference(lenet_workload, 0, 128))) <= tol
    assert np.max(np.abs(c.outputs - reference(lenet_workload, 150, 50))) <= tol
    assert min(a.compute_s, b.compute_s, c.compute_s) > 0


def test_the_dispatcher_names_the_next_unit_to_groups_that_queue_it():
    """OpenVINO groups queue an announced part (``runs_ahead``), so the Ray pool's dispatcher names them
    the next unit while the current one drains, as it does GPUs; synchronous backends run their units
    one call at a time. Read from the backend class: no openvino needed."""
    def spec(backend: str) -> ExecutorSpec:
        return ExecutorSpec("c", "cpu", (0,), batch=16, backend=backend)

    assert runs_ahead(spec("openvino"))
    assert not any(runs_ahead(spec(b)) for b in ("eager", "inductor", "onnxruntime"))
    assert runs_ahead(ExecutorSpec("g", "gpu", (0,), gpu=0))
