"""CPU backends (eager, inductor, OpenVINO, ONNX Runtime): outputs equal the model's, conversions are
cached, what a machine cannot run is refused in one line. No Ray."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from autohet.errors import UserError
from autohet.executors import ExecutorSpec, make_executor
from autohet.executors.compiled import check_backend, unsupported
from autohet.models import ModelSpec, build_model
from autohet.workload import Workload, WorkloadSpec

BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(importlib.util.find_spec(b) is None, reason=f"{b} missing"))
            for b in ("openvino", "onnxruntime")]


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
    np.testing.assert_allclose(unit.outputs, reference(lenet_workload, 10, 75), rtol=1e-4, atol=1e-5)
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


def test_a_variant_the_executor_built_before_is_not_built_again(lenet_workload):
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16), ModelSpec("lenet"))
    ex.load(lenet_workload)
    ex.configure({"channels_last": True})
    layout = ex.program
    ex.configure({"channels_last": False})
    ex.configure({"channels_last": True, "batch": 32})  # eager runs any batch: the same program
    assert ex.program is layout


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
    assert np.max(np.abs(ex.run(0, 32).outputs - ref)) < 5e-2 * np.max(np.abs(ref))


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
                    reason="needs cores 0 and 1: one core gives OpenVINO one stream (a static batch)")
def test_openvino_warms_the_piece_size_of_a_full_call(cache, lenet_workload):
    """A dynamic-batch model (several requests) asks for a second warm-up of a piece per request at the
    size a full call (``max_unit_images``) is cut into; a static one (one stream) asks for none."""
    from autohet.executors.cpu_backends._openvino import piece_size

    spec = ExecutorSpec("c", "cpu", (0, 1), batch=16, backend="openvino", streams=2)
    ex = make_executor(spec, ModelSpec("lenet"))
    ex.load(lenet_workload)
    requests = ex.program.requests
    assert ex.program.warm_images(spec.max_unit_images) == requests * piece_size(spec.max_unit_images, requests, 16)
    one = make_executor(ExecutorSpec("c", "cpu", (0,), batch=16, backend="openvino", streams=1), ModelSpec("lenet"))
    one.load(lenet_workload)
    assert one.program.warm_images(128) == 0
