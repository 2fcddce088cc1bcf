"""The block DAG: blocks with their counts, the edges between them, and running it in order."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["Block", "BlockGraph", "format_count"]


@dataclass
class Block:
    """One runnable piece of the model.

    ``inputs``/``outputs`` name the values the block reads and writes (fx node names; the model input
    is ``BlockGraph.input_name``). ``flops`` = 2 x conv/FC multiply-accumulates for the traced batch.
    ``signature`` is a hash of the block's code, module configs and tensor shapes, not of weights,
    so compiled code can be cached across weight seeds.
    """

    name: str
    module: nn.Module
    inputs: list[str]
    outputs: list[str]
    ops: list[str]
    flops: int
    params: int
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    out_bytes: int
    in_bytes: int
    dtype: torch.dtype = torch.float32
    signature: str = ""
    kind: str = "stage"  # stage, branch or join

    def example_inputs(self, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                       seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Random inputs of this block's traced shapes (for timing and compiling)."""
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(s, generator=gen).to(device=device, dtype=dtype or self.dtype)
                     for s in self.in_shapes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "inputs": self.inputs, "outputs": self.outputs,
            "ops": self.ops, "flops": self.flops, "params": self.params,
            "in_shapes": [list(s) for s in self.in_shapes], "out_shapes": [list(s) for s in self.out_shapes],
            "in_bytes": self.in_bytes, "out_bytes": self.out_bytes, "signature": self.signature,
        }


@dataclass
class BlockGraph:
    """Blocks in topological order and the DAG edges (producer name, consumer name).

    The model input is the pseudo-node ``"input"`` in ``edges``; ``predecessors`` leaves it out.
    """

    model: str
    batch: int
    input_shape: tuple[int, ...]
    input_name: str
    output_name: str
    blocks: list[Block]
    edges: list[tuple[str, str]]
    tracer: str = "fx"
    _by_name: dict[str, Block] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {b.name: b for b in self.blocks}

    def __getitem__(self, name: str) -> Block:
        return self._by_name[name]

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.blocks]

    def predecessors(self, name: str) -> list[str]:
        return [u for u, v in self.edges if v == name and u != "input"]

    def successors(self, name: str) -> list[str]:
        return [v for u, v in self.edges if u == name]

    def producer(self, value: str) -> str:
        """The block that outputs a value, or ``"input"`` for the model input."""
        if value == self.input_name:
            return "input"
        for block in self.blocks:
            if value in block.outputs:
                return block.name
        raise KeyError(value)

    def edge_bytes(self) -> dict[tuple[str, str], int]:
        """Bytes each edge carries for the traced batch (the sum of the values it carries)."""
        sizes: dict[str, int] = {self.input_name: _nbytes(self.input_shape, self.blocks[0].dtype)}
        for block in self.blocks:
            for value, shape in zip(block.outputs, block.out_shapes, strict=True):
                sizes[value] = _nbytes(shape, block.dtype)
        out: dict[tuple[str, str], int] = {}
        for block in self.blocks:
            for value in block.inputs:
                key = (self.producer(value), block.name)
                out[key] = out.get(key, 0) + sizes[value]
        return out

    def run(self, x: torch.Tensor,
            runners: Mapping[str, Callable[..., Any]] | None = None) -> torch.Tensor:
        """Executes the blocks in topological order; ``runners`` replaces a block's module by name
        (a backend runner or a device-placed copy), so placement and backends reuse this loop."""
        values: dict[str, Any] = {self.input_name: x}
        last_use = self._last_use()
        for i, block in enumerate(self.blocks):
            fn = runners.get(block.name, block.module) if runners else block.module
            out = fn(*(values[v] for v in block.inputs))
            if len(block.outputs) == 1:
                values[block.outputs[0]] = out
            else:
                values.update(zip(block.outputs, out, strict=True))
            for value in [v for v, last in last_use.items() if last == i and v in values]:
                del values[value]
        return values[self.output_name]

    def _last_use(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for i, block in enumerate(self.blocks):
            for value in block.inputs:
                last[value] = i
        last.pop(self.output_name, None)
        return last

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "batch": self.batch, "input_shape": list(self.input_shape),
            "tracer": self.tracer, "flops_counted": "2 x multiply-accumulates of conv and linear layers",
            "blocks": [b.to_dict() for b in self.blocks], "edges": [list(e) for e in self.edges],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_table(self) -> str:
        """A fixed-width table: one row per block, totals last."""
        head = ["#", "block", "kind", "from", "operators", "FLOPs", "params", "output", "out bytes"]
        rows = []
        for i, b in enumerate(self.blocks):
            shapes = ",".join("x".join(map(str, s)) for s in b.out_shapes)
            rows.append([str(i), b.name, b.kind, ",".join(self.predecessors(b.name)) or "input",
                         _ops_summary(b.ops), format_count(b.flops), format_count(b.params), shapes,
                         format_count(b.out_bytes, "B")])
        rows.append(["", "total", "", "", "", format_count(sum(b.flops for b in self.blocks)),
                     format_count(sum(b.params for b in self.blocks)), "", ""])
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [f"model {self.model}, batch {self.batch}, input {'x'.join(map(str, self.input_shape))}; "
                 "FLOPs = 2 x conv/linear multiply-accumulates"]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join(line.rstrip() for line in lines)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * torch.empty((), dtype=dtype).element_size()


def _ops_summary(ops: list[str], limit: int = 60) -> str:
    """Conv2d x2, ReLU x2, MaxPool2d: counts in first-seen order, cut to ``limit`` characters."""
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    text = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_count(n: float, unit: str = "") -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}{unit}"
    return f"{int(n)}{unit}"
