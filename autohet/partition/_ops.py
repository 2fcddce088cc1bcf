"""What each fx node is to partition: its operator type name, whether it is a key operator or an
activation that trails one, and its FLOPs (over the op table of ``_vocab``).

FLOPs counted: 2 x multiply-accumulates of convolutions (incl. transposed and grouped) and
fully-connected layers (Linear, addmm, mm, matmul), for the traced batch. Bias adds, batch norm,
activations, pooling, residual adds and concatenations are not counted: as in the seed's
Algorithm 1 they have no multiply-accumulates and are negligible next to conv/FC.
"""

from __future__ import annotations

import math

import torch
from torch import fx

from autohet.partition._vocab import Kind, aten_name, getattr_path, node_module, node_shape, op_kind, tensor_args

__all__ = ["op_name", "is_key_op", "is_activation", "node_macs", "node_params", "out_metas"]


def op_name(gm: fx.GraphModule, node: fx.Node) -> str:
    """A short operator type name: the module class, the function or method name."""
    if node.op == "call_module":
        return type(node_module(gm, node)).__name__
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return aten_name(node) or getattr(node.target, "__name__", str(node.target))
    return node.op


def is_key_op(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Pooling, concatenation, or a join of two tensors by addition (a residual join)."""
    op = op_kind(gm, node)
    if op is None or not op.key:
        return False
    return op.kind != Kind.ADD or len(tensor_args(node)) >= 2


def is_activation(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A cheap one-input elementwise op that should stay with the key op it follows."""
    op = op_kind(gm, node)
    return op is not None and op.trails


def _weight_shape(gm: fx.GraphModule, node: fx.Node, idx: int) -> tuple[int, ...] | None:
    args = list(node.args)
    if len(args) <= idx:
        return None
    arg = args[idx]
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        return tuple(getattr_path(gm, arg.target).shape)
    return node_shape(arg)


def node_macs(gm: fx.GraphModule, node: fx.Node) -> int:
    """Multiply-accumulates of a conv or fully-connected node for the traced batch; 0 otherwise."""
    out = node_shape(node)
    op = op_kind(gm, node)
    if out is None or op is None:
        return 0
    out_n = math.prod(out)
    mod = node_module(gm, node)
    if mod is not None:
        if op.kind == Kind.CONV_TRANSPOSE:
            inp = node_shape(node.args[0]) or ()
            w = tuple(mod.weight.shape)  # (Cin, Cout/g, k...)
            return math.prod(inp) * math.prod(w[1:]) if inp else 0
        return out_n * math.prod(tuple(mod.weight.shape)[1:]) if op.kind in (Kind.CONV, Kind.LINEAR) else 0
    if node.op != "call_function":
        return 0
    if op.kind in (Kind.CONV, Kind.LINEAR):
        if aten_name(node) == "convolution" and len(node.args) > 6 and node.args[6]:
            inp, w = node_shape(node.args[0]), _weight_shape(gm, node, 1)
            return math.prod(inp) * math.prod(w[1:]) if inp and w else 0
        w = _weight_shape(gm, node, 1)
        return out_n * math.prod(w[1:]) if w else 0
    if op.kind == Kind.ADDMM:
        w = _weight_shape(gm, node, 2)
        return out_n * w[0] if w else 0
    if op.kind == Kind.MATMUL:
        w = _weight_shape(gm, node, 1)
        return out_n * w[-2] if w and len(w) >= 2 else 0
    return 0


def node_params(gm: fx.GraphModule, node: fx.Node) -> list[torch.Tensor]:
    """Parameters and buffers a node reads directly (its module's, or a get_attr tensor)."""
    if node.op == "call_module":
        mod = node_module(gm, node)
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
