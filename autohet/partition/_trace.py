"""Turns a model into one fx graph with shapes on every node.

torch.fx symbolic tracing keeps module calls (Conv2d, MaxPool2d...) as single nodes, which gives
readable operator names and lets blocks share the model's own weights. Models with data-dependent
Python control flow cannot be symbolically traced; for those, torch.export's aten-level graph
(``ExportedProgram.module()``) is used instead.
"""

from __future__ import annotations

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from autohet.core.errors import UserError

__all__ = ["trace"]


def _no_inplace(model: nn.Module) -> None:
    """In-place activations would overwrite a tensor another block still reads, once blocks are split."""
    for module in model.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False


def trace(model: nn.Module, example: torch.Tensor) -> tuple[fx.GraphModule, str]:
    """The model's graph with ``tensor_meta`` on each node, and which tracer produced it."""
    model.eval()
    _no_inplace(model)
    try:
        gm = fx.symbolic_trace(model)
        tracer = "fx"
    except Exception as fx_exc:  # any symbolic-tracing failure falls back to torch.export
        try:
            gm = torch.export.export(model, (example,)).module()
            tracer = "export"
        except Exception as exp_exc:
            raise UserError(
                f"cannot trace the model for partitioning (fx: {str(fx_exc).splitlines()[0]}; "
                f"torch.export: {str(exp_exc).splitlines()[0]}); make its forward traceable"
            ) from exp_exc
    if tracer == "export":
        for node in list(gm.graph.nodes):  # torch.export's input-guard call computes nothing
            if node.op == "call_module" and str(node.target).startswith("_guards") and not node.users:
                gm.graph.erase_node(node)
        gm.recompile()
    with torch.no_grad():
        ShapeProp(gm).propagate(example)
    return gm, tracer
