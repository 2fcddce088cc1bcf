"""Seed 001's Algorithm 3: greedy placement along the critical path, then correction rounds.

Greedy: the critical path is the longest path of the block DAG weighted by each block's mean
time over devices (at a branch, the most expensive branch is on it). Path blocks are placed first,
in path order, each on the device where it finishes earliest given its predecessors' devices and
the transfers from them (for the last block, once its output is back on the sink device); the
remaining (branch) blocks follow in topological order, each on the device giving the smallest
end-to-end time of what is placed so far (it may delay a path block).
Correction: each round tries every block on every other device and keeps a move when the
end-to-end time drops - measured when a ``measure`` callable is given (the seed corrects by
measured time, which sees contention the model cannot), modelled otherwise; stop after ``x``
consecutive rounds without gain. A given ``start`` assignment (a tuner's vector) replaces the greedy
step, so a search can start where greedy would not; ``x=0`` skips correction (measure as given).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autohet.core.errors import UserError
from autohet.planners._placement_problem import Problem

__all__ = ["PlacementResult", "critical_path", "decode", "encode", "greedy", "place", "search_space",
           "valid_indices"]


@dataclass
class PlacementResult:
    """The chosen assignment and its time (measured if a measure was given), with how it was found.

    ``greedy``/``greedy_s`` are the starting assignment and its time: greedy's, or the given one
    when ``start`` is ``"given"``.
    """

    assignment: dict[str, str]
    time_s: float
    modelled_s: float
    measured: bool
    greedy: dict[str, str]
    greedy_s: float
    path: list[str]
    rounds: int
    history: list[dict[str, Any]] = field(default_factory=list)
    start: str = "greedy"

    def to_dict(self) -> dict[str, Any]:
        return {
            "assignment": self.assignment, "time_s": self.time_s, "modelled_s": self.modelled_s,
            "measured": self.measured, "greedy": self.greedy, "greedy_s": self.greedy_s,
            "critical_path": self.path, "rounds": self.rounds, "history": self.history, "start": self.start,
        }


def _mean_time(problem: Problem, block: str) -> float:
    ts = [problem.times[(block, d)] for d in problem.allowed(block)]
    return sum(ts) / len(ts)


def critical_path(problem: Problem) -> list[str]:
    """The longest path by mean block time, from a block fed by the input to a sink."""
    dist: dict[str, float] = {}
    back: dict[str, str | None] = {}
    for b in problem.blocks:
        preds = [p for p in problem.preds[b] if p != "input"]
        best = max(preds, key=lambda p: dist[p], default=None)
        dist[b] = _mean_time(problem, b) + (dist[best] if best is not None else 0.0)
        back[b] = best
    node: str | None = max(problem.sinks(), key=lambda s: dist[s])
    path: list[str] = []
    while node is not None:
        path.append(node)
        node = back[node]
    return path[::-1]


def _pick(problem: Problem, assign: dict[str, str], block: str, on_path: bool) -> str:
    best_dev, best_key = None, None
    pred_devs = [assign[p] for p in problem.preds[block] if p in assign]
    for dev in problem.allowed(block):
        trial = {**assign, block: dev}
        if on_path:
            score = problem.schedule(trial)[block][1] + problem.tail(block, dev)
        else:
            score = problem.makespan(trial)
        key = (score, dev not in pred_devs, problem.devices.index(dev))
        if best_key is None or key < best_key:
            best_dev, best_key = dev, key
    assert best_dev is not None
    return best_dev


def greedy(problem: Problem, path: list[str] | None = None) -> dict[str, str]:
    """Path blocks first, each where it finishes earliest; then the others (see module doc)."""
    path = path if path is not None else critical_path(problem)
    assign: dict[str, str] = {}
    for b in path:
        assign[b] = _pick(problem, assign, b, on_path=True)
    for b in problem.blocks:
        if b not in assign:
            assign[b] = _pick(problem, assign, b, on_path=False)
    return {b: assign[b] for b in problem.blocks}


def place(problem: Problem, measure: Callable[[dict[str, str]], float] | None = None, x: int = 2,
          max_rounds: int = 20, min_gain: float = 0.0,
          start: Mapping[str, str] | None = None) -> PlacementResult:
    """Greedy placement then correction rounds (see module doc).

    ``measure(assignment) -> seconds`` runs the placed model; without it the modelled time is
    used. A move is kept when it lowers the time by more than ``min_gain`` (a fraction, to ignore
    measurement noise). ``start`` replaces the greedy step as the starting point (greedy is then
    not computed); ``x=0`` runs no correction round, so the start is only evaluated.
    """
    if x < 0:
        raise UserError(f"x (rounds without gain before stopping) must be at least 0, got {x}")
    path = critical_path(problem)
    if start is None:
        first = greedy(problem, path)
    else:
        missing = [b for b in problem.blocks if b not in start]
        if missing:
            raise UserError(f"start assignment has no device for block {missing[0]!r}")
        bad = [b for b in problem.blocks if start[b] not in problem.allowed(b)]
        if bad:
            raise UserError(f"start assignment puts block {bad[0]!r} on {start[bad[0]]!r}; valid: "
                            f"{', '.join(problem.allowed(bad[0]))}")
        first = {b: start[b] for b in problem.blocks}
    cache: dict[tuple[str, ...], float] = {}

    def evaluate(assign: dict[str, str]) -> float:
        key = tuple(assign[b] for b in problem.blocks)
        if measure is not None:
            return float(measure(dict(assign)))
        if key not in cache:
            cache[key] = problem.makespan(assign)
        return cache[key]

    current = dict(first)
    best = evaluate(current)
    first_s = best
    history: list[dict[str, Any]] = [{"round": 0, "block": None, "device": None, "time_s": best,
                                      "accepted": True}]
    order = path + [b for b in problem.blocks if b not in path]
    no_gain = rounds = 0
    while no_gain < x and rounds < max_rounds:
        rounds += 1
        improved = False
        for b in order:
            for dev in problem.allowed(b):
                if dev == current[b]:
                    continue
                trial = {**current, b: dev}
                t = evaluate(trial)
                accepted = t < best * (1.0 - min_gain)
                history.append({"round": rounds, "block": b, "device": dev, "time_s": t, "accepted": accepted})
                if accepted:
                    current, best, improved = trial, t, True
        no_gain = 0 if improved else no_gain + 1
    return PlacementResult(
        assignment=current, time_s=best, modelled_s=problem.makespan(current), measured=measure is not None,
        greedy=first, greedy_s=first_s, path=path, rounds=rounds, history=history,
        start="greedy" if start is None else "given",
    )


def encode(assignment: Mapping[str, str], blocks: Sequence[str], devices: Sequence[str]) -> list[int]:
    """The assignment as one device index per block, in ``blocks`` order (a tuner's search vector)."""
    out = []
    for b in blocks:
        if b not in assignment:
            raise UserError(f"assignment has no device for block {b!r}")
        if assignment[b] not in devices:
            raise UserError(f"block {b} is on {assignment[b]!r}, not one of {', '.join(devices)}")
        out.append(list(devices).index(assignment[b]))
    return out


def valid_indices(devices: Sequence[str]) -> str:
    """``0 (cpu), 1 (cuda:0)``: the device indices a placement vector may hold, for error messages."""
    return ", ".join(f"{i} ({d})" for i, d in enumerate(devices))


def decode(vector: Sequence[int], blocks: Sequence[str], devices: Sequence[str]) -> dict[str, str]:
    """Inverse of ``encode``; a wrong length or index is a one-line error naming what is valid."""
    if len(vector) != len(blocks):
        names = ", ".join(blocks[:12]) + (f", ... ({len(blocks) - 12} more)" if len(blocks) > 12 else "")
        raise UserError(f"placement vector has {len(vector)} entries; expected {len(blocks)}, one device index "
                        f"per block in order: {names}")
    out = {}
    for b, i in zip(blocks, vector, strict=True):
        if not 0 <= int(i) < len(devices):
            raise UserError(f"device index {i} for block {b} is out of range; valid: {valid_indices(devices)}")
        out[b] = devices[int(i)]
    return out


def search_space(problem: Problem) -> list[list[int]]:
    """Per block, the device indices it may use (those it was measured on)."""
    return [[problem.devices.index(d) for d in problem.allowed(b)] for b in problem.blocks]
