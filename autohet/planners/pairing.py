"""Channel partitioning's planner (seed 004): OCP per layer or IOP per adjacent pair, by a cost model.

Pure Python over measured costs (no torch), so it is tested on made-up numbers. Each partitionable
layer (a conv or linear layer with the per-channel ops after it) comes with its measured seconds
when it runs whole on each device, its input and output sizes, and whether it can be paired with
the next layer (IOP: the next one reads its output through per-channel ops and a flatten only).

The seed's cost model: a device's compute is its share of the layer's FLOPs over its measured rate
for that layer (= share x the layer's whole-layer seconds there); moving ``n`` bytes costs
``e + n / b`` (link latency and bandwidth measured on the machine). A unit takes as long as its
slowest device's path: the input sent to it, its compute, its result sent back to the device that
joins (OCP: its slice of the output channels, concatenated; IOP: a full-size partial sum of the
second layer, added). Walking the layers front to back, a pair is taken when IOP's modelled time
beats OCP for both layers alone; otherwise the first layer goes alone (OCP) and the walk moves on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["LayerCost", "LinkFn", "PairCompare", "PairingPlan", "Unit", "channel_counts", "compare_pairs",
           "iop_time", "layer_shares", "linear_link", "ocp_time", "plan_pairing", "proportional_shares",
           "table_link"]

LinkFn = Callable[[str, str, float], float]  # (from device, to device, bytes) -> seconds; 0 within a device


@dataclass(frozen=True)
class LayerCost:
    """One partitionable layer as the planner sees it.

    ``times``: seconds of the whole layer (with its per-channel ops) on each device. ``in_bytes``: its
    input, sent to every device taking a share. ``out_bytes``: its output after the per-channel ops
    (each device sends back its share). ``sum_bytes``: the layer's own output, the partial sum every
    device sends when the layer is the second of an IOP pair. ``source``: where its input lives
    (None: on the device that joins, ``rest``)."""

    name: str
    channels: int
    times: Mapping[str, float]
    in_bytes: float
    out_bytes: float
    sum_bytes: float
    pairs_next: bool = False
    source: str | None = None


@dataclass(frozen=True)
class Unit:
    """``ocp`` (one layer split), ``whole`` (one layer on the rest device) or ``iop`` (a pair);
    ``counts``: the first layer's output channels per device (the pair's second layer takes the
    matching input channels)."""

    kind: str
    layers: tuple[int, ...]
    counts: tuple[int, ...]
    modelled_s: float


@dataclass(frozen=True)
class PairCompare:
    """One adjacent pair that IOP can take: its modelled time as a pair and as two OCP layers."""

    first: int
    second: int
    iop_s: float
    ocp_s: float
    iop_counts: tuple[int, ...]
    ocp_counts: tuple[tuple[int, ...], tuple[int, ...]]

    @property
    def iop_wins(self) -> bool:
        return self.iop_s < self.ocp_s


@dataclass
class PairingPlan:
    """Units front to back, every eligible pair's comparison, and the vectors a run used (``pairing``:
    1 where a layer is the first of an IOP pair; ``shares``: per layer, the fraction of its channels
    on each device, as executed after rounding to whole channels)."""

    devices: list[str]
    rest: str
    units: list[Unit]
    comparisons: list[PairCompare]
    pairing: list[int]
    shares: list[list[float]] = field(default_factory=list)

    @property
    def modelled_s(self) -> float:
        return sum(u.modelled_s for u in self.units)


def linear_link(latency_s: float = 50e-6, bytes_per_s: float = 10e9) -> LinkFn:
    """One latency and bandwidth for every pair of distinct devices (tests, planning by hand)."""

    def link(src: str, dst: str, nbytes: float) -> float:
        return 0.0 if src == dst or nbytes <= 0 else latency_s + nbytes / bytes_per_s

    return link


def table_link(links: Mapping[tuple[str, str], tuple[float, float]],
               extra: Mapping[tuple[str, str], float] | None = None) -> LinkFn:
    """Measured (latency s, bytes/s) per ordered device pair (``engine.blocks.measure_links``), plus
    ``extra`` seconds per pair (the engine's hand-off between workers, which a copy alone misses)."""

    def link(src: str, dst: str, nbytes: float) -> float:
        if src == dst or nbytes <= 0:
            return 0.0
        latency, bandwidth = links[(src, dst)]
        return latency + (extra or {}).get((src, dst), 0.0) + nbytes / bandwidth

    return link


def proportional_shares(times: Mapping[str, float], devices: Sequence[str]) -> list[float]:
    """Shares proportional to each device's measured rate (1 / seconds) for the work."""
    rates = [1.0 / max(times[d], 1e-12) for d in devices]
    total = sum(rates)
    return [r / total for r in rates]


def channel_counts(shares: Sequence[float], channels: int) -> tuple[int, ...]:
    """Whole channels per device summing to ``channels``, closest to the shares (largest remainder);
    a device whose share rounds to nothing gets 0 and sits the layer out."""
    total = sum(max(s, 0.0) for s in shares)
    if total <= 0:
        raise ValueError("shares must not all be zero")
    exact = [max(s, 0.0) / total * channels for s in shares]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda j: (-(exact[j] - counts[j]), j))
    for j in order[: channels - sum(counts)]:
        counts[j] += 1
    return tuple(counts)


def _path(link: LinkFn, src: str, dev: str, rest: str, in_bytes: float, compute_s: float, back_bytes: float
          ) -> float:
    return link(src, dev, in_bytes) + compute_s + link(dev, rest, back_bytes)


def ocp_time(layer: LayerCost, counts: Sequence[int], devices: Sequence[str], rest: str, link: LinkFn) -> float:
    """Modelled seconds of one layer split by output channels (slowest device's path)."""
    src = layer.source or rest
    worst = 0.0
    for dev, n in zip(devices, counts, strict=True):
        if n:
            frac = n / layer.channels
            worst = max(worst, _path(link, src, dev, rest, layer.in_bytes, frac * layer.times[dev],
                                     frac * layer.out_bytes))
    return worst


def iop_time(first: LayerCost, second: LayerCost, counts: Sequence[int], devices: Sequence[str], rest: str,
             link: LinkFn) -> float:
    """Modelled seconds of a pair: ``first`` by output channels, ``second`` by the matching input
    channels (its FLOPs split in the same fractions), partial sums sent back whole."""
    src = first.source or rest
    worst = 0.0
    for dev, n in zip(devices, counts, strict=True):
        if n:
            frac = n / first.channels
            compute = frac * (first.times[dev] + second.times[dev])
            worst = max(worst, _path(link, src, dev, rest, first.in_bytes, compute, second.sum_bytes))
    return worst


def layer_shares(layers: Sequence[LayerCost], devices: Sequence[str], shares: Sequence[float] | None
                 ) -> list[list[float] | None]:
    """Given shares per layer, or None where the planner decides. ``shares`` holds one value per
    layer (the first device's fraction; the others split the rest by their measured rates) or one
    per layer and device (normalised per layer)."""
    n, d = len(layers), len(devices)
    if shares is None:
        return [None] * n
    if len(shares) == n * d and d > 1 and len(shares) != n:
        rows = [list(shares[i * d:(i + 1) * d]) for i in range(n)]
        if any(sum(r) <= 0 for r in rows):
            raise ValueError("every layer needs a positive share on some device")
        return [[s / sum(r) for s in r] for r in rows]
    if len(shares) != n:
        raise ValueError(f"shares has {len(shares)} values; give {n} (one per partitionable layer: the first "
                         f"device's fraction)" + (f" or {n * d} (one per layer and device)" if d > 2 else ""))
    out: list[list[float] | None] = []
    for layer, first in zip(layers, shares, strict=True):
        if d == 1:
            out.append([1.0])
            continue
        others = proportional_shares(layer.times, devices[1:])
        out.append([first] + [(1.0 - first) * s for s in others])
    return out


def _counts(layer: LayerCost, given: list[float] | None, times: Mapping[str, float], devices: Sequence[str]
            ) -> tuple[int, ...]:
    return channel_counts(given if given is not None else proportional_shares(times, devices), layer.channels)


def _pair_times(a: LayerCost, b: LayerCost, devices: Sequence[str]) -> dict[str, float]:
    return {d: a.times[d] + b.times[d] for d in devices}


def compare_pairs(layers: Sequence[LayerCost], devices: Sequence[str], rest: str, link: LinkFn,
                  shares: Sequence[float] | None = None) -> list[PairCompare]:
    """IOP against OCP + OCP for every adjacent pair IOP can take (the seed's comparison table)."""
    given = layer_shares(layers, devices, shares)
    out = []
    for i in range(len(layers) - 1):
        a, b = layers[i], layers[i + 1]
        if not a.pairs_next:
            continue
        pair = _counts(a, given[i], _pair_times(a, b, devices), devices)
        ca, cb = _counts(a, given[i], a.times, devices), _counts(b, given[i + 1], b.times, devices)
        out.append(PairCompare(i, i + 1, iop_time(a, b, pair, devices, rest, link),
                               ocp_time(a, ca, devices, rest, link) + ocp_time(b, cb, devices, rest, link),
                               pair, (ca, cb)))
    return out


def plan_pairing(layers: Sequence[LayerCost], devices: Sequence[str], rest: str, link: LinkFn,
                 pairing: Sequence[int] | None = None, shares: Sequence[float] | None = None,
                 unsplit: bool = False) -> PairingPlan:
    """The seed's Algorithm 1 (``pairing`` None): front to back, pair (i, i+1) when IOP's modelled time
    beats OCP(i) + OCP(i+1), else OCP for i alone. With ``pairing`` (1 = pair with the next layer,
    0 = alone) the walk follows it; a 1 where IOP cannot pair, on the last layer, or on a layer
    already taken as a pair's second, counts as 0 (``plan.pairing`` is what ran). ``unsplit`` also
    weighs a layer whole on ``rest`` (the seed's eta = (0, 0), unit kind ``whole``) against its OCP
    split wherever its shares are not given: on a pool where links cost more than a share of the
    compute saves, the split loses."""
    if rest not in devices:
        raise ValueError(f"rest {rest!r} is not one of the devices {list(devices)}")
    n = len(layers)
    if pairing is not None and len(pairing) != n:
        raise ValueError(f"pairing has {len(pairing)} values; the model has {n} partitionable layers")
    given = layer_shares(layers, devices, shares)
    table = {c.first: c for c in compare_pairs(layers, devices, rest, link, shares)}

    def alone(i: int) -> Unit:
        counts = _counts(layers[i], given[i], layers[i].times, devices)
        best = Unit("ocp", (i,), counts, ocp_time(layers[i], counts, devices, rest, link))
        if unsplit and given[i] is None:
            whole = tuple(layers[i].channels if d == rest else 0 for d in devices)
            t = ocp_time(layers[i], whole, devices, rest, link)
            if t < best.modelled_s:
                best = Unit("whole", (i,), whole, t)
        return best

    units: list[Unit] = []
    used = [0] * n
    i = 0
    while i < n:
        cmp = table.get(i)
        if cmp is not None and pairing is None:
            take = cmp.iop_s < alone(i).modelled_s + alone(i + 1).modelled_s
        else:
            take = cmp is not None and pairing is not None and bool(pairing[i])
        if take and cmp is not None:
            units.append(Unit("iop", (i, i + 1), cmp.iop_counts, cmp.iop_s))
            used[i] = 1
            i += 2
            continue
        units.append(alone(i))
        i += 1
    fractions: list[list[float]] = [[] for _ in range(n)]
    for unit in units:
        for k in unit.layers:
            fractions[k] = [c / layers[unit.layers[0]].channels for c in unit.counts]
    return PairingPlan(list(devices), rest, units, list(table.values()), used, fractions)
