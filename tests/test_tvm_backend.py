"""Block runners: TVM (Relax) compiles a block that matches PyTorch; the library cache is reused."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autohet.block_runners import TorchRunner, TvmRunner, make_runner, time_runner
from autohet.core.errors import UserError
from autohet.core.models import build_model
from autohet.partition import partition
from tests.numerics import (
    assert_fp32_close,
    assert_run_fp32_close,
    assert_within_product_tolerance,
    fp32_bound,
    longest_reduction,
)

REPO = Path(__file__).resolve().parents[1]

# TVM is one of the project's packages (scripts/setup.sh installs it, and .ci/run checks it imports, so CI
# never skips here); a machine that lacks it, such as the GPU box with only the wheels carried there,
# skips this module, as tests/test_cpu_backends.py does for OpenVINO
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="apache-tvm missing")


@pytest.fixture()
def tvm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOHET_TVM_DIR", str(tmp_path / "tvm"))
    return tmp_path / "tvm"


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_tvm_cpu_block_matches_torch_and_is_cached(tvm_dir: Path) -> None:
    graph = partition("lenet", batch=2)
    block = graph.blocks[1]
    x = block.example_inputs(seed=3)
    want = block.module(*x).detach()
    runner = make_runner(graph, block.name, "cpu", "tvm")
    assert isinstance(runner, TvmRunner) and not runner.from_cache and not runner.tuned
    got = runner(*x)
    assert got.shape == want.shape
    assert_fp32_close(got, want, block.module)  # TVM's loops sum in another order than oneDNN
    assert runner.library.is_file() and runner.library.is_relative_to(tvm_dir / "cache" / "lenet")
    again = TvmRunner(block, "cpu", model="lenet")
    assert again.from_cache
    assert_fp32_close(again(*x), want, block.module)
    assert len(time_runner(again, x, runs=3, warmup=1)) == 3


def _engine(*devices: str):
    from autohet.engine import CpuDevice, Engine, GpuDevice

    return Engine([CpuDevice(d, (0,)) if d.startswith("cpu") else GpuDevice(d, 0) for d in devices])


def test_placed_model_mixes_backends(tvm_dir: Path) -> None:
    from autohet.engine.blocks import BlockPrograms

    graph = partition("lenet", batch=1)
    x = torch.randn(1, 1, 28, 28)
    backends = {graph.names[0]: "tvm", graph.names[1]: "torch", graph.names[2]: "tvm"}
    engine = _engine("cpu0")
    try:
        programs = BlockPrograms(engine, graph, backends)
        assert isinstance(programs.runner(graph.names[1], "cpu0"), TorchRunner)
        assert isinstance(programs.runner(graph.names[0], "cpu0"), TvmRunner)
        with torch.no_grad():
            assert_fp32_close(programs.run(dict.fromkeys(graph.names, "cpu0"), x), graph.run(x), build_model("lenet"))
    finally:
        engine.close()


def test_bad_backend_inputs(tvm_dir: Path) -> None:
    graph = partition("lenet")
    with pytest.raises(UserError, match="float32"):
        make_runner(graph, graph.names[0], "cpu", "tvm", dtype="fp16")
    with pytest.raises(UserError, match="unknown backend"):
        make_runner(graph, graph.names[0], "cpu", "onnx")
    with pytest.raises(UserError, match="unknown block"):
        make_runner(graph, "nope", "cpu", "torch")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA GPU"):
            make_runner(graph, graph.names[0], "cuda", "torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tvm_cuda_block_matches_torch(tvm_dir: Path) -> None:
    graph = partition("lenet", batch=2)
    block = graph.blocks[1]
    x = block.example_inputs(seed=3)
    want = block.module(*x).detach()
    runner = make_runner(graph, block.name, "cuda", "tvm")
    assert runner.target["kind"] == "cuda" and runner.target["arch"].startswith("sm_")
    got = runner(*(t.cuda() for t in x))
    assert got.is_cuda
    assert_within_product_tolerance(got, want, "fp32")  # a GPU's kernels against the CPU's
    from autohet.engine.blocks import BlockPrograms

    engine = _engine("cpu0", "gpu0")
    try:
        programs = BlockPrograms(engine, graph, "tvm")
        full = torch.randn(2, 1, 28, 28)
        mixed = {graph.names[0]: "cpu0", graph.names[1]: "gpu0", graph.names[2]: "cpu0"}
        with torch.no_grad():
            assert_within_product_tolerance(programs.run(mixed, full), graph.run(full), "fp32")
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tvm_cuda_kernels_from_the_libnvrtc_fallback_run(tvm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback compiler (libnvrtc through ctypes, no headers) on a real GPU, whichever one
    ensure_cuda would pick on this machine."""
    from autohet.block_runners.tvm import _toolchain, tvm_target

    libs = _toolchain._find_lib("libnvrtc")
    if not libs:
        pytest.skip("no libnvrtc found")
    arch = tvm_target("cuda")[0]["arch"]
    before = os.environ.get("AUTOHET_TVM_CUDA_COMPILER")
    monkeypatch.setenv("AUTOHET_TVM_CUDA_COMPILER", f"nvrtc:{libs[0]}")
    monkeypatch.setattr(_toolchain, "_APPLIED", {})
    try:
        graph = partition("lenet", batch=2)
        block = graph.blocks[0]
        x = block.example_inputs(seed=4)
        runner = TvmRunner(block, "cuda", model="lenet", cache=False)
        assert runner.cuda_compiler == f"nvrtc:{libs[0]}"
        got = runner(*(t.cuda() for t in x))
        assert_within_product_tolerance(got, block.module(*x).detach(), "fp32")
    finally:
        if before:  # the callback registration is process-wide: put back the one chosen before
            _toolchain._APPLIED.clear()
            _toolchain._apply_mode(before, arch)


@pytest.mark.slow
def test_metaschedule_in_one_child_stops_at_its_budget_then_fills_a_reused_database(tvm_dir: Path) -> None:
    """One tuning child serves two jobs (its start is most of a tune's cost on a small box): the first
    with its budget already spent proposes nothing and is not recorded as done; the second tunes."""
    from autohet.block_runners import tune_blocks
    from autohet.block_runners.tvm import TuneSession

    graph = partition("lenet", batch=1)
    block, other = graph.blocks[0], graph.blocks[2]
    with TuneSession("cpu") as session:
        first = session.tune([other], "lenet", trials=64, budget_s=0.01, timeout_s=300)
        assert first.timed_out and first.trials_done == 0 and first.tasks >= 1
        # a small search population: on two cores the evolutionary search, not the measuring, is the cost
        second = session.tune([block], "lenet", trials=2, timeout_s=300, population=32, per_iter=2)
    assert not second.timed_out and second.trials_done == 2 and second.valid == 2
    assert second.log == first.log  # one child served both jobs
    assert second.tuned == [block.name] and second.tasks >= 1 and second.records >= 1
    assert (second.work_dir / "database_tuning_record.json").stat().st_size > 0
    assert second.work_dir.is_relative_to(tvm_dir / "lenet")
    done = json.loads((second.work_dir / "tuned.json").read_text())
    assert block.signature in done and other.signature not in done  # a stopped job is not "done"
    runner = TvmRunner(block, "cpu", model="lenet")
    assert runner.tuned and runner.tag.startswith("db")
    x = block.example_inputs(seed=5)
    assert_fp32_close(runner(*x), block.module(*x), block.module)
    again = tune_blocks([block], "lenet", "cpu", trials=2)
    assert again.skipped == [block.name] and not again.tuned


@pytest.mark.slow
def test_bench_tvm_gpu_smoke_tunes_and_times_lenet_on_the_cpu(tvm_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    env = {**os.environ, "AUTOHET_TVM_DIR": str(tvm_dir), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.tvm_gpu", "--smoke", "--out", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["complete"] and data["device"] == "cpu" and data["target"]["kind"] == "llvm"
    (model,) = data["models"]
    assert model["model"] == "lenet" and model["tuning"]["trials_done"] >= 1 and model["tuning"]["valid"] >= 1, \
        model["tuning"]
    assert [r["block"] for r in model["blocks"]] == partition("lenet").names
    for row in model["blocks"]:
        assert row["tvm"].startswith("tuned") and row["torch_ms"] > 0 and row["tvm_ms"] > 0
        assert row["max_abs_diff"] <= fp32_bound(row["max_abs_ref"], longest_reduction(build_model("lenet")))
        assert 0 <= row["tasks_measured"] <= row["tasks"]
    assert "features.0..features.1" in proc.stdout  # per-block lines are printed as they are measured


def test_no_cuda_compiler_is_a_one_line_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from autohet.block_runners.tvm import _toolchain

    monkeypatch.delenv("AUTOHET_TVM_CUDA_COMPILER", raising=False)
    monkeypatch.delenv("AUTOHET_NVRTC_LIB", raising=False)
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    monkeypatch.setattr(_toolchain, "_APPLIED", {})
    monkeypatch.setattr(_toolchain, "_find_lib", lambda stem: [])
    monkeypatch.setattr(_toolchain, "_nvcc_dir", lambda: None)

    def no_compiler() -> None:
        raise RuntimeError("Cannot find CUDA path\nmore")

    monkeypatch.setattr(_toolchain, "_probe", no_compiler)
    with pytest.raises(UserError) as err:
        _toolchain._ensure_cuda_compiler({"kind": "cuda", "arch": "sm_90"})
    message = str(err.value)
    assert "\n" not in message and "sm_90" in message and "Cannot find CUDA path" in message
    assert "libnvrtc (not found)" in message and "nvidia-cuda-nvrtc" in message and "nvcc" in message
    assert "AUTOHET_TVM_CUDA_COMPILER" not in os.environ


def test_nvrtc_fallback_compiles_tvm_cuda_code_without_headers() -> None:
    """TVM's generated CUDA C compiled by libnvrtc alone (skipped where no libnvrtc is installed)."""
    import tvm

    from autohet.block_runners.tvm import _toolchain, to_relax

    libs = _toolchain._find_lib("libnvrtc")
    if not libs:
        pytest.skip("no libnvrtc here (pip install nvidia-cuda-nvrtc)")
    nvrtc = _toolchain._Nvrtc(libs[0])
    nvrtc.include_dirs = []  # the header-free stub only
    sources = [_toolchain._PROBE]
    if not tvm.runtime.enabled("cuda"):  # without TVM's CUDA runtime the module keeps its CUDA source
        block = partition("lenet", batch=1).blocks[0]
        mod, _ = to_relax(block, block.example_inputs())
        lib = tvm.compile(mod, tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024}))
        stack, sources = [lib.mod], []
        while stack:
            module = stack.pop()
            stack += list(module.imports)
            if module.kind == "cuda":
                sources.append(module.inspect_source(""))
        assert sources and "cuda/std/cstdint" in sources[0]
    for source in sources:
        assert nvrtc.compile(source, "sm_90")[:4] == b"\x7fELF"


def test_partial_database_lines_are_dropped(tmp_path: Path) -> None:
    from autohet.block_runners.tvm._tune_parent import _count_lines, _repair_jsonl

    path = tmp_path / "database_tuning_record.json"
    path.write_bytes(b'[0, [1, 2]]\n[1, [3, 4]]\n[2, [5,')
    _repair_jsonl(path)
    assert path.read_bytes() == b'[0, [1, 2]]\n[1, [3, 4]]\n' and _count_lines(path) == 2


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_placement_per_block_backend_takes_the_faster_measured_backend_per_cell(
        tvm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """backend=per_block: each (block, device) runs with torch or TVM, whichever measured faster;
    the placed model still matches the reference and both whole-model baselines are measured."""
    import autohet.strategies.placement as placement_mod
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.pool import LocalPool, load_pool
    from autohet.strategy_run import run_strategy

    def refuse(model: str, devices: list[str]) -> None:
        raise AssertionError("per_block must not require a tuned database")

    monkeypatch.setattr(placement_mod, "_require_tuned", refuse)
    monkeypatch.setattr(placement_mod, "tvm_ready", lambda model, devices: list(devices))  # as if tuned
    workload = Workload.from_spec(WorkloadSpec(32, (1, 28, 28)))
    ctx = RunContext(ModelSpec("lenet"), workload, mode="latency", latency_runs=10)
    m = run_strategy("placement", {"runs": 3, "backend": "per_block"}, LocalPool(load_pool("actors/cpu1.yaml")), ctx)
    assert_run_fp32_close(m, build_model("lenet"))
    times = m.extra["block_times_ms"]
    for block, kind in m.extra["block_backend"].items():
        other = "tvm" if kind == "torch" else "torch"
        assert times[f"{block}@cpu01/{kind}"] <= times[f"{block}@cpu01/{other}"]
    assert {"cpu01/torch", "cpu01/tvm"} <= set(m.extra["baselines_p50_ms"])


def test_placement_per_block_without_a_database_measures_torch_only(tvm_dir: Path) -> None:
    """No MetaSchedule database: TVM is not timed at all (untuned it would cost minutes and lose)."""
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.pool import LocalPool, load_pool
    from autohet.strategy_run import run_strategy

    workload = Workload.from_spec(WorkloadSpec(16, (1, 28, 28)))
    ctx = RunContext(ModelSpec("lenet"), workload, mode="latency", latency_runs=5)
    m = run_strategy("placement", {"runs": 2, "backend": "per_block"}, LocalPool(load_pool("actors/cpu1.yaml")), ctx)
    assert m.output_ok
    assert set(m.extra["block_backend"].values()) == {"torch"}
    assert set(m.extra["baselines_p50_ms"]) == {"cpu01/torch"}
