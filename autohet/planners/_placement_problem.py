"""The placement problem and its modelled end-to-end time (list scheduling of the block DAG).

Plain Python, no torch: the inputs are block names, DAG edges, measured per-(block, device)
seconds, bytes per edge and a transfer-time function, so the algorithm can be tested against
made-up numbers and reused by the tuner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autohet.core.errors import UserError

__all__ = ["Problem", "TransferFn", "linear_transfer", "table_transfer"]

TransferFn = Callable[[int, str, str], float]


def linear_transfer(latency_s: float = 0.0, bytes_per_s: float = float("inf")) -> TransferFn:
    """Seconds to move n bytes between two different devices: latency + n / bandwidth (0 on one device)."""
    def fn(nbytes: int, src: str, dst: str) -> float:
        if src == dst or nbytes == 0:
            return 0.0
        return latency_s + nbytes / bytes_per_s
    return fn


def table_transfer(table: Mapping[tuple[str, str], tuple[float, float]]) -> TransferFn:
    """Per device pair (src, dst) -> (latency s, bytes/s), e.g. measured cpu->cuda and cuda->cpu."""
    def fn(nbytes: int, src: str, dst: str) -> float:
        if src == dst or nbytes == 0:
            return 0.0
        if (src, dst) not in table:
            raise UserError(f"no transfer figures for {src} -> {dst}; measure that pair or give a "
                            "transfer function")
        latency, bandwidth = table[(src, dst)]
        return latency + nbytes / bandwidth
    return fn


@dataclass
class Problem:
    """Blocks (topological order), edges (u, v) with ``"input"`` as the model input, devices,
    ``times[(block, device)]`` seconds, ``edge_bytes[(u, v)]`` bytes and a transfer function.

    ``source_device`` holds the model input and ``sink_device`` receives the output (None: no
    transfer is charged for the input / output). A block missing from ``times`` on a device cannot
    run there.
    """

    blocks: Sequence[str]
    edges: Sequence[tuple[str, str]]
    devices: Sequence[str]
    times: Mapping[tuple[str, str], float]
    edge_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    transfer: TransferFn = field(default_factory=linear_transfer)
    source_device: str | None = None
    sink_device: str | None = None

    def __post_init__(self) -> None:
        self.blocks = list(self.blocks)
        self.devices = list(self.devices)
        if not self.blocks or not self.devices:
            raise UserError("placement needs at least one block and one device")
        known = set(self.blocks) | {"input"}
        for u, v in self.edges:
            if u not in known or v not in known:
                raise UserError(f"edge {u} -> {v} names an unknown block; edges must join listed blocks")
        order = {b: i for i, b in enumerate(self.blocks)}
        for u, v in self.edges:
            if u != "input" and order[u] >= order[v]:
                raise UserError(f"blocks must be listed in topological order; {u} feeds {v} but comes after")
        for b in self.blocks:
            if not any((b, d) in self.times for d in self.devices):
                raise UserError(f"block {b} has no measured time on any device; measure it first")
        self.preds: dict[str, list[str]] = {b: [] for b in self.blocks}
        self.succs: dict[str, list[str]] = {b: [] for b in self.blocks}
        for u, v in self.edges:
            self.preds[v].append(u)
            if u != "input":
                self.succs[u].append(v)

    def allowed(self, block: str) -> list[str]:
        return [d for d in self.devices if (block, d) in self.times]

    def nbytes(self, u: str, v: str) -> int:
        return int(self.edge_bytes.get((u, v), 0))

    def sinks(self) -> list[str]:
        return [b for b in self.blocks if not self.succs[b]]

    def schedule(self, assignment: Mapping[str, str]) -> dict[str, tuple[float, float]]:
        """(start, finish) of each assigned block: each device runs one block at a time, in
        topological order; a block starts when its device is free and its inputs have arrived.
        Unassigned predecessors are taken as done at time 0 on the block's own device."""
        ready: dict[str, float] = {d: 0.0 for d in self.devices}
        out: dict[str, tuple[float, float]] = {}
        for b in self.blocks:
            if b not in assignment:
                continue
            dev = assignment[b]
            arrive = 0.0
            for p in self.preds[b]:
                if p == "input":
                    src = self.source_device if self.source_device is not None else dev
                    arrive = max(arrive, self.transfer(self.nbytes(p, b), src, dev))
                elif p in out:
                    arrive = max(arrive, out[p][1] + self.transfer(self.nbytes(p, b), assignment[p], dev))
            start = max(ready[dev], arrive)
            finish = start + self.times[(b, dev)]
            ready[dev] = finish
            out[b] = (start, finish)
        return out

    def tail(self, block: str, device: str) -> float:
        """Seconds to deliver a sink block's output (edge ``(block, "output")``) to the sink device."""
        if self.sink_device is None or self.succs[block]:
            return 0.0
        return self.transfer(int(self.edge_bytes.get((block, "output"), 0)), device, self.sink_device)

    def makespan(self, assignment: Mapping[str, str]) -> float:
        """Modelled end-to-end seconds of a (possibly partial) assignment, output delivery included."""
        sched = self.schedule(assignment)
        return max((finish + self.tail(b, assignment[b]) for b, (_, finish) in sched.items()), default=0.0)
