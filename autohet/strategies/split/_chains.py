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

Which ops may be in a chain is the op table's ``row_local`` flag (``autohet.partition.OPS``);
``analyse`` is the pure pass: a traced graph in, its stages out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx, nn

from autohet.core.errors import UserError
from autohet.partition import Kind, arg_nodes, node_module, node_shape, op_kind, pair, trace
from autohet.strategies.split._rows import RowNode, Window

__all__ = ["INPUT", "LocalOp", "SpatialGraph", "Stage", "analyse", "spatial_graph", "value_name"]

INPUT = "x"  # the program input's name (what the engine's runs feed)

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


def _conv_window(m: nn.Conv2d) -> Window | None:
    if m.padding_mode != "zeros":
        return None  # reflect/replicate/circular pads read rows of other devices at the borders
    k, s, d = pair(m.kernel_size)[0], pair(m.stride)[0], pair(m.dilation)[0]
    if m.padding == "valid":
        return Window(k, s, 0, d)
    if m.padding == "same":
        total = d * (k - 1)
        wk, wd = pair(m.kernel_size)[1], pair(m.dilation)[1]
        if total % 2 or (wd * (wk - 1)) % 2:
            return None  # asymmetric 'same' padding
        return Window(k, s, total // 2, d)
    return Window(k, s, pair(m.padding)[0], d)


def _local_op(gm: fx.GraphModule, node: fx.Node) -> LocalOp | None:
    """The node as a local op, or None when it is not spatially local (it ends a chain)."""
    shape = node_shape(node)
    args = arg_nodes(node)
    if shape is None or len(shape) != 4 or not args:
        return None
    if any(a.op == "get_attr" or node_shape(a) is None or len(node_shape(a)) != 4 for a in args):  # type: ignore[arg-type]
        return None
    op = op_kind(gm, node)
    if op is None or not op.row_local:
        return None
    inputs = tuple(dict.fromkeys(value_name(a) for a in args))
    height = shape[2]
    in_height = node_shape(args[0])[2]  # type: ignore[index]
    kind, window = "map", None
    m = node_module(gm, node)
    if op.kind == Kind.CONV:
        if type(m) is not nn.Conv2d:
            return None  # a subclass may pad in its own forward: its window is unknown
        kind, window = "conv", _conv_window(m)
    elif op.kind == Kind.POOL and op.pool == "max":
        if m.return_indices:
            return None
        kind, window = "maxpool", Window(pair(m.kernel_size)[0], pair(m.stride or m.kernel_size)[0],
                                         pair(m.padding)[0], pair(m.dilation)[0])
    elif op.kind == Kind.POOL:
        kind, window = "avgpool", Window(pair(m.kernel_size)[0], pair(m.stride or m.kernel_size)[0],
                                         pair(m.padding)[0])
    elif op.kind == Kind.CAT:
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
        if dim not in (1, -3) or any(node_shape(a)[2] != height for a in args):  # type: ignore[index]
            return None
    elif m is None and any(node_shape(a) != shape for a in args):
        return None  # a broadcast operand (squeeze-excitation scale) is not row-local
    if kind != "map" and (window is None or len(args) != 1):
        return None
    if kind == "map" and any(node_shape(a)[2] != height for a in args):  # type: ignore[index]
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
    gm, tracer = trace(model, example)
    return analyse(gm, max_windows, tracer)


def analyse(gm: fx.GraphModule, max_windows: int = 0, tracer: str = "fx") -> SpatialGraph:
    """The stages of a traced graph with shape meta (batch 1): an fx graph in, its row plan out."""
    nodes = list(gm.graph.nodes)
    if sum(n.op == "placeholder" for n in nodes) != 1:
        raise UserError("the row-split strategies need a model with one input tensor")
    out_node = next(n for n in nodes if n.op == "output")
    result = out_node.args[0]
    if not isinstance(result, fx.Node) or node_shape(result) is None:
        raise UserError("the row-split strategies need a model that returns one tensor")
    shapes = {value_name(n): node_shape(n) for n in nodes if node_shape(n) is not None}
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
        reads = [value_name(a) for n in members for a in arg_nodes(n) if a.op != "get_attr"]
        later = {value_name(a) for _, ms, _ in merged[k + 1:] for n in ms for a in arg_nodes(n)} | {output}
        stages.append(Stage(kind, members, ops, tuple(dict.fromkeys(v for v in reads if v not in inside)),
                            tuple(v for v in (value_name(n) for n in members) if v in later)))
    return SpatialGraph(gm, stages, shapes, output, tracer)  # type: ignore[arg-type]
