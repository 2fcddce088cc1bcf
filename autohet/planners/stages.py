"""Pipeline stages (seed 002, PipeEdge): contiguous runs of blocks, one device each, chosen so the
slowest device's work per frame, transfers included, is as small as possible.

Plain Python, no torch: the inputs are block names, measured seconds per (block, device) at the
micro-batch, bytes crossing each boundary and a transfer-time function, so the planner is tested
on made-up numbers. As in PipeEdge the search is a dynamic program over the block where a stage
ends and the set of devices already used (exact, exponential only in the device count). Unlike
PipeEdge, a transfer is not a stage of its own: on the in-process engine it runs on the worker
that issues it (the GPU side of a copy), so its seconds add to that device's load; ``payer`` says
which side pays (the receiving stage by default: PipeEdge's "incoming transfer").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from autohet.core.errors import UserError
from autohet.planners._placement_problem import TransferFn, linear_transfer

__all__ = ["PayerFn", "Stage", "StagePlan", "StageProblem", "boundary_bytes", "boundary_values", "evaluate_stages",
           "normalise_cuts", "plan_stages", "receiver_pays"]

PayerFn = Callable[[str, str], str]


def receiver_pays(src: str, dst: str) -> str:
    """The stage a value moves into pays for the move (the output's move to the sink: its sender)."""
    return dst


@dataclass(frozen=True)
class StageProblem:
    """``times[(block, device)]`` seconds per frame (a block missing on a device cannot run there);
    ``boundary_bytes[i]`` bytes crossing into block ``i`` from before it (``[0]``: the model input,
    ``[n]``: the output); ``transfer(nbytes, src, dst)`` seconds; the input starts on ``source`` and
    the output ends on ``sink`` (devices that run no stage: a move they pay costs no stage)."""

    blocks: Sequence[str]
    devices: Sequence[str]
    times: Mapping[tuple[str, str], float]
    boundary_bytes: Sequence[int]
    transfer: TransferFn = field(default_factory=linear_transfer)
    payer: PayerFn = receiver_pays
    source: str = "host"
    sink: str = "host"

    def __post_init__(self) -> None:
        if len(self.boundary_bytes) != len(self.blocks) + 1:
            raise ValueError(f"boundary_bytes needs {len(self.blocks) + 1} entries (one per boundary, "
                             f"input and output included), got {len(self.boundary_bytes)}")
        if not self.blocks or not self.devices:
            raise ValueError("a stage problem needs blocks and devices")

    def compute(self, device: str, first: int, end: int) -> float | None:
        """Seconds of blocks ``first..end-1`` on ``device``; None when one of them cannot run there."""
        total = 0.0
        for block in self.blocks[first:end]:
            t = self.times.get((block, device))
            if t is None:
                return None
            total += t
        return total

    def move(self, src: str, dst: str, boundary: int) -> float:
        return 0.0 if src == dst else self.transfer(int(self.boundary_bytes[boundary]), src, dst)

    def charge(self, src: str, dst: str, boundary: int, device: str) -> float:
        """What ``device`` pays for the move ``src -> dst`` at ``boundary`` (0 unless it is the payer)."""
        if src == dst:
            return 0.0
        payer = self.payer(src, dst)
        if payer == self.sink and dst == self.sink:  # the sink runs no stage: the sender pays
            payer = src
        return self.move(src, dst, boundary) if payer == device else 0.0


@dataclass(frozen=True)
class Stage:
    """Blocks ``first..end-1`` on ``device``: their compute, the moves in and out of the stage, and
    the ``load`` its device's worker carries per frame (compute plus the moves it pays)."""

    device: str
    first: int
    end: int
    compute_s: float
    in_s: float
    out_s: float
    load_s: float


@dataclass(frozen=True)
class StagePlan:
    """Stages in pipeline order; ``loads`` per device (a device running two stages carries both);
    ``bottleneck_s`` the largest load: a frame leaves the pipeline at most every ``bottleneck_s``."""

    stages: tuple[Stage, ...]
    loads: dict[str, float]
    bottleneck_s: float
    devices: tuple[str, ...]

    @property
    def cuts(self) -> list[int]:
        """Block index where each next stage starts."""
        return [s.first for s in self.stages[1:]]

    @property
    def order(self) -> list[int]:
        """Each stage's device as an index into the problem's devices."""
        return [self.devices.index(s.device) for s in self.stages]

    def assignment(self, blocks: Sequence[str]) -> dict[str, str]:
        """Block name -> device."""
        return {blocks[i]: s.device for s in self.stages for i in range(s.first, s.end)}

    def throughput(self, batch: int) -> float:
        """Images per second of the plan's steady state (``batch`` images per frame)."""
        return batch / self.bottleneck_s if self.bottleneck_s > 0 else float("inf")


def boundary_values(graph: Any) -> list[tuple[str, ...]]:
    """Per boundary ``i`` (before block ``i``; ``n``: after the last) the values crossing it: written
    before it (the model input included) and read after it (the model output included). Duck-typed
    on ``autohet.partition.BlockGraph``: ``blocks`` with ``inputs``/``outputs``, ``input_name``,
    ``output_name``."""
    blocks = list(graph.blocks)
    written = [graph.input_name]
    out = []
    for i in range(len(blocks) + 1):
        later = {v for b in blocks[i:] for v in b.inputs} | {graph.output_name}
        out.append(tuple(v for v in dict.fromkeys(written) if v in later))
        if i < len(blocks):
            written += list(blocks[i].outputs)
    return out


def boundary_bytes(graph: Any) -> list[int]:
    """Bytes crossing each boundary for the graph's traced batch (see ``boundary_values``)."""
    first = graph.blocks[0]
    sizes = {graph.input_name: _nbytes((graph.batch, *graph.input_shape), getattr(first.dtype, "itemsize", 4))}
    for block in graph.blocks:
        for value, shape in zip(block.outputs, block.out_shapes, strict=True):
            sizes[value] = _nbytes(shape, getattr(block.dtype, "itemsize", 4))
    return [sum(sizes[v] for v in values) for values in boundary_values(graph)]


def _nbytes(shape: Sequence[int], itemsize: int) -> int:
    total = int(itemsize)
    for d in shape:
        total *= int(d)
    return total


def normalise_cuts(cuts: Sequence[int], blocks: int) -> list[int]:
    """Cut points sorted, each once, inside ``1..blocks-1``: a repeated cut or one at 0 or past the
    last block means no cut there (so a fixed-length vector from a tuner can ask for fewer stages)."""
    return sorted({int(c) for c in cuts if 0 < int(c) < blocks})


def evaluate_stages(problem: StageProblem, cuts: Sequence[int], stages: Sequence[int]) -> StagePlan:
    """The plan for given cut points and stage devices (indices into ``problem.devices``; only the
    first ``len(cuts) + 1`` are used). A device may appear twice: it then carries both stages."""
    n = len(problem.blocks)
    bounds = [0, *normalise_cuts(cuts, n), n]
    count = len(bounds) - 1
    if len(stages) < count:
        raise UserError(f"{count} stages (cuts {bounds[1:-1]}) need {count} stage devices, got {list(stages)}")
    bad = [i for i in stages[:count] if not 0 <= int(i) < len(problem.devices)]
    if bad:
        raise UserError(f"stage device index {bad[0]} is out of range; valid: 0..{len(problem.devices) - 1} "
                        f"({', '.join(problem.devices)})")
    devices = [problem.devices[int(i)] for i in stages[:count]]
    where = [problem.source, *devices, problem.sink]
    out = []
    for k, device in enumerate(devices):
        first, end = bounds[k], bounds[k + 1]
        compute = problem.compute(device, first, end)
        if compute is None:
            missing = next(b for b in problem.blocks[first:end] if (b, device) not in problem.times)
            raise UserError(f"block {missing} cannot run on {device} (no measured time there)")
        in_s = problem.move(where[k], device, first)
        out_s = problem.move(device, where[k + 2], end)
        load = compute + problem.charge(where[k], device, first, device) \
            + problem.charge(device, where[k + 2], end, device)
        out.append(Stage(device, first, end, compute, in_s, out_s, load))
    return _plan(out, problem)


def _plan(stages: list[Stage], problem: StageProblem) -> StagePlan:
    loads: dict[str, float] = {}
    for s in stages:
        loads[s.device] = loads.get(s.device, 0.0) + s.load_s
    return StagePlan(tuple(stages), loads, max(loads.values()), tuple(problem.devices))


def plan_stages(problem: StageProblem, max_stages: int | None = None) -> StagePlan:
    """The contiguous stages on distinct devices (one to ``max_stages`` of them, default every
    device) whose largest device load per frame is smallest; ties go to the smaller total load
    (fewer moves), then to fewer stages. Exact dynamic program over (the block the next stage starts
    at, the devices used, the previous and the next stage's devices): each stage's load is known
    once its neighbours are, whichever side pays for the moves between them."""
    n, devices = len(problem.blocks), list(problem.devices)
    limit = min(max_stages or len(devices), len(devices))
    if limit < 1:
        raise ValueError("max_stages must be at least 1")

    def load(prev: str, device: str, first: int, end: int, nxt: str) -> float | None:
        compute = problem.compute(device, first, end)
        if compute is None:
            return None
        return compute + problem.charge(prev, device, first, device) + problem.charge(device, nxt, end, device)

    @cache
    def best(first: int, used: int, prev: str, device: str) -> tuple[float, float, int, tuple] | None:
        """(bottleneck, total load, stages, choices) of the stages from block ``first`` on, the one
        starting there on ``device`` after one on ``prev``; ``used`` counts ``device`` already."""
        found = None
        for end in range(first + 1, n + 1):
            if end == n:
                nexts: list[str | None] = [None]
            elif bin(used).count("1") < limit:
                nexts = [d for k, d in enumerate(devices) if not used >> k & 1]
            else:
                continue
            for nxt in nexts:
                own = load(prev, device, first, end, problem.sink if nxt is None else nxt)
                if own is None:
                    continue
                if nxt is None:
                    candidate = (own, own, 1, ((end, None),))
                else:
                    rest = best(end, used | 1 << devices.index(nxt), device, nxt)
                    if rest is None:
                        continue
                    candidate = (max(own, rest[0]), own + rest[1], 1 + rest[2], ((end, nxt), *rest[3]))
                if found is None or candidate[:3] < found[:3]:
                    found = candidate
        return found

    results = []
    for k, device in enumerate(devices):
        result = best(0, 1 << k, problem.source, device)
        if result is not None:
            results.append((result[:3], k, result[3]))
    if not results:
        raise UserError("no device can run every block of some stage: measure the blocks on the devices")
    _, first_device, choices = min(results)
    cuts = [end for end, _ in choices[:-1]]
    order = [first_device, *(devices.index(nxt) for _, nxt in choices[:-1])]
    return evaluate_stages(problem, cuts, order)
