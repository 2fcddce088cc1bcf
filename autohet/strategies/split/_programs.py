"""Programs of a model split by image rows, the two ways the row families split a chain.

``split`` (seed 003, CoDL): each device computes its share of a chain's output rows in one step
from the input rows they need (halos derived backward through the whole chain: recomputed, never
exchanged); the parts are joined once, at the chain's end, on the ``rest`` device.
``coedge`` (seed 004's baseline): every value of a chain is split by the same shares; before each
convolution or pooling a device receives from its neighbours only the halo rows it lacks (explicit
transfer steps of just those rows), then computes its own rows; the chain's outputs are gathered
on ``rest``. Non-local stages run whole on ``rest``. Steps are built once per (chain, device,
rows) and reused by every ratio tried; GPU steps are CUDA graphs when ``graphs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from autohet.engine.program import Engine, Program
from autohet.engine.toolkit import graphed, to_device
from autohet.strategies.split._chains import INPUT, LocalOp, SpatialGraph, Stage, value_name
from autohet.strategies.split._rows import Rows, empty, needs, pieces, split_rows
from autohet.strategies.split._slabs import Builder, DeviceModel, RestCall, SlabCall

__all__ = ["StagePrograms", "coedge_groups"]

Shares = Sequence[float]


def coedge_groups(ops: Sequence[LocalOp]) -> list[list[LocalOp]]:
    """A chain's ops as CoEdge layers: a new layer (one halo exchange) at every convolution or
    pooling that reads rows other than its own; elementwise ops, adds and concatenations follow
    the layer before them (they read the rows their device holds)."""
    groups: list[list[LocalOp]] = []
    for op in ops:
        exchange = op.row.window is not None and not (op.row.window.pointwise and op.row.in_height == op.row.height)
        if exchange or not groups:
            groups.append([op])
        else:
            groups[-1].append(op)
    return groups


class StagePrograms:
    """Programs of one spatial graph on an engine for inputs of ``batch`` images."""

    def __init__(self, engine: Engine, graph: SpatialGraph, devices: Sequence[str], rest: str, batch: int,
                 graphs: bool = True) -> None:
        self.engine, self.graph, self.devices, self.rest = engine, graph, list(devices), rest
        self.batch, self.graphs = batch, graphs
        self.models = {d: DeviceModel(graph, engine[d]) for d in dict.fromkeys([*self.devices, rest])}
        self._calls: dict[tuple, Callable[..., Any]] = {}
        self._programs: dict[tuple, tuple[Program, dict[str, tuple[str, ...]]]] = {}

    # --- steps --------------------------------------------------------------------------------------

    def _call(self, key: tuple, device: str, make: Callable[[], Callable[..., Any]], b: Builder,
              inputs: Sequence[tuple[str, str]]) -> Callable[..., Any]:
        """The step function for ``key`` (built once; a CUDA graph on a GPU for these input shapes)."""
        if key not in self._calls:
            dev = self.engine[device]
            examples = [b.example(name, self.graph.shapes[value], self.batch, dev) for value, name in inputs]
            self._calls[key] = graphed(make(), dev, examples, self.graphs)
        return self._calls[key]

    def _alone(self, stage: Stage, shares: Shares, how: str) -> str | None:
        """The one device computing every row of this chain at these shares (None: a real split).
        CoEdge splits every layer, so every value of the chain counts there, split only its outputs."""
        values = [op.name for op in stage.ops] if how == "coedge" else list(stage.outputs)
        active = {i for v in values for i, r in enumerate(split_rows(self.graph.height(v), shares)) if not empty(r)}
        return self.devices[active.pop()] if len(active) == 1 else None

    def _whole(self, b: Builder, ks: Sequence[int], device: str, tag: tuple[str, ...]) -> None:
        """Stages ``ks`` (consecutive) run whole, node by node, as one step on ``device``: the
        non-local stages, and chains one device computes alone (one CUDA graph, no join)."""
        stages = [self.graph.stages[k] for k in ks]
        produced: set[str] = set()
        inputs: list[str] = []
        for stage in stages:
            inputs += [v for v in stage.inputs if v not in produced and v not in inputs]
            produced |= {value_name(n) for n in stage.nodes}
        later = {v for s in self.graph.stages[ks[-1] + 1:] for v in s.inputs} | {self.graph.output}
        outputs = tuple(dict.fromkeys(v for s in stages for v in s.outputs if v in later))
        segment = Stage("rest", [n for s in stages for n in s.nodes], [], tuple(inputs), outputs)
        names = [b.fetch(v, device, tag=tag) for v in inputs]
        fn = self._call(("whole", tuple(ks), device), device, lambda: RestCall(self.models[device], segment), b,
                        list(zip(inputs, names, strict=True)))
        outs = [(v, (0, self.graph.shapes[v][2]) if len(self.graph.shapes[v]) == 4 else (0, 0)) for v in outputs]
        first, last = segment.nodes[0].name, segment.nodes[-1].name
        b.add(f"whole {device} {first}..{last}" if first != last else f"whole {device} {first}", device, names, outs,
              fn, tag=tag)

    def _slab(self, b: Builder, key: tuple, device: str, ops: Sequence[LocalOp], need: dict[str, Rows],
              inputs: Sequence[tuple[str, list[str]]], want: dict[str, Rows], outputs: list[tuple[str, Rows]],
              name: str, tag: tuple[str, ...]) -> None:
        spec = [(v, [b.held(n) for n in names]) for v, names in inputs]
        flat = [(v, n) for v, names in inputs for n in names]
        fn = self._call((*key, tuple((v, tuple(r)) for v, r in spec)), device,
                        lambda: SlabCall(self.models[device], ops, need, spec, list(want.items())), b, flat)
        b.add(name, device, [n for _, n in flat], outputs, fn, tag=tag)

    def _join(self, b: Builder, value: str, parts: list[str], tag: tuple[str, ...]) -> None:
        dev = self.engine[self.rest]
        names = [b.fetch(p, self.rest, tag=tag) for p in parts]

        def cat(*xs: torch.Tensor) -> torch.Tensor:
            return torch.cat([to_device(x, dev) for x in xs], 2) if len(xs) > 1 else to_device(xs[0], dev)

        b.add(f"join {value}", self.rest, names, [(value, (0, self.graph.height(value)))], cat, kind="join", tag=tag)

    def _split_chain(self, b: Builder, c: int, stage: Stage, shares: Shares) -> None:
        parts = {o: split_rows(self.graph.height(o), shares) for o in stage.outputs}
        active = [i for i in range(len(self.devices)) if any(not empty(parts[o][i]) for o in stage.outputs)]
        alone = len(active) == 1
        for i in active:
            dev = self.devices[i]
            want = {o: parts[o][i] for o in stage.outputs if not empty(parts[o][i])}
            need = needs([op.row for op in stage.ops], want)
            tag = ("side", str(c), dev)
            inputs = [(v, [b.fetch(v, dev, need[v], tag=tag)]) for v in stage.inputs if v in need]
            outs = [(o if alone else f"{o}#{dev}", r) for o, r in want.items()]
            span = ",".join(f"{lo}:{hi}" for lo, hi in want.values())
            self._slab(b, ("split", c, dev, tuple(want.items())), dev, stage.ops, need, inputs, want, outs,
                       f"chain{c} {dev} rows {span}", tag)
        if not alone:
            for o in stage.outputs:
                self._join(b, o, [f"{o}#{self.devices[i]}" for i in active if not empty(parts[o][i])],
                           ("join", str(c)))

    def _coedge_chain(self, b: Builder, c: int, stage: Stage, shares: Shares) -> None:
        groups = coedge_groups(stage.ops)
        owned: dict[str, list[Rows]] = {}
        for g, group in enumerate(groups):
            produced = {op.name for op in group}
            later = {v for gr in groups[g + 1:] for op in gr for v in op.row.inputs} | set(stage.outputs)
            outs = [op.name for op in group if op.name in later]
            owned.update({v: split_rows(self.graph.height(v), shares) for v in outs})
            reads = list(dict.fromkeys(v for op in group for v in op.row.inputs if v not in produced))
            for i, dev in enumerate(self.devices):
                want = {o: owned[o][i] for o in outs if not empty(owned[o][i])}
                if not want:
                    continue
                need = needs([op.row for op in group], want)
                halo = ("halo", str(c), str(g), dev)
                inputs = []
                for v in (v for v in reads if v in need):
                    if v in owned:  # split across the devices: pieces from their holders
                        names = [b.fetch(f"{v}#{self.devices[k]}", dev, part, tag=halo)
                                 for k, part in pieces(need[v], owned[v])]
                    else:  # a chain input, whole where it was made
                        names = [b.fetch(v, dev, need[v], tag=halo)]
                    inputs.append((v, names))
                self._slab(b, ("coedge", c, g, dev, tuple(want.items())), dev, group, need, inputs, want,
                           [(f"{o}#{dev}", r) for o, r in want.items()], f"chain{c}.{g} {dev} {group[0].name}",
                           ("layer", str(c), str(g), dev))
        for o in stage.outputs:
            self._join(b, o, [f"{o}#{self.devices[i]}" for i, r in enumerate(owned[o]) if not empty(r)],
                       ("join", str(c)))

    def prune(self, c: int, shares: Shares) -> None:
        """Drops chain ``c``'s split steps at other shares than these (the ratios a search measured
        and left: on a GPU each holds a CUDA graph and its memory)."""
        stage = self.graph.chains[c]
        parts = {o: split_rows(self.graph.height(o), shares) for o in stage.outputs}
        kept = {tuple((o, parts[o][i]) for o in stage.outputs if not empty(parts[o][i]))
                for i in range(len(self.devices))}
        for key in [k for k in self._calls if k[0] == "split" and k[1] == c and k[3] not in kept]:
            del self._calls[key]
        self._programs.clear()

    # --- programs -----------------------------------------------------------------------------------

    def _chain(self, b: Builder, c: int, stage: Stage, shares: Shares, how: str) -> None:
        (self._split_chain if how == "split" else self._coedge_chain)(b, c, stage, shares)

    def program(self, shares: Sequence[Shares], how: str = "split") -> Program:
        """The whole model: chain ``c`` split at ``shares[c]`` (one share per device), ``how`` split | coedge."""
        return self.tagged(shares, how)[0]

    def tagged(self, shares: Sequence[Shares], how: str = "split") -> tuple[Program, dict[str, tuple[str, ...]]]:
        """``program`` and its steps' tags: (side|layer|halo|join|whole, chain or device, ...).
        Consecutive stages on one device (non-local ones on ``rest``, chains one device computes
        alone) form one step."""
        key = (how, tuple(tuple(s) for s in shares))
        if key not in self._programs:
            b = Builder(self.engine, {INPUT: self.graph.height(INPUT)})
            runs: list[tuple[str | None, list[int], int]] = []  # (device or None for a split chain, stages, chain)
            c = 0
            for k, stage in enumerate(self.graph.stages):
                device = self.rest if stage.kind == "rest" else self._alone(stage, shares[c], how)
                if device is not None and runs and runs[-1][0] == device:
                    runs[-1][1].append(k)
                else:
                    runs.append((device, [k], c))
                c += stage.kind == "chain"
            for device, ks, c in runs:
                if device is None:
                    self._chain(b, c, self.graph.stages[ks[0]], shares[c], how)
                else:
                    self._whole(b, ks, device, ("whole", device))
            self._programs[key] = (b.program(self.graph.output), dict(b.tags))
        return self._programs[key]

    def chain_program(self, c: int, shares: Shares, how: str = "split") -> tuple[Program, dict[str, tuple[str, ...]]]:
        """Chain ``c`` alone, its inputs fed in host memory, its outputs joined on ``rest`` (a last
        one-element step waits for them all): per-chain timings. Also returns the steps' tags."""
        stage = self.graph.chains[c]
        b = Builder(self.engine, {v: self.graph.height(v) for v in stage.inputs})
        alone = self._alone(stage, shares, how)
        if alone is None:
            self._chain(b, c, stage, shares, how)
        else:
            self._whole(b, [next(k for k, s in enumerate(self.graph.stages) if s is stage)], alone,
                        ("side", str(c), alone))
        names = [b.fetch(o, self.rest, tag=("join", str(c))) for o in stage.outputs]
        b.add(f"chain{c} done", self.rest, names, [("done", (0, 0))], lambda *xs: xs[0].reshape(-1)[:1],
              tag=("done",))
        return b.program("done"), dict(b.tags)
