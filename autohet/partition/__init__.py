"""Cuts a CNN into a DAG of runnable blocks at key operators (seed 001, Algorithm 1 and 2).

``partition("resnet18")`` traces the model, cuts it after pooling, concatenation and residual
joins where one tensor crosses the cut, and counts per block its FLOPs (2 x conv/FC
multiply-accumulates), parameters and output size. ``BlockGraph.run(x)`` reproduces the model.

The graph vocabulary the analyses of fx graphs share (here and in the split and channels
strategies): ``OPS``, the one op table, ``op_kind`` to look a node up, and the fx helpers
``node_shape``, ``node_module``, ``pair``, ``tensor_args``, ``arg_nodes``, ``aten_name``.
"""

from __future__ import annotations

import torch
from torch import nn

from autohet.core.errors import UserError
from autohet.partition._build import build_blocks
from autohet.partition._graph import Block, BlockGraph, format_count
from autohet.partition._trace import trace
from autohet.partition._vocab import (
    OPS,
    Kind,
    OpKind,
    arg_nodes,
    aten_name,
    node_module,
    node_shape,
    op_kind,
    pair,
    tensor_args,
)

__all__ = ["OPS", "Block", "BlockGraph", "Kind", "OpKind", "arg_nodes", "aten_name", "build_blocks", "format_count",
           "node_module", "node_shape", "op_kind", "pair", "partition", "tensor_args", "trace"]


def partition(model: str | nn.Module, batch: int = 1, *, seed: int = 0, branches: bool = False,
              cuts: list[str] | None = None, input_shape: tuple[int, ...] | None = None,
              name: str | None = None) -> BlockGraph:
    """The model's block DAG for inputs of ``batch`` images.

    ``model`` is a model name for ``autohet.core.models.build_model`` or a module (then give
    ``input_shape`` as C,H,W). ``branches`` also splits joins of disjoint branches (inception,
    resnet down-sampling) into parallel blocks. ``cuts`` lists fx node names to cut after instead
    of the key-operator rule; such cuts may carry several tensors, giving multi-input blocks.
    The blocks share the model's weights; in-place activations of the model are turned off.
    """
    if batch < 1:
        raise UserError(f"batch must be at least 1, got {batch}")
    if isinstance(model, str):
        from autohet.core.models import build_model
        from autohet.core.models import input_shape as shape_of

        input_shape = shape_of(model)
        name = name or model
        module = build_model(model, seed=seed)
    else:
        if input_shape is None:
            raise UserError("partition of a module needs input_shape=(C, H, W)")
        module = model
        name = name or type(model).__name__
    example = torch.randn((batch, *input_shape), generator=torch.Generator().manual_seed(seed))
    gm, tracer = trace(module, example)
    return build_blocks(gm, name, batch, tuple(input_shape), tracer, branches=branches, cuts=cuts)
