"""Channel-partitioned programs on the engine (seed 004): OCP and IOP units among whole segments.

A unit splits one layer (OCP) or an adjacent pair (IOP) over devices by channel ranges: every
taking device gets the layer's input, computes its piece (a step, one CUDA graph on a GPU), and
the device that runs the rest of the model (``rest``) joins the pieces: ``torch.cat`` along the
channels for OCP, a sum of partial sums for IOP (the bias is in exactly one piece). Nodes no unit
takes run on ``rest`` as whole segments (consecutive ones form one step, one CUDA graph on a
GPU). Pieces are built once per (layer, channel range, device) and reused by every plan tried.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import fx

from autohet.engine.devices import Device
from autohet.engine.program import Engine, Program, Step, with_transfers
from autohet.engine.toolkit import graphed, mean_seconds, on_stream, seconds_each, to_device
from autohet.strategies.channels._layers import ChannelGraph, ChannelLayer, part_module, whole_module

__all__ = ["ChannelPrograms", "UnitLike"]


class UnitLike(Protocol):
    """A planner unit (``autohet.planners.pairing.Unit``): kind ocp|whole|iop, layers, channels per device."""

    kind: str
    layers: tuple[int, ...]
    counts: tuple[int, ...]


def _example(shape: Sequence[int], dtype: torch.dtype, dev: Device) -> torch.Tensor:
    x = torch.randn(tuple(shape)) if dtype.is_floating_point else torch.zeros(tuple(shape), dtype=dtype)
    return to_device(x, dev)


def _meta(node: fx.Node) -> tuple[tuple[int, ...], torch.dtype]:
    meta = node.meta["tensor_meta"]
    return tuple(meta.shape), meta.dtype


class ChannelPrograms:
    """Programs of one analysed model (``partition.channels``) on an engine; ``graphs`` captures GPU
    pieces and segments as CUDA graphs (shapes are the traced batch's, fixed)."""

    def __init__(self, engine: Engine, graph: ChannelGraph, graphs: bool = True) -> None:
        self.engine, self.graph, self.graphs = engine, graph, graphs
        self._calls: dict[tuple[Any, ...], Callable[..., Any]] = {}

    # --- callables on devices ----------------------------------------------------------------------

    def _device_call(self, module: torch.nn.Module, device: str, inputs: Sequence[fx.Node]) -> Callable[..., Any]:
        dev = self.engine[device]
        moved = dev.prepare(copy.deepcopy(module))
        call = graphed(moved, dev, lambda: [_example(s, dev.dtype if d.is_floating_point else d, dev)
                                            for s, d in map(_meta, inputs)], self.graphs)

        def run(*xs: torch.Tensor, _weights: torch.nn.Module = moved) -> Any:
            # _weights: a captured graph reads the module's tensors by address, so they live as long as it
            return call(*(to_device(x, dev) for x in xs))

        return run

    def piece(self, layer: ChannelLayer, lo: int, hi: int, device: str, pair: ChannelLayer | None = None,
              bias: bool = True) -> Callable[..., Any]:
        """A device's piece of a unit: ``layer``'s output channels [lo, hi) (and ``pair`` over them)."""
        key = ("piece", layer.index, lo, hi, pair is not None, bias, device)
        if key not in self._calls:
            module = part_module(self.graph, layer, lo, hi, pair, bias)
            self._calls[key] = self._device_call(module, device, layer.node.all_input_nodes[:1])
        return self._calls[key]

    def _join(self, device: str, kind: str) -> Callable[..., Any]:
        dtype = self.engine[device].dtype

        def cat(*ys: torch.Tensor) -> torch.Tensor:
            return torch.cat([y.to(dtype) for y in ys], dim=1)

        def add(*ps: torch.Tensor) -> torch.Tensor:
            out = ps[0].to(dtype)
            for p in ps[1:]:
                out = out + p.to(dtype)
            return out

        return cat if kind == "join" else add

    # --- steps -------------------------------------------------------------------------------------

    def unit_steps(self, unit: UnitLike, devices: Sequence[str], rest: str) -> tuple[list[Step], str, str]:
        """(steps, input value, output value) of one unit; a unit on one device needs no join."""
        g = self.graph
        first = g.layers[unit.layers[0]]
        pair = g.layers[unit.layers[1]] if unit.kind == "iop" else None
        src = g.value(first.node.all_input_nodes[0])
        out = g.value(pair.node if pair else first.end)
        label = first.name + (f"+{pair.name}" if pair else "")
        ranges, lo = [], 0
        for dev, n in zip(devices, unit.counts, strict=True):
            if n:
                ranges.append((dev, lo, lo + n))
                lo += n
        if len(ranges) == 1:
            dev = ranges[0][0]
            return [Step(f"{unit.kind} {label}", dev, (src,), (out,), self.piece(first, 0, first.channels, dev,
                                                                                  pair))], src, out
        steps = [Step(f"{unit.kind} {label}[{a}:{b}]", dev, (src,), (f"{out}.part{k}",),
                      self.piece(first, a, b, dev, pair, bias=k == 0)) for k, (dev, a, b) in enumerate(ranges)]
        kind = "sum" if pair else "join"
        steps.append(Step(f"{kind} {label}", rest, tuple(s.outputs[0] for s in steps), (out,),
                          self._join(rest, kind), kind=kind))
        return steps, src, out

    def _whole_step(self, members: list[fx.Node], rest: str) -> Step | None:
        g = self.graph
        inside = set(members)
        inputs = list(dict.fromkeys(a for n in members for a in n.all_input_nodes
                                    if a not in inside and a.op != "get_attr"))
        outputs = [n for n in members if any(u not in inside for u in n.users)]
        if not outputs:
            return None
        key = ("whole", tuple(n.name for n in members), rest)
        if key not in self._calls:
            self._calls[key] = self._device_call(whole_module(g, members, inputs, outputs), rest, inputs)
        name = members[0].name + (f"..{members[-1].name}" if len(members) > 1 else "")
        return Step(f"whole {name}", rest, tuple(g.value(a) for a in inputs), tuple(g.value(o) for o in outputs),
                    self._calls[key])

    def program(self, units: Sequence[UnitLike], devices: Sequence[str], rest: str) -> Program:
        """The model as a program: the units where their first layer is, whole segments between."""
        g = self.graph
        first_of = {g.layers[u.layers[0]].node: u for u in units}
        taken: set[fx.Node] = set()
        for u in units:
            first = g.layers[u.layers[0]]
            taken |= {first.node, *first.chain}
            if u.kind == "iop":
                taken |= {*first.bridge, g.layers[u.layers[1]].node}
        steps: list[Step] = []
        pending: list[fx.Node] = []

        def flush() -> None:
            if pending:
                step = self._whole_step(list(pending), rest)
                if step is not None:
                    steps.append(step)
                pending.clear()

        for node in g.nodes:
            if node in first_of:
                flush()
                steps += self.unit_steps(first_of[node], devices, rest)[0]
            elif node not in taken:
                pending.append(node)
        flush()
        result = g.output.args[0]
        if isinstance(result, tuple | list):
            result = result[0]
        return with_transfers(steps, ("x",), g.value(result), self.engine.devices)

    # --- timing ------------------------------------------------------------------------------------

    def layer_times(self, devices: Sequence[str], runs: int = 10, warmup: int = 3) -> dict[tuple[int, str], float]:
        """Mean seconds of each layer (with its chain) whole on each device, input already there:
        the per-device rates of the planner's cost model."""
        out = {}
        for device in devices:
            dev = self.engine[device]
            for layer in self.graph.layers:
                call = self.piece(layer, 0, layer.channels, device)
                shape, dtype = _meta(layer.node.all_input_nodes[0])
                x = dev.call(lambda s=shape, d=dtype, v=dev: _example(s, v.dtype if d.is_floating_point else d, v))
                out[(layer.index, device)] = dev.call(lambda c=call, i=x, v=dev: _mean_call(c, i, v, runs, warmup))
        return out

    def unit_time(self, unit: UnitLike, devices: Sequence[str], rest: str, runs: int = 10, warmup: int = 3) -> float:
        """Median seconds of one unit on the engine, from its input on ``rest`` (the host for the model's
        first layer) to its output joined on ``rest``: the unit's program less the same program with
        nothing between its source and its sink (the measured figure next to the modelled one)."""
        steps, src, out = self.unit_steps(unit, devices, rest)
        node = self.graph.layers[unit.layers[0]].node.all_input_nodes[0]
        source = self._source(node, rest)
        empty = [Step("pass", rest, (src,), ("pass",), lambda y: y)]
        return max(self._time(steps, out, rest, source, runs, warmup)
                   - self._time(empty, "pass", rest, source, runs, warmup), 0.0)

    def hop_times(self, devices: Sequence[str], rest: str, runs: int = 30, warmup: int = 3
                  ) -> dict[tuple[str, str], float]:
        """Seconds a small value's trip from ``rest`` to another device and back adds to a program
        beyond its copies (worker hand-offs: the engine's part of a link's latency), half per way."""
        source = self._source(None, rest)
        alone = self._time([Step("id", rest, ("v",), ("w",), lambda y: y + 0)], "w", rest, source, runs, warmup)
        out = {}
        for dev in (d for d in devices if d != rest):
            away = self._time([Step("id", dev, ("v",), ("w",), lambda y: y + 0)], "w", rest, source, runs, warmup)
            out[(rest, dev)] = out[(dev, rest)] = max(away - alone, 0.0) / 2
        return out

    def _source(self, node: fx.Node | None, rest: str) -> tuple[str, Any, bool]:
        """(value name, tensor, on the host) a timing program starts from: the model input on the host,
        or the node's value made on ``rest`` (a small one without a node)."""
        if node is not None and node is self.graph.placeholder:
            return "x", torch.randn(_meta(node)[0]), True
        shape, dtype = _meta(node) if node is not None else ((1, 8), torch.float32)
        dev = self.engine[rest]
        tensor = dev.call(lambda: _example(shape, dev.dtype if dtype.is_floating_point else dtype, dev))
        return (self.graph.value(node) if node is not None else "v"), tensor, False

    def _time(self, steps: list[Step], out: str, rest: str, source: tuple[str, Any, bool], runs: int,
              warmup: int) -> float:
        """Median seconds of a program: ``source``, ``steps``, and a sink on ``rest`` returning one element."""
        name, tensor, on_host = source
        feeds = {name: tensor} if on_host else {}
        head = [] if on_host else [Step("source", rest, (), (name,), lambda: tensor)]
        sink = Step("sink", rest, (out,), ("sink",), lambda y: y[(0,) * y.dim()].reshape(1).float().clone())
        program = with_transfers([*head, *steps, sink], tuple(feeds), "sink", self.engine.devices)
        times = seconds_each(lambda: self.engine.run(program, feeds), runs, warmup)
        return statistics.median(times)  # thread hand-offs make the tail long: the median is the typical run


def _mean_call(call: Callable[..., Any], x: torch.Tensor, dev: Device, runs: int, warmup: int) -> float:
    """Runs on the device's worker: mean seconds per call, the device synchronised after each."""
    def once() -> None:
        with torch.inference_mode():
            call(x)
        dev.sync()

    with on_stream(dev):
        return mean_seconds(once, runs, warmup)
