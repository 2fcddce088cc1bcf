"""Running a model's stages on engine devices by row slabs: the compute steps of ``split`` and
``coedge`` and the builder of their programs (explicit transfers of whole values or of rows).

A slab call computes given output rows of some local ops from slabs of their inputs (a slab holds
a known range of rows). Windows are computed with their height padding made explicit: zero rows
(``-inf`` for max pooling) only where the window crosses the true image border, real rows from the
slab everywhere else; the op then runs with no height padding and its own width padding. Average
pooling's border rows get torch's divisor back by a per-row factor (ceil_mode and
count_include_pad=False change it there). The rest of the model runs whole, node by node, on one
device's copy of the traced module.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from autohet.engine.devices import HOST, Device
from autohet.engine.program import Engine, Program, Step
from autohet.engine.program import transfer_worker_name as _worker_name
from autohet.engine.toolkit import to_device
from autohet.strategies.split._chains import INPUT, LocalOp, SpatialGraph, Stage, value_name
from autohet.strategies.split._rows import Rows, Window, clip, empty

__all__ = ["Builder", "DeviceModel", "RestCall", "SlabCall", "capture"]

_OUT_OF_PLACE = {operator.iadd: operator.add, operator.imul: operator.mul}


class DeviceModel:
    """The traced model on one device: a copy of its weights in the device's memory and dtype."""

    def __init__(self, graph: SpatialGraph, device: Device) -> None:
        self.device = device
        self.gm = device.prepare(copy.deepcopy(graph.gm))

    def target(self, node: fx.Node) -> Callable[..., Any]:
        """What the node calls, out of place (slabs may be views another op still reads)."""
        if node.op == "call_module":
            return self.gm.get_submodule(str(node.target))
        if node.op == "call_method":
            name = str(node.target)
            name = name[:-1] if name.endswith("_") and not name.endswith("__") else name
            return lambda x, *a, **k: getattr(x, name)(*a, **k)
        return _OUT_OF_PLACE.get(node.target, node.target)  # type: ignore[arg-type]

    def attr(self, node: fx.Node) -> Any:
        value: Any = self.gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return value


def _kwargs(node: fx.Node, env: Callable[[fx.Node], Any]) -> dict[str, Any]:
    kwargs = dict(fx.node.map_arg(node.kwargs, env))
    if kwargs.get("inplace") is True:
        kwargs["inplace"] = False
    return kwargs


def _pairs(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))


def _avg_rows_scale(m: torch.nn.AvgPool2d, rows: Rows, in_height: int) -> list[float] | None:
    """Per output row, torch's kernel height over its true divisor height (None: all 1). On the slab
    the window never crosses a border, so torch divides by the kernel height; at the image border it
    divides by the clipped window (ceil_mode overhang, or count_include_pad=False)."""
    if m.divisor_override:
        return None
    k, s, p = _pairs(m.kernel_size)[0], _pairs(m.stride or m.kernel_size)[0], _pairs(m.padding)[0]
    scale = []
    for o in range(*rows):
        start = o * s - p
        end = min(start + k, in_height + p)
        div = (end - start) if m.count_include_pad else (min(end, in_height) - max(start, 0))
        scale.append(k / div)
    return None if all(v == 1.0 for v in scale) else scale


def _window_fn(op: LocalOp, module: Any, rows: Rows, slab: Rows, dev: Device) -> Callable[[torch.Tensor], Any]:
    """Output ``rows`` of a conv/pool from an input slab holding rows ``slab``."""
    window: Window = op.row.window  # type: ignore[assignment]
    lo, hi = window.reads(rows)
    c0, c1 = clip((lo, hi), op.row.in_height)
    top, bottom = c0 - lo, hi - c1
    if c1 <= c0:
        c0 = c1 = min(max(lo, 0), op.row.in_height)  # all padding: an empty slice, padded
    a, b = c0 - slab[0], c1 - slab[0]
    fill = float("-inf") if op.kind == "maxpool" else 0.0
    m = module
    if op.kind == "conv":
        pw = _pairs(m.padding)[1] if not isinstance(m.padding, str) else (
            0 if m.padding == "valid" else _pairs(m.dilation)[1] * (_pairs(m.kernel_size)[1] - 1) // 2)

        def run(x: torch.Tensor) -> Any:
            x = x[:, :, a:b]
            if top or bottom:
                x = F.pad(x, (0, 0, top, bottom), value=fill)
            return F.conv2d(x, m.weight, m.bias, m.stride, (0, pw), m.dilation, m.groups)
        return run
    kernel, stride, pad = _pairs(m.kernel_size), _pairs(m.stride or m.kernel_size), _pairs(m.padding)
    if op.kind == "maxpool":
        dilation = _pairs(m.dilation)

        def run(x: torch.Tensor) -> Any:
            x = x[:, :, a:b]
            if top or bottom:
                x = F.pad(x, (0, 0, top, bottom), value=fill)
            return F.max_pool2d(x, kernel, stride, (0, pad[1]), dilation, m.ceil_mode)
        return run
    scale_rows = _avg_rows_scale(m, rows, op.row.in_height)
    scale = None if scale_rows is None else torch.tensor(scale_rows, device=dev.torch_device,
                                                          dtype=dev.dtype).view(1, 1, -1, 1)

    def run(x: torch.Tensor) -> Any:
        x = x[:, :, a:b]
        if top or bottom:
            x = F.pad(x, (0, 0, top, bottom), value=fill)
        y = F.avg_pool2d(x, kernel, stride, (0, pad[1]), m.ceil_mode, m.count_include_pad, m.divisor_override)
        return y if scale is None else y * scale
    return run


class SlabCall:
    """Local ops computing ``outputs`` (value, rows) on one device. Inputs arrive as pieces (row
    ranges, in row order) that together hold the rows ``need`` gives them; ``need`` gives every op's
    rows (``autohet.strategies.split._rows.needs``); ops it leaves out are not computed."""

    def __init__(self, model: DeviceModel, ops: Sequence[LocalOp], need: Mapping[str, Rows],
                 inputs: Sequence[tuple[str, Sequence[Rows]]], outputs: Sequence[tuple[str, Rows]]) -> None:
        self.dev = model.device
        self.inputs = [(v, len(parts), parts[0][0]) for v, parts in inputs]
        self.outputs = list(outputs)
        self.steps: list[tuple[str, Rows, Callable[..., Any]]] = []
        held: dict[str, Rows] = {v: (parts[0][0], parts[-1][1]) for v, parts in inputs}
        for op in ops:
            rows = need.get(op.name)
            if empty(rows):
                continue
            if op.kind == "map":
                self.steps.append((op.name, rows, self._map_fn(model, op, rows, held)))  # type: ignore[arg-type]
            else:
                source = op.row.inputs[0]
                fn = _window_fn(op, model.target(op.node), rows, held[source], self.dev)  # type: ignore[arg-type]
                self.steps.append((op.name, rows, lambda env, f=fn, s=source: f(env[s])))  # type: ignore[misc]
            held[op.name] = rows  # type: ignore[assignment]
        self.slices = [(v, rows[0] - held[v][0], rows[1] - held[v][0]) for v, rows in outputs]

    @staticmethod
    def _map_fn(model: DeviceModel, op: LocalOp, rows: Rows, held: Mapping[str, Rows]) -> Callable[..., Any]:
        target = model.target(op.node)
        node = op.node
        cuts = {v: (rows[0] - held[v][0], rows[1] - held[v][0]) for v in op.row.inputs}

        def run(env: dict[str, torch.Tensor]) -> Any:
            def arg(n: fx.Node) -> Any:
                name = value_name(n)
                a, b = cuts[name]
                return env[name][:, :, a:b]
            return target(*fx.node.map_arg(node.args, arg), **_kwargs(node, arg))
        return run

    def __call__(self, *tensors: torch.Tensor) -> Any:
        env: dict[str, torch.Tensor] = {}
        k = 0
        for value, count, _ in self.inputs:
            parts = [to_device(t, self.dev) for t in tensors[k:k + count]]
            env[value] = parts[0] if count == 1 else torch.cat(parts, 2)
            k += count
        for name, _, fn in self.steps:
            env[name] = fn(env)
        outs = tuple(env[v][:, :, a:b] for v, a, b in self.slices)
        return outs if len(outs) > 1 else outs[0]


class RestCall:
    """Non-local nodes run whole on one device, node by node (fx semantics, out of place)."""

    def __init__(self, model: DeviceModel, stage: Stage) -> None:
        self.dev, self.model = model.device, model
        self.nodes = stage.nodes
        self.inputs = stage.inputs
        self.outputs = stage.outputs

    def __call__(self, *tensors: torch.Tensor) -> Any:
        env = {v: to_device(t, self.dev) for v, t in zip(self.inputs, tensors, strict=True)}
        outs = _interpret(self.model, self.nodes, env)
        values = tuple(outs[v] for v in self.outputs)
        return values if len(values) > 1 else values[0]


def _interpret(model: DeviceModel, nodes: Sequence[fx.Node], env: dict[str, Any],
               keep: set[str] | None = None) -> dict[str, Any]:
    def arg(n: fx.Node) -> Any:
        return model.attr(n) if n.op == "get_attr" else env[value_name(n)]

    for node in nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        env[value_name(node)] = model.target(node)(*fx.node.map_arg(node.args, arg), **_kwargs(node, arg))
    return env if keep is None else {k: v for k, v in env.items() if k in keep}


def capture(graph: SpatialGraph, model: DeviceModel, x: torch.Tensor, keep: set[str]) -> dict[str, torch.Tensor]:
    """The values named in ``keep`` for input ``x`` (the reference run the per-chain timings feed
    from), freeing each other value after its last reader."""
    nodes = [n for n in graph.gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    last: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for a in node.all_input_nodes:
            last[value_name(a)] = k
    env: dict[str, Any] = {INPUT: to_device(x, model.device)}
    out = {INPUT: env[INPUT]} if INPUT in keep else {}
    with torch.inference_mode():
        for k, node in enumerate(nodes):
            _interpret(model, [node], env)
            name = value_name(node)
            if name in keep:
                out[name] = env[name]
            for a in node.all_input_nodes:
                if last.get(value_name(a)) == k and value_name(a) not in keep:
                    env.pop(value_name(a), None)
    return out


class Builder:
    """The steps of one program: compute steps and explicit transfers (whole values, or only the
    rows a device needs). Tracks where each value lives and which rows it holds; ``tags`` says for
    each step what it is part of (the per-chain and per-layer timing tables read them)."""

    def __init__(self, engine: Engine, inputs: Mapping[str, int]) -> None:
        """``inputs``: the program's inputs (fed in host memory as fp32) and their heights."""
        self.engine = engine
        self.steps: list[Step] = []
        self.inputs = tuple(inputs)
        self.where: dict[str, str] = dict.fromkeys(self.inputs, HOST)
        self.rows: dict[str, Rows] = {v: (0, h) for v, h in inputs.items()}
        self.dtype: dict[str, torch.dtype] = dict.fromkeys(self.inputs, torch.float32)
        self.tags: dict[str, tuple[str, ...]] = {}
        self._moved: dict[tuple[str, str, Rows | None], str] = {}

    def held(self, value: str) -> Rows:
        return self.rows[value]

    def fetch(self, value: str, device: str, rows: Rows | None = None, tag: tuple[str, ...] = ()) -> str:
        """``value`` on ``device``: itself where it already lives (the step slices what it needs),
        else a transfer step of the whole value or of ``rows`` (absolute row indices)."""
        src = self.where[value]
        if src == device:
            return value
        held = self.rows[value]
        if rows is not None and rows == held:
            rows = None
        key = (value, device, rows)
        if key not in self._moved:
            label = value if rows is None else f"{value}[{rows[0]}:{rows[1]}]"
            name = f"{label}@{device}"
            rel = None if rows is None else (rows[0] - held[0], rows[1] - held[0])
            step = Step(f"move {label} {src}->{device}", _worker_name(self.engine.devices, src, device), (value,),
                        (name,), kind="transfer", to=device, rows=rel)
            self.steps.append(step)
            self.tags[step.name] = tag
            self.where[name] = device
            self.rows[name] = held if rows is None else rows
            self.dtype[name] = self.dtype[value]
            self._moved[key] = name
        return self._moved[key]

    def add(self, name: str, device: str, inputs: Sequence[str], outputs: Sequence[tuple[str, Rows]],
            fn: Callable[..., Any], kind: str = "compute", tag: tuple[str, ...] = ()) -> None:
        dtype = self.engine[device].dtype
        self.steps.append(Step(name, device, tuple(inputs), tuple(v for v, _ in outputs), fn, kind))
        self.tags[name] = tag
        for value, rows in outputs:
            self.where[value], self.rows[value], self.dtype[value] = device, rows, dtype

    def example(self, value: str, shape: Sequence[int], batch: int, device: Device) -> torch.Tensor:
        """A zero tensor shaped like ``value`` (full shape ``shape`` at batch 1) as it reaches
        ``device``: its batch, the rows it holds (CUDA graph capture)."""
        dims = [batch, *shape[1:]]
        if len(dims) == 4:
            lo, hi = self.rows[value]
            dims[2] = hi - lo
        return torch.zeros(dims, dtype=self.dtype[value], device=device.torch_device)

    def program(self, output: str) -> Program:
        final = self.fetch(output, HOST)
        return Program(list(self.steps), self.inputs, final)

