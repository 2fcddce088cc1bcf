"""The split ratio of one chain between devices (seed 003's step S0): pure, over measured times.

Start at ratio ``r0`` (device 0's share of the chain's rows), measure both sides, and while their
times differ by more than ``threshold`` (relative to the slower one) move ``s0`` of the rows from
the slower device to the faster one; when a move overshoots (the other device becomes the slower)
the step halves, so the search settles instead of oscillating. With N devices the slowest gives to
the fastest. Every device alone (r = 0 and r = 1 for two) is always a candidate, and the result is
the candidate with the smallest measured end-to-end time (its ``span``), balanced or not: a join
that costs more than balancing saves loses to one device alone.

The job measures (``measure(shares) -> ChainCost``), the planner only decides, so it is tested on
made-up cost functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["ChainCost", "SplitPlan", "balance", "shares_from_ratio"]


@dataclass(frozen=True)
class ChainCost:
    """Seconds of one chain at some shares: each device's side (its rows in, its compute; 0 for a
    device with no rows), the join, and the measured end-to-end time (``total``; None: modelled as
    the slowest side plus the join)."""

    sides: tuple[float, ...]
    join: float = 0.0
    total: float | None = None

    @property
    def span(self) -> float:
        return self.total if self.total is not None else max(self.sides) + self.join


@dataclass
class SplitPlan:
    """The chosen shares and their cost; every measured point in the order the search took them."""

    shares: tuple[float, ...]
    cost: ChainCost
    trace: list[tuple[tuple[float, ...], ChainCost]] = field(default_factory=list)
    balanced: bool = False
    reason: str = ""

    @property
    def ratio(self) -> float:
        """Device 0's share (the seed's ratio, for two devices)."""
        return self.shares[0]


def shares_from_ratio(ratio: float) -> tuple[float, float]:
    return (round(ratio, 6), round(1.0 - ratio, 6))


def _norm(shares: Sequence[float]) -> tuple[float, ...]:
    total = sum(shares)
    return tuple(round(max(0.0, s) / total, 6) for s in shares)


def balance(measure: Callable[[tuple[float, ...]], ChainCost], devices: int = 2, r0: float = 0.5, s0: float = 0.1,
            threshold: float = 0.05, max_steps: int = 20, min_step: float = 0.01,
            start: Sequence[float] | None = None) -> SplitPlan:
    """Seed 003's search for one chain. ``measure`` is called with one share per device (summing to
    1); ``start`` overrides ``r0`` (N devices start at equal shares); ``threshold`` is relative:
    |t_slow - t_fast| <= threshold * t_slow ends the search."""
    if devices < 1:
        raise ValueError("balance needs at least one device")
    if not 0.0 <= r0 <= 1.0 or s0 <= 0 or threshold < 0:
        raise ValueError(f"r0 in [0, 1], s0 > 0, threshold >= 0; got r0={r0}, s0={s0}, threshold={threshold}")
    seen: dict[tuple[float, ...], ChainCost] = {}
    trace: list[tuple[tuple[float, ...], ChainCost]] = []

    def cost(shares: tuple[float, ...]) -> ChainCost:
        if shares not in seen:
            seen[shares] = measure(shares)
            trace.append((shares, seen[shares]))
        return seen[shares]

    alone = [tuple(1.0 if k == d else 0.0 for k in range(devices)) for d in range(devices)]
    if devices == 1:
        c = cost(alone[0])
        return SplitPlan(alone[0], c, trace, True, "one device")
    if start is not None:
        shares = _norm(start)
    elif devices == 2:
        shares = shares_from_ratio(r0)
    else:
        shares = _norm([1.0] * devices)
    step, last, balanced, reason = s0, None, False, f"stopped after {max_steps} steps"
    for _ in range(max_steps):
        sides = cost(shares).sides
        slow = max(range(devices), key=lambda k: sides[k])
        fast = min(range(devices), key=lambda k: (sides[k], -shares[k]))
        if sides[slow] - sides[fast] <= threshold * sides[slow]:
            balanced, reason = True, f"sides within {threshold:.0%} of each other"
            break
        if last == (fast, slow):  # the last move overshot: halve the step
            step /= 2
            if step < min_step:
                reason = f"step below {min_step} while the sides still differ (rows are whole)"
                break
        give = min(step, shares[slow])
        if give <= 0:
            reason = "the slower device has no rows left to give"
            break
        moved = list(shares)
        moved[slow] -= give
        moved[fast] += give
        last, shares = (slow, fast), _norm(moved)
    for single in alone:  # one device alone is always a candidate
        cost(single)
    best = min(seen, key=lambda s: (seen[s].span, -max(s)))
    return SplitPlan(best, seen[best], trace, balanced, reason)
