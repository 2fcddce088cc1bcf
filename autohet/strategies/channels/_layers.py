"""Which layers of a traced model channel partitioning can split, and what runs with them (seed 004).

A partitionable layer is a ``Conv2d`` with ``groups == 1`` or a ``Linear`` (module calls of the fx
graph). Its *chain* is the run of per-channel ops right after it (batch norm, activations, max/avg
pooling, dropout): each reads only the one before it, which nothing else reads, so they can run on
a device's slice of the output channels before the join. A layer *pairs* with the next
partitionable layer (IOP) when that layer reads the chain's end directly (conv -> conv, linear ->
linear), or through ``flatten(x, 1)`` and parameterless elementwise ops (conv -> ... -> linear:
channel ``c`` becomes features ``[c*HW, (c+1)*HW)``). Everything else (depthwise and grouped
convs, residual adds, concatenations, ...) is *whole*: it runs unsplit on one device. The op
kinds and which ops are per-channel (``channel_local``) come from the op table
(``autohet.partition.OPS``); ``analyse`` is the pure pass: a traced graph in, its layers out.

``part_module`` builds one device's piece: a layer (or a pair) sliced to a channel range, as a
small GraphModule over copies of the fx nodes, sharing nothing with the model but read-only
weights (the engine copies it to the device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from autohet.partition import Kind, node_module, node_shape, op_kind, trace

__all__ = ["ChannelGraph", "ChannelLayer", "analyse", "channel_graph", "part_module", "slice_batchnorm",
           "slice_inputs", "slice_outputs", "whole_module"]

@dataclass
class ChannelLayer:
    """One partitionable layer: its node, chain, and (when it pairs) the bridge to the next layer.

    ``channels``: output channels (features of a linear layer), the dimension OCP splits.
    ``spatial``: H*W of the chain's end when the bridge flattens it (1 otherwise): the next layer's
    input features per channel. Shapes are the traced batch's."""

    index: int
    node: fx.Node
    kind: str  # conv | linear
    channels: int
    chain: list[fx.Node]
    bridge: list[fx.Node]
    pairs_next: bool
    spatial: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]  # after the chain (what OCP joins)
    raw_shape: tuple[int, ...]  # the layer's own output (an IOP partial sum when it is a pair's second)
    flops: int

    @property
    def name(self) -> str:
        return str(self.node.target)

    @property
    def end(self) -> fx.Node:
        """The node whose value OCP joins: the chain's last op, or the layer."""
        return self.chain[-1] if self.chain else self.node


@dataclass
class ChannelGraph:
    """A traced model, its compute nodes in order and its partitionable layers."""

    gm: fx.GraphModule
    nodes: list[fx.Node]
    placeholder: fx.Node
    output: fx.Node
    layers: list[ChannelLayer]
    batch: int

    def value(self, node: fx.Node) -> str:
        """A node's value name in programs (the model input is ``x``)."""
        return "x" if node is self.placeholder else node.name

    def module(self, node: fx.Node) -> nn.Module:
        return self.gm.get_submodule(str(node.target))


def _layer_kind(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """conv for a 2-d Conv2d module with groups == 1, linear for a Linear module on 2-d tensors."""
    mod, op, shape = node_module(gm, node), op_kind(gm, node), node_shape(node)
    if mod is None or op is None or shape is None:
        return None
    if op.kind == Kind.CONV and op.dims == 2 and mod.groups == 1 and len(shape) == 4:
        return "conv"
    if op.kind == Kind.LINEAR and len(shape) == 2:
        return "linear"
    return None


def _only_reads(node: fx.Node, prev: fx.Node) -> bool:
    """``node`` takes ``prev`` as its first argument and no other tensor."""
    return node.all_input_nodes == [prev] and bool(node.args) and node.args[0] is prev


def _elementwise(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A parameterless elementwise op channels may run on a slice."""
    op = op_kind(gm, node)
    return op is not None and op.kind == Kind.ELEMENTWISE and op.channel_local


def _per_channel(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Computes each channel (dim 1) from that channel alone: runs on a slice of the channels."""
    op = op_kind(gm, node)
    if op is None or not op.channel_local:
        return False
    if op.kind == Kind.POOL:
        mod = node_module(gm, node)
        return not (getattr(mod, "return_indices", False) if mod is not None
                    else node.kwargs.get("return_indices", False))
    return True


def _flatten_1(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``flatten(x, 1)`` to the last dim: channel c -> features [c*HW, (c+1)*HW)."""
    op = op_kind(gm, node)
    if op is None or op.kind != Kind.FLATTEN:
        return False
    mod = node_module(gm, node)
    if mod is not None:
        return mod.start_dim == 1 and mod.end_dim == -1
    start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
    end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
    return start == 1 and end == -1


def _single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _chain(gm: fx.GraphModule, layer: fx.Node) -> list[fx.Node]:
    chain: list[fx.Node] = []
    cur = layer
    while (nxt := _single_user(cur)) is not None and _only_reads(nxt, cur) and _per_channel(gm, nxt) \
            and node_shape(nxt) is not None:
        chain.append(nxt)
        cur = nxt
    return chain


def _bridge(gm: fx.GraphModule, end: fx.Node, nxt_layer: fx.Node | None) -> tuple[list[fx.Node], bool] | None:
    """The nodes from the chain's end to ``nxt_layer`` when IOP can pair them: (bridge, flattens)."""
    bridge: list[fx.Node] = []
    flat = False
    cur = end
    while (user := _single_user(cur)) is not None and _only_reads(user, cur):
        if user is nxt_layer:
            return bridge, flat
        if not flat and _flatten_1(gm, user) and len(node_shape(cur) or ()) == 4:
            flat = True
        elif not (flat and _elementwise(gm, user)):
            return None
        bridge.append(user)
        cur = user
    return None


def analyse(gm: fx.GraphModule, batch: int) -> ChannelGraph:
    """The partitionable layers of a traced graph (with shape meta), their chains and pairings."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    found = [n for n in nodes if _layer_kind(gm, n) and node_shape(n.all_input_nodes[0]) is not None
             and len(n.all_input_nodes) == 1 and n.args and n.args[0] is n.all_input_nodes[0]]
    layers: list[ChannelLayer] = []
    for k, node in enumerate(found):
        kind = _layer_kind(gm, node)
        mod = node_module(gm, node)
        chain = _chain(gm, node)
        end = chain[-1] if chain else node
        nxt = found[k + 1] if k + 1 < len(found) else None
        bridge = _bridge(gm, end, nxt) if nxt is not None else None
        pairs, spatial = False, 1
        if bridge is not None and nxt is not None:
            nxt_mod = node_module(gm, nxt)
            end_shape = node_shape(end) or ()
            channels = end_shape[1]
            if bridge[1]:
                spatial = math.prod(end_shape[2:])
                pairs = isinstance(nxt_mod, nn.Linear) and nxt_mod.in_features == channels * spatial
            elif isinstance(nxt_mod, nn.Conv2d):
                pairs = len(end_shape) == 4 and nxt_mod.in_channels == channels
            else:
                pairs = len(end_shape) == 2 and nxt_mod.in_features == channels
        raw = node_shape(node) or ()
        weight = tuple(mod.weight.shape)
        layers.append(ChannelLayer(
            index=k, node=node, kind=kind or "", channels=raw[1], chain=chain,
            bridge=bridge[0] if pairs and bridge else [], pairs_next=pairs, spatial=spatial if pairs else 1,
            in_shape=node_shape(node.all_input_nodes[0]) or (), out_shape=node_shape(end) or (), raw_shape=raw,
            flops=2 * math.prod(raw) * math.prod(weight[1:])))
    return ChannelGraph(gm, nodes, placeholder, output, layers, batch)


def channel_graph(model: nn.Module, example: torch.Tensor) -> ChannelGraph:
    """Traces ``model`` on ``example`` (its batch fixes the shapes) and analyses it."""
    gm, _ = trace(model, example)
    return analyse(gm, example.shape[0])


# --- slicing --------------------------------------------------------------------------------------


def slice_outputs(mod: nn.Module, lo: int, hi: int) -> nn.Module:
    """A conv or linear layer computing output channels [lo, hi) only."""
    weight = mod.weight.detach()[lo:hi].clone()
    bias = mod.bias.detach()[lo:hi].clone() if mod.bias is not None else None
    return _with(mod, weight, bias)


def slice_inputs(mod: nn.Module, lo: int, hi: int, bias: bool) -> nn.Module:
    """A conv or linear layer reading input channels (features) [lo, hi) only: a partial sum of its
    output; ``bias`` keeps the bias (exactly one device of a pair adds it)."""
    weight = mod.weight.detach()[:, lo:hi].clone()
    return _with(mod, weight, mod.bias.detach().clone() if bias and mod.bias is not None else None)


def _with(mod: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    if isinstance(mod, nn.Conv2d):
        out = nn.Conv2d(weight.shape[1], weight.shape[0], mod.kernel_size, mod.stride, mod.padding, mod.dilation,
                        1, bias is not None, mod.padding_mode)
    else:
        out = nn.Linear(weight.shape[1], weight.shape[0], bias is not None)
    with torch.no_grad():
        out.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            out.bias = nn.Parameter(bias, requires_grad=False)
    return out.eval()


def slice_batchnorm(bn: nn.Module, lo: int, hi: int) -> nn.Module:
    """Batch norm over channels [lo, hi) (running statistics and affine parameters sliced)."""
    out = type(bn)(hi - lo, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
    state = {k: (v[lo:hi] if v.dim() == 1 else v) for k, v in bn.state_dict().items()}
    out.load_state_dict(state)
    return out.eval()


def _copy(graph: fx.Graph, node: fx.Node, env: dict[fx.Node, fx.Node]) -> fx.Node:
    """A node copied into ``graph`` (in-place ops made out-of-place: a slice may be read twice)."""
    new = graph.node_copy(node, lambda n: env[n] if n in env else graph.get_attr(str(n.target)))
    if new.kwargs.get("inplace"):
        new.kwargs = {**new.kwargs, "inplace": False}
    new.meta = dict(node.meta)
    return new


def part_module(g: ChannelGraph, layer: ChannelLayer, lo: int, hi: int, pair: ChannelLayer | None = None,
                bias: bool = True) -> fx.GraphModule:
    """One device's piece: ``layer``'s output channels [lo, hi) and its chain; with ``pair`` (the next
    layer, IOP) also the bridge and ``pair`` over the matching input channels (a partial sum, with
    the bias when ``bias``). Input: the layer's input; output: the slice, or the partial sum."""
    root: dict[str, nn.Module] = {layer.name: slice_outputs(g.module(layer.node), lo, hi)}
    for node in layer.chain:
        mod = node_module(g.gm, node)
        if mod is not None:
            root[str(node.target)] = slice_batchnorm(mod, lo, hi) if isinstance(mod, nn.BatchNorm1d |
                                                                                 nn.BatchNorm2d) else mod
    members = [layer.node, *layer.chain]
    if pair is not None:
        members += [*layer.bridge, pair.node]
        for node in layer.bridge:
            if node.op == "call_module":
                root[str(node.target)] = g.module(node)
        root[pair.name] = slice_inputs(g.module(pair.node), lo * layer.spatial, hi * layer.spatial, bias)
    return _module_of(g, members, [layer.node.all_input_nodes[0]], [members[-1]], root)


def whole_module(g: ChannelGraph, members: Sequence[fx.Node], inputs: Sequence[fx.Node],
                 outputs: Sequence[fx.Node]) -> fx.GraphModule:
    """Nodes run unsplit: a GraphModule over the model's own modules."""
    return _module_of(g, list(members), list(inputs), list(outputs), None)


def _module_of(g: ChannelGraph, members: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node],
               root: dict[str, nn.Module] | None) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for k, value in enumerate(inputs):
        env[value] = graph.placeholder(f"in{k}")
        env[value].meta = dict(value.meta)
    for node in members:
        env[node] = _copy(graph, node, env)
    graph.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[o] for o in outputs))
    if root is None:
        module = fx.GraphModule(g.gm, graph)
    else:
        for node in members:  # modules a piece does not slice are the model's own
            if node.op == "call_module" and str(node.target) not in root:
                root[str(node.target)] = g.module(node)
        module = fx.GraphModule(root, graph)
    return module.eval()

