"""Cuts an fx graph into blocks at key operators and turns each block into a GraphModule.

Stage cuts: after each key operator (pooling, concatenation, residual add), moved past the
activations that directly follow it, and only where a single tensor crosses the cut, so a cut
costs one transfer of an already reduced tensor. Blocks without parameters (a lone pooling) are
merged into the block before them: pooling only shrinks the tensor, so the cut after it is cheaper.
Branch mode further splits a stage that ends in a join of disjoint branches (inception modules,
resnet down-sampling blocks) into one block per branch plus a join block, which gives the DAG
the seed's critical-path placement works on.
"""

from __future__ import annotations

import hashlib

import torch
from torch import fx

from autohet.core.errors import UserError
from autohet.partition._graph import Block, BlockGraph, _nbytes
from autohet.partition._ops import is_activation, is_key_op, node_macs, node_params, op_name, out_metas

__all__ = ["build_blocks"]


def _compute_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]


def _last_use(nodes: list[fx.Node], idx: dict[fx.Node, int]) -> dict[fx.Node, int]:
    end = len(nodes)
    last: dict[fx.Node, int] = {}
    for node in [*nodes, *(n for n in nodes[0].graph.nodes if n.op == "placeholder")]:
        uses = [idx.get(u, end) for u in node.users]
        if uses:
            last[node] = max(uses)
    return last


def _live(pos: int, idx: dict[fx.Node, int], last: dict[fx.Node, int]) -> list[fx.Node]:
    """Values produced at or before ``pos`` and read after it (placeholders have index -1)."""
    return [v for v, lu in last.items() if idx.get(v, -1) <= pos < lu]


def _stage_cuts(gm: fx.GraphModule, nodes: list[fx.Node], idx: dict[fx.Node, int]) -> list[int]:
    last = _last_use(nodes, idx)
    cuts: list[int] = []
    for k, node in enumerate(nodes):
        if not is_key_op(gm, node):
            continue
        j = k
        while (j + 1 < len(nodes) and is_activation(gm, nodes[j + 1]) and list(nodes[j].users) == [nodes[j + 1]]
               and nodes[j + 1].all_input_nodes == [nodes[j]]):
            j += 1
        if j < len(nodes) - 1 and len(_live(j, idx, last)) == 1 and (not cuts or cuts[-1] < j):
            cuts.append(j)
    return cuts


def _segments(n: int, cuts: list[int]) -> list[list[int]]:
    bounds = [-1, *sorted(set(cuts)), n - 1]
    return [list(range(a + 1, b + 1)) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _has_work(gm: fx.GraphModule, nodes: list[fx.Node]) -> bool:
    return any(node_params(gm, n) or node_macs(gm, n) for n in nodes)


def _merge_light(gm: fx.GraphModule, nodes: list[fx.Node], segs: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for seg in segs:
        if out and not _has_work(gm, [nodes[i] for i in seg]) or out and not _has_work(gm, [nodes[i] for i in out[-1]]):
            out[-1] = out[-1] + seg
        else:
            out.append(seg)
    return out


def _branches(gm: fx.GraphModule, nodes: list[fx.Node], seg: list[int]) -> list[list[int]] | None:
    """[branch..., join] index lists when the stage is disjoint branches joined by its last key op."""
    members = set(seg)
    joins = [i for i in seg if is_key_op(gm, nodes[i]) and len(nodes[i].all_input_nodes) >= 2]
    if not joins:
        return None
    j = joins[-1]
    idx = {n: i for i, n in enumerate(nodes)}
    groups: list[set[int]] = []
    for arg in nodes[j].all_input_nodes:
        if idx.get(arg) not in members:
            return None
        anc: set[int] = set()
        stack = [arg]
        while stack:
            cur = stack.pop()
            i = idx.get(cur)
            if i is None or i not in members or i in anc:
                continue
            anc.add(i)
            stack.extend(cur.all_input_nodes)
        groups.append(anc)
    union: set[int] = set()
    for g in groups:
        if union & g:
            return None
        union |= g
    tail = [i for i in seg if i not in union]
    if len(groups) < 2 or any(i < j for i in tail):
        return None
    return [sorted(g) for g in groups] + [tail]


def _label(gm: fx.GraphModule, nodes: list[fx.Node]) -> tuple[str, str]:
    """(common module prefix, first..last range) used to name a block."""
    mods, with_params = [], []
    for n in nodes:
        if n.op == "call_module":
            mods.append(str(n.target))
            if any(True for _ in gm.get_submodule(n.target).parameters()):
                with_params.append(str(n.target))
        for a in n.all_input_nodes:  # torch.export graphs read weights through get_attr nodes
            if a.op == "get_attr" and "." in str(a.target):
                owner = str(a.target).rsplit(".", 1)[0]
                mods.append(owner)
                with_params.append(owner)
    mods = list(dict.fromkeys(mods))
    with_params = list(dict.fromkeys(with_params)) or mods
    parts = [m.split(".") for m in with_params]
    prefix: list[str] = []
    for level in zip(*parts, strict=False) if parts else []:
        if len(set(level)) != 1:
            break
        prefix.append(level[0])
    names = mods or [n.name for n in nodes]
    span = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
    joined = ".".join(prefix)
    if len(names) > 1 and joined in mods:  # a leaf module's path would hide the rest of the block
        joined = ""
    return joined, span


def _unique_names(labels: list[tuple[str, str]]) -> list[str]:
    first = [p or s for p, s in labels]
    names = [p if p and first.count(p) == 1 else s for (p, s) in labels]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if names.count(name) == 1 else f"{name}#{seen[name]}")
    return out


def _make_module(gm: fx.GraphModule, members: list[fx.Node], inputs: list[fx.Node],
                 outputs: list[fx.Node]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for value in inputs:
        env[value] = graph.placeholder(value.name)
        env[value].meta = dict(value.meta)

    def arg(n: fx.Node) -> fx.Node:
        if n not in env:
            if n.op != "get_attr":
                raise RuntimeError(f"block input {n.name} missing")
            env[n] = graph.get_attr(n.target)
        return env[n]

    for node in members:
        env[node] = graph.node_copy(node, arg)
    graph.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[o] for o in outputs))
    module = fx.GraphModule(gm, graph)
    module.eval()
    return module


def _signature(module: fx.GraphModule, block_nodes: list[fx.Node], gm: fx.GraphModule,
               in_shapes: list[tuple[int, ...]]) -> str:
    h = hashlib.sha256(module.code.encode())
    for n in block_nodes:
        if n.op == "call_module":
            h.update(repr(gm.get_submodule(n.target)).encode())
        for t in node_params(gm, n):
            h.update(f"{tuple(t.shape)}{t.dtype}".encode())
    h.update(repr(in_shapes).encode())
    return h.hexdigest()[:16]


def build_blocks(gm: fx.GraphModule, model: str, batch: int, input_shape: tuple[int, ...], tracer: str,
                 branches: bool = False, cuts: list[str] | None = None) -> BlockGraph:
    """Cuts ``gm`` (with shape meta) into a BlockGraph; ``cuts`` names fx nodes to cut after instead."""
    nodes = _compute_nodes(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UserError(f"partition supports models with one tensor input, this one has {len(placeholders)}")
    idx = {n: i for i, n in enumerate(nodes)}
    if cuts is not None:
        by_name = {n.name: i for i, n in enumerate(nodes)}
        unknown = [c for c in cuts if c not in by_name]
        if unknown:
            raise UserError(f"unknown cut node {unknown[0]!r}; valid: fx node names such as "
                            f"{', '.join(list(by_name)[:5])} (see `autohet graph --json`)")
        segs = _segments(len(nodes), [by_name[c] for c in cuts])
    else:
        segs = _merge_light(gm, nodes, _segments(len(nodes), _stage_cuts(gm, nodes, idx)))
    groups: list[tuple[list[int], str, int]] = []  # (indices, kind, stage number)
    for s, seg in enumerate(segs):
        split = _branches(gm, nodes, seg) if branches else None
        if split is None:
            groups.append((seg, "stage", s))
        else:
            groups += [(g, "branch", s) for g in split[:-1]] + [(split[-1], "join", s)]
    return _assemble(gm, nodes, placeholders[0], groups, model, batch, input_shape, tracer)


def _block_names(gm: fx.GraphModule, nodes: list[fx.Node], groups: list[tuple[list[int], str, int]]) -> list[str]:
    """Each group's block name: its stage's label (the module path its nodes share), ``.join`` for a
    stage's join, ``stage[span]`` for a part of a stage; unique over the graph."""
    stage_labels: dict[int, list[int]] = {}
    for members, _, s in groups:
        stage_labels.setdefault(s, []).extend(members)
    stage_names = dict(zip(stage_labels, _unique_names(
        [_label(gm, [nodes[i] for i in sorted(m)]) for m in stage_labels.values()]), strict=True))
    raw_names = []
    for members, kind, s in groups:
        if kind == "stage":
            raw_names.append((stage_names[s], stage_names[s]))
        elif kind == "join":
            raw_names.append((f"{stage_names[s]}.join", f"{stage_names[s]}.join"))
        else:
            pre, span = _label(gm, [nodes[i] for i in members])
            raw_names.append((pre if pre.startswith(stage_names[s]) else "", f"{stage_names[s]}[{span}]"))
    return _unique_names(raw_names)


def _parameters(gm: fx.GraphModule, nodes: list[fx.Node]) -> int:
    """The parameters the nodes use, each counted once."""
    seen: set[int] = set()
    count = 0
    for n in nodes:
        for t in node_params(gm, n):
            if id(t) not in seen and isinstance(t, torch.nn.Parameter):
                seen.add(id(t))
                count += t.numel()
    return count


def _assemble(gm: fx.GraphModule, nodes: list[fx.Node], placeholder: fx.Node,
              groups: list[tuple[list[int], str, int]], model: str, batch: int,
              input_shape: tuple[int, ...], tracer: str) -> BlockGraph:
    owner: dict[fx.Node, int] = {}
    for b, (members, _, _) in enumerate(groups):
        for i in members:
            owner[nodes[i]] = b
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    result = out_node.args[0]
    if isinstance(result, (tuple, list)) and len(result) == 1:
        result = result[0]  # torch.export graphs return a flat tuple of outputs
    if not isinstance(result, fx.Node) or result not in owner:
        raise UserError("partition supports models that return one tensor computed by the model; "
                        "wrap the model so forward returns a single tensor")
    names = _block_names(gm, nodes, groups)

    blocks: list[Block] = []
    producer: dict[str, str] = {placeholder.name: "input"}
    for b, (members, kind, _) in enumerate(groups):
        member_nodes = [nodes[i] for i in members]
        inputs: list[fx.Node] = []
        for n in member_nodes:
            for a in n.all_input_nodes:
                if a.op != "get_attr" and owner.get(a) != b and a not in inputs:
                    inputs.append(a)
        outputs = [n for n in member_nodes
                   if n is result or any(u.op != "output" and owner.get(u) != b for u in n.users)]
        module = _make_module(gm, member_nodes, inputs, outputs)
        in_shapes = [out_metas(a)[0][0] for a in inputs]
        out_meta = [out_metas(o) for o in outputs]
        if any(len(m) != 1 for m in out_meta):
            raise UserError(f"block {names[b]} outputs a non-tensor value; cut elsewhere (--cuts)")
        dtype = out_meta[0][0][1]
        attrs = [a for n in member_nodes for a in n.all_input_nodes if a.op == "get_attr"]
        params = _parameters(gm, [*member_nodes, *attrs])
        blocks.append(Block(
            name=names[b], module=module, inputs=[a.name for a in inputs], outputs=[o.name for o in outputs],
            ops=[op_name(gm, n) for n in member_nodes],
            flops=2 * sum(node_macs(gm, n) for n in member_nodes), params=params,
            in_shapes=in_shapes, out_shapes=[m[0][0] for m in out_meta],
            in_bytes=sum(_nbytes(s, dtype) for s in in_shapes),
            out_bytes=sum(_nbytes(m[0][0], m[0][1]) for m in out_meta), dtype=dtype,
            signature=_signature(module, [*member_nodes, *attrs], gm, in_shapes), kind=kind,
        ))
        for o in outputs:
            producer[o.name] = names[b]
    blocks = _toposort(blocks, producer)
    edges = []
    for block in blocks:
        for value in block.inputs:
            edge = (producer[value], block.name)
            if edge not in edges:
                edges.append(edge)
    return BlockGraph(model=model, batch=batch, input_shape=tuple(input_shape), input_name=placeholder.name,
                      output_name=result.name, blocks=blocks, edges=edges, tracer=tracer)


def _toposort(blocks: list[Block], producer: dict[str, str]) -> list[Block]:
    done: set[str] = {"input"}
    order: list[Block] = []
    pending = list(blocks)
    while pending:
        ready = next((b for b in pending if all(producer[v] in done for v in b.inputs)), None)
        if ready is None:
            raise RuntimeError("block graph has a cycle")
        order.append(ready)
        done.add(ready.name)
        pending.remove(ready)
    return order
