"""The onnxruntime_nnpack CPU backend: which layers it may cut out, every choice equals the model, the
timed choice is cached, NNPACK's one pool per process. No Ray; the layers' choice is timed on the
machine, so no test depends on which side wins."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch

from autohet.context import TOLERANCE
from autohet.core.models import ModelSpec, build_model, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec, make_executor
from autohet.executors.cpu_backends import _nnpack
from autohet.executors.cpu_backends._base import ModelSource
from autohet.executors.cpu_backends._nnpack import SegmentedProgram, candidate_cuts
from autohet.partition import trace
from tests.numerics import assert_within_product_tolerance

pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None or
                                not torch.backends.nnpack.is_available(), reason="needs onnxruntime and NNPACK")

CHAIN, RESIDUAL = "tests.nnpack_user_model:chain", "tests.nnpack_user_model:residual"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOHET_COMPILE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fresh_pool(monkeypatch):
    monkeypatch.setattr(_nnpack, "_POOL_OWNER", None)


def cuts_of(name: str) -> list[tuple[str, str]]:
    return candidate_cuts(trace(build_model(name).eval(), torch.zeros((2, *input_shape(name))))[0])


def reference(name: str, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_model(name).eval()(torch.from_numpy(x)).numpy()


def test_only_wide_3x3_layers_of_stride_1_cut_out_with_one_tensor_either_side_are_candidates():
    # chain: its second conv (with its ReLU) and its third (none after it); not the stride-2 conv, not the
    # 64-channel one, not the 3-channel stem
    assert cuts_of(CHAIN) == [("_1", "_3"), ("_4", "_5")]
    assert cuts_of(RESIDUAL) == []  # both wide layers sit inside the residual: more than one tensor crosses
    assert cuts_of("lenet") == []


@pytest.mark.parametrize("chosen", [[], [("_1", "_3")], [("_4", "_5")], [("_1", "_3"), ("_4", "_5")]])
def test_every_choice_of_nnpack_layers_equals_the_model_with_partial_batches(chosen, cache, fresh_pool):
    spec = ExecutorSpec("c", "cpu", (0,), batch=4, backend="onnxruntime_nnpack")
    source = ModelSource(ModelSpec(CHAIN))
    traced = trace(build_model(CHAIN).eval(), torch.zeros((1, *input_shape(CHAIN))))
    steps = _nnpack._steps(source, spec, input_shape(CHAIN), traced, chosen)
    assert [k for k, _ in steps].count("nnpack") == len(chosen)
    x = np.random.default_rng(0).standard_normal((11, *input_shape(CHAIN)), dtype=np.float32)
    out = SegmentedProgram(steps, [b for _, b in chosen]).run(x, 4)  # 4 + 4 + 3 images
    assert_within_product_tolerance(out, reference(CHAIN, x), "fp32")  # Winograd's transforms round more


def test_an_executor_times_the_layers_once_equals_the_model_and_says_which_ran(cache, fresh_pool, monkeypatch):
    timed: list[int] = []
    real = _nnpack._best_seconds
    monkeypatch.setattr(_nnpack, "_best_seconds", lambda fn: timed.append(1) or real(fn))
    workload = Workload.from_spec(WorkloadSpec(40, input_shape(CHAIN), seed=2))
    spec = ExecutorSpec("c", "cpu", (0,), batch=8, backend="onnxruntime_nnpack")
    ex = make_executor(spec, ModelSpec(CHAIN))
    ex.load(workload)
    unit = ex.run(3, 19)
    assert_within_product_tolerance(unit.outputs, reference(CHAIN, workload.rows(3, 19)), "fp32")
    described = ex.describe()
    assert described["backend"] == "onnxruntime_nnpack"
    assert set(described["nnpack_layers"]) <= {"_3", "_5"}
    assert described["nnpack_steps"].count("nnpack") == len(described["nnpack_layers"])
    assert len(timed) == 4  # two candidates, each side once
    assert len(list(cache.rglob("nnpack/*.json"))) == 1
    again = make_executor(spec, ModelSpec(CHAIN))
    again.load(workload)
    assert len(timed) == 4 and again.describe()["nnpack_layers"] == described["nnpack_layers"]  # from the cache


def test_a_model_without_candidates_runs_onnxruntime_whole(cache, fresh_pool):
    workload = Workload.from_spec(WorkloadSpec(20, (1, 28, 28), seed=1))
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=8, backend="onnxruntime_nnpack"), ModelSpec("lenet"))
    ex.load(workload)
    assert ex.describe()["nnpack_steps"] == ["onnxruntime"] and ex.describe()["nnpack_note"] == "no candidate layer"
    assert_within_product_tolerance(ex.run(0, 20).outputs, reference("lenet", workload.rows(0, 20)), "fp32")


def test_nnpacks_one_pool_per_process_serves_the_first_group_only(fresh_pool):
    assert _nnpack._claim_pool(2, (0, 1)) == ""
    assert _nnpack._claim_pool(2, (0, 1)) == ""  # the same group again: still its pool
    why = _nnpack._claim_pool(1, (1,))
    assert "2 threads on cores [0, 1]" in why and "ONNX Runtime alone" in why


def test_a_second_group_in_the_process_runs_onnxruntime_alone_and_says_why(cache, fresh_pool):
    _nnpack._claim_pool(3, (0, 1, 2))  # another group of this process made the pool first
    workload = Workload.from_spec(WorkloadSpec(8, input_shape(CHAIN), seed=2))
    ex = make_executor(ExecutorSpec("c", "cpu", (0,), batch=8, backend="onnxruntime_nnpack"), ModelSpec(CHAIN))
    ex.load(workload)
    assert ex.describe()["nnpack_layers"] == [] and "3 threads" in ex.describe()["nnpack_note"]
    assert_within_product_tolerance(ex.run(0, 8).outputs, reference(CHAIN, workload.rows(0, 8)), "fp32")


def test_without_nnpack_the_backend_is_refused_in_one_line(monkeypatch):
    from autohet.executors.cpu_backends._nnpack import NnpackBackend

    monkeypatch.setattr(torch.backends.nnpack, "is_available", lambda: False)
    why = NnpackBackend().missing()
    assert why is not None and "NNPACK" in why and "onnxruntime" in why and "\n" not in why


def test_a_fresh_process_initialises_nnpack_before_its_first_convolution():
    # torch leaves NNPACK uninitialised until asked whether it is available; every call fails until then
    code = ("import torch; from torch import nn; from autohet.executors.cpu_backends._nnpack import NnpackConv2d; "
            "conv = nn.Conv2d(256, 256, 3, padding=1); x = torch.randn(2, 256, 6, 6); "
            "ref = conv(x); print(float((NnpackConv2d(conv)(x) - ref).abs().max() / ref.abs().max()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split()[-1]) <= TOLERANCE["fp32"]  # relative, as the output check's
