"""The graph vocabulary: one table of what each torch op in an fx graph is, and the fx helpers the
graph analyses share (partition's key-operator cuts, split's row chains, channels' layer chains).

``OPS`` lists every spelling an analysis knows (a module class, a function, a ``.method`` name or
an ``aten.`` op name) with its :class:`OpKind`; ``op_kind(gm, node)`` looks a node up in it. An op
the table does not list is none of the kinds: every analysis treats it as opaque.

An :class:`OpKind` says what the op computes (``kind``, ``dims``, ``pool``) and, in four flags, how
each analysis may treat it. The flags are explicit where the analyses' old tables disagreed about
the same op: each analysis keeps exactly the set it had, so no plan changes (see the comments at
the rows).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

__all__ = ["OPS", "Kind", "OpKind", "arg_nodes", "aten_name", "getattr_path", "node_module", "node_shape", "op_kind",
           "pair", "tensor_args"]


class Kind(StrEnum):
    """What an op computes."""

    ELEMENTWISE = "elementwise"  # one input, output[i] from input[i]: activations, dropout, identity, copies
    NORM = "norm"  # batch norm: a per-channel affine map at inference
    POOL = "pool"
    CONV = "conv"
    CONV_TRANSPOSE = "conv_transpose"
    LINEAR = "linear"
    ADDMM = "addmm"  # bias + input @ weight (aten)
    MATMUL = "matmul"
    ADD = "add"
    MUL = "mul"
    SUB = "sub"
    CAT = "cat"
    FLATTEN = "flatten"


@dataclass(frozen=True)
class OpKind:
    """What an op computes, and which analysis may treat it how.

    ``dims``: spatial dimensions of a conv, pool or norm (1, 2, 3; 0 for any). ``pool``: max | avg |
    adaptive_max | adaptive_avg | lp. ``key``: partition cuts a block after it (pooling,
    concatenation, a residual add). ``trails``: partition keeps it in the block of the key op before
    it (a cheap activation). ``row_local``: split may put it in a row chain (a window read off its
    module, or a map that reads the rows it writes). ``channel_local``: channels may run it on a
    slice of the channels (each output channel from that channel alone, nothing to slice but a
    batch norm's statistics)."""

    name: str
    kind: Kind
    dims: int = 0
    pool: str = ""
    key: bool = False
    trails: bool = False
    row_local: bool = False
    channel_local: bool = False


Spelling = type | Callable[..., Any] | str  # a module class, a function, ".method", "aten.name"


def _aten(*names: str) -> tuple[str, ...]:
    """An aten op and its in-place form (partition matched aten activations up to a trailing ``_``)."""
    return tuple(f"aten.{n}{suffix}" for n in names for suffix in ("", "_"))


# The unary ops' flag sets. TRC: every analysis. RC and R: spellings an older table never
# listed; each analysis keeps its list as it was, so a model using them keeps its blocks, chains
# and plans:
# - RC, not ``trails``: partition's activation list is the oldest and shortest; listing more
#   would move its cuts past them (placement and pipeline blocks of models that use them).
# - R, not ``channel_local`` either: channels never chained these (nn.PReLU has a per-channel
#   weight channels does not slice; Dropout2d, F.sigmoid, F.tanh, .sigmoid_ and .tanh_ were not listed).
# T, and ``key`` only at aten spellings: split and channels read module attributes, so
# they analyse fx module graphs; an exported graph's aten ops are opaque to them.
_TRC = {"trails": True, "row_local": True, "channel_local": True}
_RC = {"row_local": True, "channel_local": True}
_R = {"row_local": True}
_T = {"trails": True}

_ROWS: list[tuple[OpKind, tuple[Spelling, ...]]] = [
    # unary elementwise ops
    (OpKind("relu", Kind.ELEMENTWISE, **_TRC), (nn.ReLU, F.relu, torch.relu, ".relu", ".relu_")),
    (OpKind("relu6", Kind.ELEMENTWISE, **_TRC), (nn.ReLU6, F.relu6)),
    (OpKind("leaky_relu", Kind.ELEMENTWISE, **_TRC), (nn.LeakyReLU,)),
    (OpKind("leaky_relu", Kind.ELEMENTWISE, **_RC), (F.leaky_relu,)),
    (OpKind("silu", Kind.ELEMENTWISE, **_TRC), (nn.SiLU, F.silu)),
    (OpKind("gelu", Kind.ELEMENTWISE, **_TRC), (nn.GELU, F.gelu)),
    (OpKind("hardswish", Kind.ELEMENTWISE, **_TRC), (nn.Hardswish, F.hardswish)),
    (OpKind("hardsigmoid", Kind.ELEMENTWISE, **_TRC), (nn.Hardsigmoid,)),
    (OpKind("hardsigmoid", Kind.ELEMENTWISE, **_RC), (F.hardsigmoid,)),
    (OpKind("sigmoid", Kind.ELEMENTWISE, **_TRC), (nn.Sigmoid, torch.sigmoid, ".sigmoid")),
    (OpKind("sigmoid", Kind.ELEMENTWISE, **_R), (F.sigmoid, ".sigmoid_")),
    (OpKind("tanh", Kind.ELEMENTWISE, **_TRC), (nn.Tanh, torch.tanh, ".tanh")),
    (OpKind("tanh", Kind.ELEMENTWISE, **_R), (F.tanh, ".tanh_")),
    (OpKind("elu", Kind.ELEMENTWISE, **_TRC), (nn.ELU,)),
    (OpKind("elu", Kind.ELEMENTWISE, **_RC), (F.elu,)),
    (OpKind("hardtanh", Kind.ELEMENTWISE, **_RC), (nn.Hardtanh, F.hardtanh)),
    (OpKind("mish", Kind.ELEMENTWISE, **_RC), (nn.Mish, F.mish)),
    (OpKind("prelu", Kind.ELEMENTWISE, **_R), (nn.PReLU,)),
    (OpKind("dropout", Kind.ELEMENTWISE, **_TRC), (nn.Dropout, F.dropout)),
    (OpKind("dropout", Kind.ELEMENTWISE, **_R), (nn.Dropout2d,)),
    (OpKind("identity", Kind.ELEMENTWISE, **_TRC), (nn.Identity,)),
    (OpKind("contiguous", Kind.ELEMENTWISE, **_RC), (".contiguous",)),
    (OpKind("activation", Kind.ELEMENTWISE, **_T),
     _aten("relu", "hardtanh", "silu", "gelu", "hardswish", "sigmoid", "tanh", "dropout", "clone")),
    # batch norm: BatchNorm1d was only ever channels' (split needs 4-d tensors anyway)
    (OpKind("batch_norm", Kind.NORM, 2, row_local=True, channel_local=True), (nn.BatchNorm2d,)),
    (OpKind("batch_norm", Kind.NORM, 1, channel_local=True), (nn.BatchNorm1d,)),
    # pools: all are partition's key ops. split reads a window's kernel, stride and padding off its
    # module (a functional pool ends a chain); channels slices 2-d max/avg pools (a 1-d or 3-d pool
    # over a 4-d tensor may pool across channels; nn.LPPool2d was never in its list).
    (OpKind("max_pool", Kind.POOL, 2, "max", key=True, row_local=True, channel_local=True), (nn.MaxPool2d,)),
    (OpKind("max_pool", Kind.POOL, 2, "max", key=True, channel_local=True), (F.max_pool2d, torch.max_pool2d)),
    (OpKind("max_pool", Kind.POOL, 1, "max", key=True), (nn.MaxPool1d, F.max_pool1d)),
    (OpKind("max_pool", Kind.POOL, 3, "max", key=True), (nn.MaxPool3d, F.max_pool3d)),
    (OpKind("avg_pool", Kind.POOL, 2, "avg", key=True, row_local=True, channel_local=True), (nn.AvgPool2d,)),
    (OpKind("avg_pool", Kind.POOL, 2, "avg", key=True, channel_local=True), (F.avg_pool2d,)),
    (OpKind("avg_pool", Kind.POOL, 1, "avg", key=True), (nn.AvgPool1d, F.avg_pool1d, torch.avg_pool1d)),
    (OpKind("avg_pool", Kind.POOL, 3, "avg", key=True), (nn.AvgPool3d, F.avg_pool3d)),
    (OpKind("adaptive_avg_pool", Kind.POOL, 2, "adaptive_avg", key=True, channel_local=True),
     (nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d)),
    (OpKind("adaptive_avg_pool", Kind.POOL, 1, "adaptive_avg", key=True),
     (nn.AdaptiveAvgPool1d, F.adaptive_avg_pool1d, torch.adaptive_avg_pool1d)),
    (OpKind("adaptive_avg_pool", Kind.POOL, 3, "adaptive_avg", key=True), (nn.AdaptiveAvgPool3d,)),
    (OpKind("adaptive_max_pool", Kind.POOL, 2, "adaptive_max", key=True, channel_local=True),
     (nn.AdaptiveMaxPool2d, F.adaptive_max_pool2d)),
    (OpKind("adaptive_max_pool", Kind.POOL, 1, "adaptive_max", key=True), (nn.AdaptiveMaxPool1d,)),
    (OpKind("adaptive_max_pool", Kind.POOL, 3, "adaptive_max", key=True), (nn.AdaptiveMaxPool3d,)),
    (OpKind("lp_pool", Kind.POOL, 2, "lp", key=True), (nn.LPPool2d,)),
    # binary elementwise ops and concatenation. partition cuts after a residual add spelled as a
    # function (x + y, torch.add); x.add(y) never was one of its key ops.
    (OpKind("add", Kind.ADD, key=True, row_local=True), (operator.add, operator.iadd, torch.add)),
    (OpKind("add", Kind.ADD, row_local=True), (".add", ".add_")),
    (OpKind("add", Kind.ADD, key=True), ("aten.add", "aten.add_")),
    (OpKind("mul", Kind.MUL, row_local=True), (operator.mul, operator.imul, torch.mul, ".mul", ".mul_")),
    (OpKind("sub", Kind.SUB, row_local=True), (operator.sub, torch.sub)),
    (OpKind("cat", Kind.CAT, key=True, row_local=True), (torch.cat, torch.concat, torch.concatenate)),
    (OpKind("cat", Kind.CAT, key=True), ("aten.cat", "aten.concat")),
    # layers with weights (split only chains an nn.Conv2d itself, channels a Conv2d with groups == 1
    # or a Linear: their own rules)
    (OpKind("conv", Kind.CONV, 2, row_local=True), (nn.Conv2d,)),
    (OpKind("conv", Kind.CONV, 1), (nn.Conv1d,)),
    (OpKind("conv", Kind.CONV, 3), (nn.Conv3d,)),
    (OpKind("conv", Kind.CONV), (F.conv1d, F.conv2d, F.conv3d, "aten.conv1d", "aten.conv2d", "aten.conv3d",
                            "aten.convolution")),
    (OpKind("conv_transpose", Kind.CONV_TRANSPOSE), (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)),
    (OpKind("linear", Kind.LINEAR), (nn.Linear, F.linear, "aten.linear")),
    (OpKind("addmm", Kind.ADDMM), ("aten.addmm",)),
    (OpKind("matmul", Kind.MATMUL), (torch.mm, torch.matmul, operator.matmul, "aten.mm", "aten.matmul", "aten.bmm")),
    (OpKind("flatten", Kind.FLATTEN), (nn.Flatten, torch.flatten, ".flatten")),
]

# any other aten op with "pool" in its name (max_pool2d_with_indices, _adaptive_avg_pool2d, ...)
_ATEN_POOL = OpKind("pool", Kind.POOL, key=True)


def _index(rows: list[tuple[OpKind, tuple[Spelling, ...]]]) -> dict[Any, OpKind]:
    out: dict[Any, OpKind] = {}
    for op, spellings in rows:
        for s in spellings:
            if out.get(s, op) != op:  # some aliases are one object (F.avg_pool1d is torch.avg_pool1d)
                raise ValueError(f"{s!r} is listed twice in the op table, as {out[s]} and {op}")
            out[s] = op
    return out


OPS: dict[Any, OpKind] = _index(_ROWS)


def aten_name(node: fx.Node) -> str:
    """``max_pool2d_with_indices`` for ``aten.max_pool2d_with_indices.default``; '' for non-aten."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.name.split("::")[-1]
    return ""


def node_module(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    """The module a ``call_module`` node calls; None for other nodes."""
    return gm.get_submodule(str(node.target)) if node.op == "call_module" else None


def op_kind(gm: fx.GraphModule, node: fx.Node) -> OpKind | None:
    """The table's entry for a node; None for an op the table does not list.

    A module matches its class or the nearest listed base class (as ``isinstance`` would)."""
    if node.op == "call_module":
        mod = node_module(gm, node)
        return next((OPS[c] for c in type(mod).__mro__ if c in OPS), None)
    if node.op == "call_method":
        return OPS.get(f".{node.target}")
    if node.op != "call_function":
        return None
    aten = aten_name(node)
    if aten:
        return OPS.get(f"aten.{aten}", _ATEN_POOL if "pool" in aten else None)
    if isinstance(node.target, type | str):  # the table's classes are modules, its strings methods/aten
        return None
    try:
        return OPS.get(node.target)
    except TypeError:  # an unhashable callable is in no table
        return None


def node_shape(node: object) -> tuple[int, ...] | None:
    """The shape of the one tensor a node produces (from shape propagation); None otherwise."""
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def pair(v: Any) -> tuple[int, int]:
    """A module's int-or-pair argument (kernel_size, stride, ...) as a pair."""
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The node's arguments that carry tensor meta (tensors, weights included), in argument order."""
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda n: out.append(n) if "tensor_meta" in n.meta else None)
    return out


def arg_nodes(node: fx.Node) -> list[fx.Node]:
    """Every fx node among the node's arguments, in argument order, repeats kept."""
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


def getattr_path(root: nn.Module, path: str) -> torch.Tensor:
    """The attribute at a dotted path (a get_attr node's target)."""
    obj: object = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]
