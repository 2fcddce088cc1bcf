"""What each fx node is: its operator type name, whether it is a key operator, and its FLOPs.

FLOPs counted: 2 x multiply-accumulates of convolutions (incl. transposed and grouped) and
fully-connected layers (Linear, addmm, mm, matmul), for the traced batch. Bias adds, batch norm,
activations, pooling, residual adds and concatenations are not counted: as in the seed's
Algorithm 1 they have no multiply-accumulates and are negligible next to conv/FC.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

__all__ = ["op_name", "is_key_op", "is_activation", "node_macs", "node_params", "out_metas"]

_POOL_MODULES = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.LPPool2d,
)
_POOL_FUNCS = {
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
    F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d, torch.max_pool2d,
    torch.avg_pool1d, torch.adaptive_avg_pool1d,
}
_CAT_FUNCS = {torch.cat, torch.concat, torch.concatenate}
_ADD_FUNCS = {operator.add, operator.iadd, torch.add}
_ACT_MODULES = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid,
    nn.Tanh, nn.ELU, nn.Dropout, nn.Identity,
)
_ACT_FUNCS = {F.relu, torch.relu, F.relu6, F.silu, F.gelu, F.hardswish, F.dropout, torch.sigmoid, torch.tanh}
_ACT_METHODS = {"relu", "relu_", "sigmoid", "tanh"}
_ACT_ATEN = ("relu", "hardtanh", "silu", "gelu", "hardswish", "sigmoid", "tanh", "dropout", "clone")


def _module(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    return gm.get_submodule(node.target) if node.op == "call_module" else None


def _aten(node: fx.Node) -> str:
    """``max_pool2d_with_indices`` for ``aten.max_pool2d_with_indices.default``; '' for non-aten."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.name.split("::")[-1]
    return ""


def op_name(gm: fx.GraphModule, node: fx.Node) -> str:
    """A short operator type name: the module class, the function or method name."""
    if node.op == "call_module":
        return type(_module(gm, node)).__name__
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return _aten(node) or getattr(node.target, "__name__", str(node.target))
    return node.op


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda n: out.append(n) if "tensor_meta" in n.meta else None)
    return out


def is_key_op(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Pooling, concatenation, or a join of two tensors by addition (a residual join)."""
    mod = _module(gm, node)
    if mod is not None:
        return isinstance(mod, _POOL_MODULES)
    if node.op != "call_function":
        return False
    aten = _aten(node)
    if aten:
        if "pool" in aten or aten in ("cat", "concat"):
            return True
        return aten in ("add", "add_") and len(_tensor_args(node)) >= 2
    if node.target in _POOL_FUNCS or node.target in _CAT_FUNCS:
        return True
    return node.target in _ADD_FUNCS and len(_tensor_args(node)) >= 2


def is_activation(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A cheap one-input elementwise op that should stay with the key op it follows."""
    mod = _module(gm, node)
    if mod is not None:
        return isinstance(mod, _ACT_MODULES)
    if node.op == "call_method":
        return node.target in _ACT_METHODS
    if node.op == "call_function":
        aten = _aten(node)
        if aten:
            return aten.rstrip("_") in _ACT_ATEN
        return node.target in _ACT_FUNCS
    return False


def _shape(node: object) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _weight_shape(gm: fx.GraphModule, node: fx.Node, idx: int) -> tuple[int, ...] | None:
    args = list(node.args)
    if len(args) <= idx:
        return None
    arg = args[idx]
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        return tuple(getattr_path(gm, arg.target).shape)
    return _shape(arg)


def getattr_path(root: nn.Module, path: str) -> torch.Tensor:
    obj: object = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def node_macs(gm: fx.GraphModule, node: fx.Node) -> int:
    """Multiply-accumulates of a conv or fully-connected node for the traced batch; 0 otherwise."""
    out = _shape(node)
    if out is None:
        return 0
    out_n = math.prod(out)
    mod = _module(gm, node)
    if isinstance(mod, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        inp = _shape(node.args[0]) or ()
        w = tuple(mod.weight.shape)  # (Cin, Cout/g, k...)
        return math.prod(inp) * math.prod(w[1:]) if inp else 0
    if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
        return out_n * math.prod(tuple(mod.weight.shape)[1:])
    if node.op != "call_function":
        return 0
    aten = _aten(node)
    if node.target in (F.conv1d, F.conv2d, F.conv3d, F.linear) or aten in (
        "conv1d", "conv2d", "conv3d", "convolution", "linear"
    ):
        if aten == "convolution" and len(node.args) > 6 and node.args[6]:
            inp, w = _shape(node.args[0]), _weight_shape(gm, node, 1)
            return math.prod(inp) * math.prod(w[1:]) if inp and w else 0
        w = _weight_shape(gm, node, 1)
        return out_n * math.prod(w[1:]) if w else 0
    if aten in ("addmm",):
        w = _weight_shape(gm, node, 2)
        return out_n * w[0] if w else 0
    if aten in ("mm", "matmul", "bmm") or node.target in (torch.mm, torch.matmul, operator.matmul):
        w = _weight_shape(gm, node, 1)
        return out_n * w[-2] if w and len(w) >= 2 else 0
    return 0


def node_params(gm: fx.GraphModule, node: fx.Node) -> list[torch.Tensor]:
    """Parameters and buffers a node reads directly (its module's, or a get_attr tensor)."""
    if node.op == "call_module":
        mod = _module(gm, node)
        return list(mod.parameters()) + list(mod.buffers())
    if node.op == "get_attr":
        value = getattr_path(gm, node.target)
        return [value] if isinstance(value, torch.Tensor) else []
    return []


def out_metas(node: fx.Node) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each tensor a node produces (a tuple-valued node gives several)."""
    meta = node.meta.get("tensor_meta")
    if meta is None:
        return []
    if hasattr(meta, "shape"):
        return [(tuple(meta.shape), meta.dtype)]
    out: list[tuple[tuple[int, ...], torch.dtype]] = []
    for item in meta if isinstance(meta, (list, tuple)) else []:
        if hasattr(item, "shape"):
            out.append((tuple(item.shape), item.dtype))
    return out
