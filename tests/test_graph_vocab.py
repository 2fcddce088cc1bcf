"""The one op table (``autohet.partition.OPS``) and its fx helpers: real torchvision graphs are
classified as each analysis needs, and the old tables' disagreements stay as they were."""

from __future__ import annotations

import operator
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from autohet.core.models import build_model
from autohet.partition import OPS, Kind, arg_nodes, node_module, node_shape, op_kind, pair, tensor_args, trace
from autohet.partition._ops import is_activation, is_key_op
from autohet.strategies.channels._layers import analyse as channel_analysis
from autohet.strategies.split._chains import analyse as split_analysis


@pytest.fixture(scope="module")
def graphs() -> dict[str, fx.GraphModule]:
    """resnet18, mobilenet_v2 and vgg16 traced at 64x64 (the op kinds do not depend on the size)."""
    return {name: trace(build_model(name), torch.zeros(1, 3, 64, 64))[0]
            for name in ("resnet18", "mobilenet_v2", "vgg16")}


def _node(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def _kinds(gm: fx.GraphModule) -> Counter[str]:
    return Counter(op.name for n in gm.graph.nodes if (op := op_kind(gm, n)) is not None)


def test_resnet18_nodes(graphs):
    gm = graphs["resnet18"]
    assert _kinds(gm) == Counter({"conv": 20, "batch_norm": 20, "relu": 17, "add": 8, "max_pool": 1,
                                  "adaptive_avg_pool": 1, "flatten": 1, "linear": 1})
    conv, bn, relu = (op_kind(gm, _node(gm, n)) for n in ("conv1", "bn1", "relu"))
    assert (conv.kind, conv.dims, conv.row_local, conv.channel_local) == (Kind.CONV, 2, True, False)
    assert (bn.kind, bn.row_local, bn.channel_local, bn.trails) == (Kind.NORM, True, True, False)
    assert (relu.kind, relu.trails, relu.row_local, relu.channel_local) == (Kind.ELEMENTWISE, True, True, True)
    pool = op_kind(gm, _node(gm, "maxpool"))
    assert (pool.kind, pool.pool, pool.key, pool.row_local, pool.channel_local) == (Kind.POOL, "max", True, True, True)
    avg = op_kind(gm, _node(gm, "avgpool"))
    assert (avg.pool, avg.key, avg.row_local, avg.channel_local) == ("adaptive_avg", True, False, True)
    add = _node(gm, "add")  # the residual join of layer1.0: x + identity
    assert add.target is operator.add and op_kind(gm, add).kind == Kind.ADD
    assert is_key_op(gm, add) and len(tensor_args(add)) == 2
    assert op_kind(gm, _node(gm, "flatten")).kind == Kind.FLATTEN
    assert op_kind(gm, _node(gm, "fc")).kind == Kind.LINEAR
    assert op_kind(gm, _node(gm, "x")) is None and op_kind(gm, _node(gm, "output")) is None


def test_mobilenet_v2_nodes(graphs):
    gm = graphs["mobilenet_v2"]
    kinds = _kinds(gm)
    assert kinds["conv"] == 52 and kinds["relu6"] == 35 and kinds["add"] == 10 and kinds["dropout"] == 1
    relu6 = next(n for n in gm.graph.nodes if isinstance(node_module(gm, n), nn.ReLU6))
    assert op_kind(gm, relu6).trails  # ReLU6 subclasses Hardtanh, which partition does not keep with a key op
    assert not OPS[nn.Hardtanh].trails and OPS[nn.Hardtanh].row_local
    pool = next(n for n in gm.graph.nodes if n.target is F.adaptive_avg_pool2d)  # functional: no module to read
    op = op_kind(gm, pool)
    assert (op.kind, op.dims, op.key, op.row_local, op.channel_local) == (Kind.POOL, 2, True, False, True)
    depthwise = [n for n in gm.graph.nodes if op_kind(gm, n) is not None and op_kind(gm, n).kind == Kind.CONV
                 and node_module(gm, n).groups > 1]
    assert len(depthwise) == 17
    layers = {layer.node for layer in channel_analysis(gm, 1).layers}
    assert not layers & set(depthwise) and len(layers) == 52 - 17 + 1  # + the classifier's linear


def test_vgg16_nodes(graphs):
    gm = graphs["vgg16"]
    assert _kinds(gm) == Counter({"conv": 13, "relu": 15, "max_pool": 5, "adaptive_avg_pool": 1, "flatten": 1,
                                  "linear": 3, "dropout": 2})
    assert sum(is_key_op(gm, n) for n in gm.graph.nodes) == 6
    assert sum(is_activation(gm, n) for n in gm.graph.nodes) == 17  # relus and dropouts
    chains = split_analysis(gm).chains
    assert len(chains) == 1 and chains[0].windows == 13 + 5  # the features run as one row chain
    assert all(op_kind(gm, op.node).row_local for op in chains[0].ops)
    assert [layer.kind for layer in channel_analysis(gm, 1).layers] == ["conv"] * 13 + ["linear"] * 3


def test_old_disagreements_stay_explicit():
    # partition's activation list is the shortest: a Mish or an F.sigmoid does not trail a key op
    assert [OPS[s].trails for s in (nn.ReLU, nn.Mish, F.leaky_relu, F.sigmoid, torch.sigmoid)] == \
        [True, False, False, False, True]
    # channels never chained a PReLU (a weight per channel), a Dropout2d, F.sigmoid or .sigmoid_
    assert [OPS[s].channel_local for s in (nn.PReLU, nn.Dropout2d, F.sigmoid, ".sigmoid_", ".sigmoid")] == \
        [False, False, False, False, True]
    assert all(OPS[s].row_local for s in (nn.PReLU, nn.Dropout2d, F.sigmoid, ".sigmoid_"))
    # x.add(y) is a row-local map but not a cut of partition; x + y is both
    assert (OPS[".add"].key, OPS[".add"].row_local, OPS[operator.add].key) == (False, True, True)
    # pools: split reads windows off modules only; channels slices 2-d max/avg pools only
    assert (OPS[nn.MaxPool2d].row_local, OPS[F.max_pool2d].row_local, OPS[F.max_pool2d].channel_local) == \
        (True, False, True)
    assert OPS[nn.LPPool2d].key and not OPS[nn.LPPool2d].channel_local and not OPS[nn.MaxPool3d].channel_local
    # aten spellings are partition's only
    assert all(not (op.row_local or op.channel_local) for s, op in OPS.items() if str(s).startswith("aten."))


class _MyConv(nn.Conv2d):
    """A Conv2d subclass: the table finds it through its nearest listed base class."""


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.act = _MyConv(3, 4, 3), nn.Softplus()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))
        return y.view(y.size(0), -1) + y.flatten(1)


class _Leaves(fx.Tracer):
    """Keeps ``_MyConv`` a module call (fx would trace into a module defined outside torch.nn)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, _MyConv) or super().is_leaf_module(m, qualname)


def test_helpers_and_lookup_rules():
    model = _Tiny().eval()
    gm = fx.GraphModule(model, _Leaves().trace(model))
    ShapeProp(gm).propagate(torch.zeros(2, 3, 8, 8))
    conv, act, size, view, add = (_node(gm, n) for n in ("conv", "act", "size", "view", "add"))
    assert op_kind(gm, conv) is OPS[nn.Conv2d]  # a subclass resolves to its listed base
    assert op_kind(gm, act) is None  # Softplus is in no table: opaque to every analysis
    assert node_shape(conv) == (2, 4, 6, 6) and node_shape(size) is None and node_shape(3) is None
    assert arg_nodes(view) == [act, size] and tensor_args(view) == [act]  # an int size carries no tensor meta
    assert arg_nodes(add) == tensor_args(add) == [view, _node(gm, "flatten")]
    assert pair(3) == (3, 3) and pair((2, 5)) == (2, 5) and pair([1, 4]) == (1, 4)
    assert split_analysis(gm).chains == []  # split chains an nn.Conv2d itself only: a subclass may pad itself
