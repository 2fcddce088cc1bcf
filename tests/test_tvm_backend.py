"""Block runners: TVM (Relax) compiles a block that matches PyTorch; the library cache is reused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autohet.backends import PlacedModel, TorchRunner, TvmRunner, make_runner, time_runner
from autohet.errors import UserError
from autohet.partition import partition


@pytest.fixture()
def tvm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOHET_TVM_DIR", str(tmp_path / "tvm"))
    return tmp_path / "tvm"


def test_tvm_cpu_block_matches_torch_and_is_cached(tvm_dir: Path) -> None:
    graph = partition("lenet", batch=2)
    block = graph.blocks[1]
    x = block.example_inputs(seed=3)
    want = block.module(*x).detach()
    runner = make_runner(graph, block.name, "cpu", "tvm")
    assert isinstance(runner, TvmRunner) and not runner.from_cache and not runner.tuned
    got = runner(*x)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-4
    assert runner.library.is_file() and runner.library.is_relative_to(tvm_dir / "cache" / "lenet")
    again = TvmRunner(block, "cpu", model="lenet")
    assert again.from_cache
    assert (again(*x) - want).abs().max().item() < 1e-4
    assert len(time_runner(again, x, runs=3, warmup=1)) == 3


def test_placed_model_mixes_backends(tvm_dir: Path) -> None:
    graph = partition("lenet", batch=1)
    x = torch.randn(1, 1, 28, 28)
    backends = {graph.names[0]: "tvm", graph.names[1]: "torch", graph.names[2]: "tvm"}
    placed = PlacedModel(graph, dict.fromkeys(graph.names, "cpu"), backend=backends)
    assert isinstance(placed.runners[graph.names[1]], TorchRunner)
    with torch.no_grad():
        assert (placed(x) - graph.run(x)).abs().max().item() < 1e-4


def test_bad_backend_inputs(tvm_dir: Path) -> None:
    graph = partition("lenet")
    with pytest.raises(UserError, match="float32"):
        make_runner(graph, graph.names[0], "cpu", "tvm", dtype="fp16")
    with pytest.raises(UserError, match="unknown backend"):
        make_runner(graph, graph.names[0], "cpu", "onnx")
    with pytest.raises(UserError, match="unknown block"):
        make_runner(graph, "nope", "cpu", "torch")
    with pytest.raises(UserError, match="no device for block"):
        PlacedModel(graph, {graph.names[0]: "cpu"})
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
    assert (got.cpu() - want).abs().max().item() < 1e-3
    placed = PlacedModel(graph, {graph.names[0]: "cpu", graph.names[1]: "cuda", graph.names[2]: "cpu"},
                         backend="tvm")
    full = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert (placed(full) - graph.run(full)).abs().max().item() < 1e-3


@pytest.mark.slow
def test_metaschedule_tuning_in_a_child_process_fills_a_reused_database(tvm_dir: Path) -> None:
    from autohet.backends import tune_blocks

    graph = partition("lenet", batch=1)
    block = graph.blocks[0]
    result = tune_blocks([block], "lenet", "cpu", trials=2, timeout_s=300)
    assert result.tuned == [block.name] and result.tasks >= 1 and result.records >= 1
    assert (result.work_dir / "database_tuning_record.json").stat().st_size > 0
    assert result.work_dir.is_relative_to(tvm_dir / "lenet")
    runner = TvmRunner(block, "cpu", model="lenet")
    assert runner.tuned and runner.tag.startswith("db")
    x = block.example_inputs(seed=5)
    assert (runner(*x) - block.module(*x)).abs().max().item() < 1e-4
    again = tune_blocks([block], "lenet", "cpu", trials=2)
    assert again.skipped == [block.name] and not again.tuned
