"""Partitioning at key operators: running the blocks reproduces the model; counts are right."""

from __future__ import annotations

import json

import pytest
import torch

from autohet.core.errors import UserError
from autohet.core.models import build_model
from autohet.partition import partition
from tests.numerics import assert_fp32_close


def _reproduces(name: str, batch: int = 2, **kwargs: object) -> object:
    """The partitioned graph of ``name`` run block by block, within fp32's bound of the whole model."""
    graph = partition(name, batch=batch, **kwargs)
    model = build_model(name)
    x = torch.randn((batch, *graph.input_shape), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_fp32_close(graph.run(x), model(x), model, name)
    return graph


@pytest.mark.parametrize("name", ["lenet", "cifarnet", "resnet18", pytest.param("googlenet", marks=pytest.mark.slow),
                                  pytest.param("vgg11", marks=pytest.mark.slow)])  # those two: 15-20 s
def test_block_chain_reproduces_the_model(name: str) -> None:
    graph = _reproduces(name)
    assert len(graph.blocks) >= 3
    # stage cuts carry one tensor: each block reads exactly one value
    assert all(len(b.inputs) == 1 and len(b.outputs) == 1 for b in graph.blocks)
    assert graph.edges[0] == ("input", graph.blocks[0].name)


def test_lenet_counts_match_a_hand_count() -> None:
    graph = partition("lenet", batch=1)
    first, second, cls = graph.blocks
    # conv 1->20, 5x5, 28x28 -> 24x24: MACs = 20 * 24 * 24 * (1 * 5 * 5)
    assert first.flops == 2 * 20 * 24 * 24 * 25
    assert first.params == 20 * 25 + 20
    assert first.out_shapes == [(1, 20, 12, 12)]
    assert first.out_bytes == 20 * 12 * 12 * 4
    # conv 20->50, 5x5, 12x12 -> 8x8
    assert second.flops == 2 * 50 * 8 * 8 * 20 * 25
    assert second.params == 50 * 20 * 25 + 50
    # fc 800->500->10
    assert cls.flops == 2 * (800 * 500 + 500 * 10)
    assert cls.ops == ["Flatten", "Linear", "ReLU", "Linear"]
    assert partition("lenet", batch=4).blocks[0].flops == 4 * first.flops


def test_resnet18_cuts_after_each_residual_join() -> None:
    graph = partition("resnet18")
    names = graph.names
    assert names[1:9] == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    for block in graph.blocks[1:9]:
        assert "add" in block.ops and block.ops.index("add") < len(block.ops) - 1  # relu after add joins
    assert names[-1] == "fc"
    total = sum(b.flops for b in graph.blocks)
    assert 3.6e9 < total < 3.7e9  # resnet18: 1.82 GMACs


def test_googlenet_cuts_after_each_inception_concat() -> None:
    graph = partition("googlenet")
    inception = [b for b in graph.blocks if b.name.startswith("inception")]
    assert [b.name for b in inception] == ["inception3a", "inception3b", "inception4a", "inception4b",
                                           "inception4c", "inception4d", "inception4e", "inception5a",
                                           "inception5b"]
    assert all("cat" in b.ops for b in inception)


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_vgg16_gives_five_conv_blocks_and_the_classifier() -> None:
    graph = partition("vgg16")
    assert len(graph.blocks) == 6
    for block in graph.blocks[:5]:
        assert "Conv2d" in block.ops and "MaxPool2d" in block.ops and "Linear" not in block.ops
    assert graph.blocks[5].name == "classifier" and graph.blocks[5].ops.count("Linear") == 3
    assert [b.out_shapes[0][1:] for b in graph.blocks[:5]] == [
        (64, 112, 112), (128, 56, 56), (256, 28, 28), (512, 14, 14), (512, 7, 7)]
    assert 30.9e9 < sum(b.flops for b in graph.blocks) < 31.0e9


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_branch_mode_gives_a_dag_that_reproduces_googlenet() -> None:
    graph = _reproduces("googlenet", batch=1, branches=True)
    join = graph["inception3a.join"]
    assert len(graph.predecessors("inception3a.join")) == 4 and join.ops == ["cat"]
    branches = [b for b in graph.blocks if b.kind == "branch" and b.name.startswith("inception3a")]
    assert len(branches) == 4
    assert all(graph.predecessors(b.name) == [graph.blocks[1].name] for b in branches)


def test_explicit_cuts_give_multi_input_blocks() -> None:
    # cutting inside a residual block: the skip tensor crosses two cuts (an edge skipping a block)
    graph = _reproduces("resnet18", batch=1, cuts=["layer1_0_conv1", "layer1_0_bn1"])
    third = graph.blocks[2]
    assert len(third.inputs) == 2
    assert sorted(graph.predecessors(third.name)) == sorted([graph.blocks[0].name, graph.blocks[1].name])
    assert len(graph.blocks[0].outputs) == 2


def test_table_and_json() -> None:
    graph = partition("cifarnet")
    table = graph.to_table()
    assert "FLOPs" in table and graph.blocks[0].name in table and "total" in table
    data = json.loads(graph.to_json())
    assert [b["name"] for b in data["blocks"]] == graph.names
    assert data["blocks"][0]["out_bytes"] == graph.blocks[0].out_bytes
    assert graph.edge_bytes()[("input", graph.blocks[0].name)] == 3 * 32 * 32 * 4


def test_bad_inputs_raise_user_errors() -> None:
    with pytest.raises(UserError, match="unknown model"):
        partition("not_a_model")
    with pytest.raises(UserError, match="unknown cut node"):
        partition("lenet", cuts=["nope"])
    with pytest.raises(UserError, match="at least 1"):
        partition("lenet", batch=0)
    with pytest.raises(UserError, match="input_shape"):
        partition(torch.nn.Linear(2, 2))


def test_placement_on_a_partitioned_model_runs_end_to_end_on_the_engine() -> None:
    from autohet.engine import CpuDevice, Engine
    from autohet.engine.blocks import BlockPrograms, segments
    from autohet.planners import place, problem_from_graph

    graph = partition("lenet", batch=1)
    engine = Engine([CpuDevice("a", (0,)), CpuDevice("b", (1,))])
    try:
        programs = BlockPrograms(engine, graph)
        times = programs.block_times(["a"], runs=3, warmup=1)
        assert set(times) == {(b, "a") for b in graph.names} and all(t > 0 for t in times.values())
        problem = problem_from_graph(graph, ["a"], times)
        assert problem.edge_bytes[(graph.names[-1], "output")] == 10 * 4
        result = place(problem, x=1)
        assert result.assignment == dict.fromkeys(graph.names, "a")
        assert result.time_s == pytest.approx(sum(times.values()))
        calls = []
        measured = place(problem, measure=lambda a: calls.append(a) or programs.measure(a, runs=3, warmup=1), x=1)
        assert measured.measured and len(calls) == 1 and measured.time_s > 0
        x = torch.randn(1, 1, 28, 28)
        split = {b: ("a" if i % 2 == 0 else "b") for i, b in enumerate(graph.names)}  # every cut crosses devices
        assert len(segments(graph, split)) == len(graph.names)
        with torch.no_grad():
            model_ref = graph.run(x)  # this thread's intra-op threads: other kernels than a 1-core device's
            alone = programs.run(result.assignment, x)
            assert_fp32_close(alone, model_ref, build_model("lenet"), "the blocks on one engine device")
            # exact: both devices run each block on one thread of the same kernels; a cut only moves the tensor
            assert torch.equal(programs.run(split, x), alone)
    finally:
        engine.close()


class _ShapeBranch(torch.nn.Module):
    """Python control flow on a shape: fx cannot trace it, torch.export can."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 10:
            x = torch.nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        y = torch.nn.functional.max_pool2d(self.c2(x) + x, 2)
        return self.fc(y.flatten(1))


def test_untraceable_model_falls_back_to_torch_export() -> None:
    model = _ShapeBranch().eval()
    graph = partition(model, batch=2, input_shape=(3, 30, 30))
    assert graph.tracer == "export"
    assert graph.names == ["c1", "c2", "fc"]
    assert [b.params for b in graph.blocks] == [8 * 27 + 8, 8 * 72 + 8, 392 * 10 + 10]
    assert graph.blocks[0].flops == 2 * 2 * 8 * 28 * 28 * 27
    x = torch.randn(2, 3, 30, 30)
    with torch.no_grad():
        assert_fp32_close(graph.run(x), model(x), model)


def test_block_signatures_ignore_the_weight_seed() -> None:
    a, b = partition("lenet", seed=0), partition("lenet", seed=1)
    assert [x.signature for x in a.blocks] == [x.signature for x in b.blocks]
    assert len({x.signature for x in a.blocks}) == len(a.blocks)
    w0, w1 = (g.blocks[0].module.get_submodule("features.0").weight for g in (a, b))
    assert not torch.equal(w0, w1)  # exact: other seeds draw other weights
