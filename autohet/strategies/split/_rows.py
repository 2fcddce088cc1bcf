"""Row arithmetic of spatial splits (image height): which input rows an op's output rows read, how
a height is shared out between devices, and which rows every value of a chain must hold.

Shared by the intra-layer split (``split``: a chain's rows computed once per device from the input
rows they need, halos derived backward through the chain) and CoEdge (``coedge``: every value
split by the same shares, the halo rows fetched from their owners before every window op). Pure
Python: the rules are unit-testable without torch. A row range is ``(lo, hi)``, ``hi`` exclusive;
an empty range has ``hi <= lo``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["EMPTY", "RowNode", "Rows", "Window", "clip", "empty", "hull", "intersect", "needs", "pieces",
           "split_rows"]

Rows = tuple[int, int]
EMPTY: Rows = (0, 0)


def empty(rows: Rows | None) -> bool:
    return rows is None or rows[1] <= rows[0]


def hull(a: Rows | None, b: Rows | None) -> Rows:
    """The smallest range holding both (an empty one adds nothing)."""
    if empty(a):
        return b if not empty(b) else EMPTY  # type: ignore[return-value]
    if empty(b):
        return a  # type: ignore[return-value]
    return (min(a[0], b[0]), max(a[1], b[1]))  # type: ignore[index]


def intersect(a: Rows, b: Rows) -> Rows:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if hi > lo else EMPTY


def clip(rows: Rows, height: int) -> Rows:
    """The part of ``rows`` inside an image of ``height`` rows (the rest is border padding)."""
    return intersect(rows, (0, height))


@dataclass(frozen=True)
class Window:
    """How a convolution or pooling reads rows: output row ``o`` reads input rows ``o*stride - pad``
    to ``o*stride - pad + dilation*(kernel-1)`` (rows outside the image are its padding)."""

    kernel: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1

    def reads(self, rows: Rows) -> Rows:
        """Input rows (unclipped: negative or past the end where padding is read) for output ``rows``."""
        if empty(rows):
            return EMPTY
        a, b = rows
        return (a * self.stride - self.pad, (b - 1) * self.stride - self.pad + self.dilation * (self.kernel - 1) + 1)

    @property
    def pointwise(self) -> bool:
        """Output row o reads input row o only: no halo, no exchange."""
        return self.kernel == 1 and self.stride == 1 and self.pad == 0


@dataclass(frozen=True)
class RowNode:
    """A spatially-local op as the row arithmetic sees it: its value's height, the values it reads
    and, for a convolution or pooling, its window over an input of ``in_height`` rows (elementwise
    ops, residual adds and channel concatenations read the same rows they write)."""

    name: str
    inputs: tuple[str, ...]
    height: int
    window: Window | None = None
    in_height: int = 0

    def reads(self, rows: Rows) -> Rows:
        """Rows of each input needed for output ``rows`` (clipped to the image: the rest is padding)."""
        if self.window is None:
            return rows
        return clip(self.window.reads(rows), self.in_height)


def split_rows(height: int, shares: Sequence[float]) -> list[Rows]:
    """``height`` rows in contiguous ranges proportional to ``shares`` (device 0 on top); cumulative
    rounding, so every row belongs to exactly one device and a share of 0 gets no rows."""
    total = float(sum(shares))
    if total <= 0 or any(s < 0 for s in shares):
        raise ValueError(f"shares must be non-negative with a positive sum, got {list(shares)}")
    out, acc, lo = [], 0.0, 0
    for k, share in enumerate(shares):
        acc += share
        hi = height if k == len(shares) - 1 else min(height, max(lo, round(height * acc / total)))
        out.append((lo, hi) if share > 0 else (lo, lo))
        lo = hi
    return out


def needs(nodes: Sequence[RowNode], wanted: Mapping[str, Rows]) -> dict[str, Rows]:
    """Rows every value must hold so that the values in ``wanted`` get their rows: walked backward
    through ``nodes`` (topological order), each input needs the hull of what its readers read. Values
    read from outside ``nodes`` appear too (the rows to bring in); a node whose value no one needs is
    absent (not computed)."""
    need: dict[str, Rows] = {k: v for k, v in wanted.items() if not empty(v)}
    for node in reversed(nodes):
        rows = need.get(node.name)
        if empty(rows):
            continue
        reads = node.reads(rows)  # type: ignore[arg-type]
        for value in node.inputs:
            merged = hull(need.get(value), reads)
            if not empty(merged):
                need[value] = merged
    return need


def pieces(rows: Rows, owned: Sequence[Rows]) -> list[tuple[int, Rows]]:
    """Which device holds which part of ``rows`` when device k holds ``owned[k]``: (k, part) in row
    order, covering ``rows`` (a range no device holds raises)."""
    out = [(k, intersect(rows, own)) for k, own in enumerate(owned)]
    out = sorted(((k, part) for k, part in out if not empty(part)), key=lambda item: item[1][0])
    covered = rows[0]
    for _, part in out:
        if part[0] != covered:
            break
        covered = part[1]
    if not empty(rows) and covered < rows[1]:
        raise ValueError(f"rows {rows} are not all held: {list(owned)}")
    return out
