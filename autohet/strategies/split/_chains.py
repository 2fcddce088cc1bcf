"""A traced model as stages for the row-split families: chains of spatially-local ops, split by
image rows between devices, and the rest, run whole on one device.

Spatially local (output row o depends only on nearby input rows): 2-d convolutions with zero
padding (stride, dilation, groups), max and average pooling (ceil_mode included), batch norm,
activations, dropout and identity, residual adds of same-shaped tensors and channel concatenation.
Anything else (adaptive pools, flatten, linear layers, reshapes, squeeze-excitation products with
a broadcast operand, ops reading constants) ends a chain. Chains are maximal runs of local ops in
topological order, optionally cut once ``max_windows`` convolutions/poolings are in it, at the next
point where one tensor alone crosses (a long chain's halo grows with its receptive field; a cut
trades that recompute for one more join). A chain without
any window op has nothing worth splitting and runs with the rest.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from autohet.errors import UserError
from autohet.strategies.split._rows import RowNode, Window

__all__ = ["INPUT", "LocalOp", "SpatialGraph", "Stage", "spatial_graph", "value_name"]

INPUT = "x"  # the program input's name (what the engine's runs feed)

_MAP_MODULES = (
    nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid,
    nn.Tanh, nn.ELU, nn.Mish, nn.PReLU, nn.Dropout, nn.Dropout2d, nn.Identity, nn.Hardtanh,
)
_UNARY_FUNCS = {F.relu, torch.relu, F.relu6, F.hardtanh, F.silu, F.gelu, F.hardswish, F.hardsigmoid, F.sigmoid,
                torch.sigmoid, torch.tanh, F.tanh, F.dropout, F.leaky_relu, F.elu, F.mish}
_BINARY_FUNCS = {operator.add, operator.iadd, torch.add, operator.mul, operator.imul, torch.mul, operator.sub,
                 torch.sub}
_CAT_FUNCS = {torch.cat, torch.concat, torch.concatenate}
_MAP_METHODS = {"relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "contiguous", "add", "add_", "mul", "mul_"}


def value_name(node: fx.Node) -> str:
    """The program value a node writes (the model input is ``x``, as the engine's runs feed it)."""
    if node.op == "placeholder":
        return INPUT
    return node.name if node.name != INPUT else f"{INPUT}_value"


@dataclass
class LocalOp:
    """A spatially-local node: ``kind`` conv | maxpool | avgpool (a window over its one input) or map
    (reads the rows it writes: elementwise, residual add, channel concatenation)."""

    node: fx.Node
    kind: str
    row: RowNode

    @property
    def name(self) -> str:
        return self.row.name


@dataclass
class Stage:
    """Consecutive nodes: a chain of local ops (``ops``) or the rest (``nodes``, run whole on one device);
    the values it reads from earlier stages and those read after it."""

    kind: str
    nodes: list[fx.Node]
    ops: list[LocalOp] = field(default_factory=list)
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    @property
    def windows(self) -> int:
        return sum(op.kind != "map" for op in self.ops)


@dataclass
class SpatialGraph:
    """The traced model (shapes at batch 1), its stages in order and its output value."""

    gm: fx.GraphModule
    stages: list[Stage]
    shapes: dict[str, tuple[int, ...]]
    output: str
    tracer: str = "fx"

    @property
    def chains(self) -> list[Stage]:
        return [s for s in self.stages if s.kind == "chain"]

    def height(self, value: str) -> int:
        return self.shapes[value][2]


def _shape(node: Any) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))


def _conv_window(m: nn.Conv2d) -> Window | None:
    if m.padding_mode != "zeros":
        return None  # reflect/replicate/circular pads read rows of other devices at the borders
    k, s, d = _pair(m.kernel_size)[0], _pair(m.stride)[0], _pair(m.dilation)[0]
    if m.padding == "valid":
        return Window(k, s, 0, d)
    if m.padding == "same":
        total = d * (k - 1)
        wk, wd = _pair(m.kernel_size)[1], _pair(m.dilation)[1]
        if total % 2 or (wd * (wk - 1)) % 2:
            return None  # asymmetric 'same' padding
        return Window(k, s, total // 2, d)
    return Window(k, s, _pair(m.padding)[0], d)


def _local_op(gm: fx.GraphModule, node: fx.Node) -> LocalOp | None:
    """The node as a local op, or None when it is not spatially local (it ends a chain)."""
    shape = _shape(node)
    args = _tensor_args(node)
    if shape is None or len(shape) != 4 or not args:
        return None
    if any(a.op == "get_attr" or _shape(a) is None or len(_shape(a)) != 4 for a in args):  # type: ignore[arg-type]
        return None
    inputs = tuple(dict.fromkeys(value_name(a) for a in args))
    height = shape[2]
    in_height = _shape(args[0])[2]  # type: ignore[index]
    kind, window = "map", None
    if node.op == "call_module":
        m = gm.get_submodule(str(node.target))
        if isinstance(m, nn.Conv2d) and type(m) is nn.Conv2d:
            kind, window = "conv", _conv_window(m)
        elif isinstance(m, nn.MaxPool2d) and not m.return_indices:
            kind, window = "maxpool", Window(_pair(m.kernel_size)[0], _pair(m.stride or m.kernel_size)[0],
                                             _pair(m.padding)[0], _pair(m.dilation)[0])
        elif isinstance(m, nn.AvgPool2d):
            kind, window = "avgpool", Window(_pair(m.kernel_size)[0], _pair(m.stride or m.kernel_size)[0],
                                             _pair(m.padding)[0])
        elif not isinstance(m, _MAP_MODULES):
            return None
        if kind != "map" and (window is None or len(args) != 1):
            return None
    elif node.op == "call_function":
        if node.target in _CAT_FUNCS:
            dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
            if dim not in (1, -3) or any(_shape(a)[2] != height for a in args):  # type: ignore[index]
                return None
        elif node.target in _UNARY_FUNCS or node.target in _BINARY_FUNCS:
            if any(_shape(a) != shape for a in args):
                return None  # a broadcast operand (squeeze-excitation scale) is not row-local
        else:
            return None
    elif node.op == "call_method":
        if node.target not in _MAP_METHODS or any(_shape(a) != shape for a in args):
            return None
    else:
        return None
    if kind == "map" and any(_shape(a)[2] != height for a in args):  # type: ignore[index]
        return None
    return LocalOp(node, kind, RowNode(value_name(node), inputs, height, window, in_height if window else 0))


def _narrow_points(order: list[fx.Node]) -> set[int]:
    """Positions k after which one tensor alone (node k's) is read later: where a chain may be cut
    with one join (inside a residual block or an inception module several values are live)."""
    last: dict[fx.Node, int] = {}
    for k, node in enumerate(order):
        for a in node.all_input_nodes:
            last[a] = k
    out = set()
    live: set[fx.Node] = set()
    for k, node in enumerate(order):
        live = {v for v in live if last.get(v, -1) > k}
        if last.get(node, len(order)) > k:
            live.add(node)
        if live == {node}:
            out.add(k)
    return out


def spatial_graph(model: nn.Module, example: torch.Tensor, max_windows: int = 0) -> SpatialGraph:
    """The model's stages. ``example`` (batch 1) gives the shapes; ``max_windows`` > 0 cuts chains
    holding that many convolutions/poolings where one tensor crosses."""
    from autohet.partition import trace

    gm, tracer = trace(model, example)
    nodes = list(gm.graph.nodes)
    if sum(n.op == "placeholder" for n in nodes) != 1:
        raise UserError("the row-split strategies need a model with one input tensor")
    out_node = next(n for n in nodes if n.op == "output")
    result = out_node.args[0]
    if not isinstance(result, fx.Node) or _shape(result) is None:
        raise UserError("the row-split strategies need a model that returns one tensor")
    shapes = {value_name(n): _shape(n) for n in nodes if _shape(n) is not None}
    order = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
    narrow = _narrow_points(order)
    groups: list[tuple[str, list[fx.Node], list[LocalOp]]] = []
    for k, node in enumerate(order):
        op = _local_op(gm, node)
        if op is None:
            if groups and groups[-1][0] == "rest":
                groups[-1][1].append(node)
            else:
                groups.append(("rest", [node], []))
            continue
        current = groups[-1] if groups and groups[-1][0] == "chain" else None
        full = current is not None and max_windows > 0 and k - 1 in narrow \
            and sum(o.kind != "map" for o in current[2]) >= max_windows
        if current is None or full:
            groups.append(("chain", [node], [op]))
        else:
            current[1].append(node)
            current[2].append(op)
    merged: list[tuple[str, list[fx.Node], list[LocalOp]]] = []
    for kind, members, ops in groups:  # a chain without a window op is not worth a split
        if kind == "chain" and not any(o.kind != "map" for o in ops):
            kind, ops = "rest", []
        if kind == "rest" and merged and merged[-1][0] == "rest":
            merged[-1][1].extend(members)
        else:
            merged.append((kind, list(members), list(ops)))
    output = value_name(result)
    stages = []
    for k, (kind, members, ops) in enumerate(merged):
        inside = {value_name(n) for n in members}
        reads = [value_name(a) for n in members for a in _tensor_args(n) if a.op != "get_attr"]
        later = {value_name(a) for _, ms, _ in merged[k + 1:] for n in ms for a in _tensor_args(n)} | {output}
        stages.append(Stage(kind, members, ops, tuple(dict.fromkeys(v for v in reads if v not in inside)),
                            tuple(v for v in (value_name(n) for n in members) if v in later)))
    return SpatialGraph(gm, stages, shapes, output, tracer)  # type: ignore[arg-type]
