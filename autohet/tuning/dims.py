"""Search-space dimensions: one class per kind, each suggests, checks and serialises itself.

As Optuna's distributions do, a dimension knows its own range: ``suggest`` asks an Optuna trial
for a value (define-by-run), ``contains`` says whether a value lies in the space (initial points,
exported configs), ``to_dict`` gives back its YAML form. Vector dimensions (one value per
executor, per block, per chain...) take their length from the ``SpaceContext`` of the tune.
The YAML ``type`` names map to classes in ``DIM_TYPES``; a new kind joins there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autohet.core.errors import UserError

__all__ = ["DIM_TYPES", "CategoricalDim", "Dim", "FloatDim", "FloatVectorDim", "IndexVectorDim", "IntDim",
           "PoolIndexDim", "SpaceContext", "parse_dim"]

_COMMON = {"type", "when"}


@dataclass(frozen=True)
class SpaceContext:
    """What sizes the dims of one tune (fixed for the whole study): vector lengths by name
    (``executors``: the largest pool topology; ``blocks``: the tuned model's partition; ``devices``:
    the in-process strategies' devices; others a strategy declares), executor kinds, pool dims on."""

    sizes: Mapping[str, int] = field(default_factory=dict)
    kinds: frozenset[str] = field(default_factory=frozenset)
    pool_dims: bool = False

    def size(self, name: str) -> int:
        return int(self.sizes.get(name, 0))


@dataclass(frozen=True)
class Dim:
    """One searchable dimension; ``when`` is the (sibling, value) that gates it, or None."""

    name: str
    when: tuple[str, Any] | None = None
    type: ClassVar[str] = ""
    keys: ClassVar[frozenset[str]] = frozenset()
    vector: ClassVar[bool] = False

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> Any:
        raise NotImplementedError

    def contains(self, value: Any, ctx: SpaceContext | None = None) -> bool:
        raise NotImplementedError

    def values(self) -> list[Any] | None:
        """Every value, for a finite scalar dim (None otherwise)."""
        return None

    def _fields(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        out = {"type": self.type, **self._fields()}
        if self.when is not None:
            out["when"] = {self.when[0]: self.when[1]}
        return out


def _number(raw: dict[str, Any], key: str, name: str, where: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{where}: {name} ({raw['type']}) needs a numeric {key}")
    return value


def _range(raw: dict[str, Any], name: str, where: str) -> tuple[float, float]:
    low, high = _number(raw, "low", name, where), _number(raw, "high", name, where)
    if low > high:
        raise UserError(f"{where}: {name} has low {low} > high {high}")
    if raw.get("log") and low <= 0:
        raise UserError(f"{where}: {name} is log-scaled, so low must be > 0")
    return low, high


@dataclass(frozen=True)
class IntDim(Dim):
    low: int = 0
    high: int = 0
    log: bool = False
    step: int = 1
    type: ClassVar[str] = "int"
    keys: ClassVar[frozenset[str]] = frozenset({"low", "high", "log", "step"})

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str, where: str) -> IntDim:
        low, high = _range(raw, name, where)
        return cls(name, low=int(low), high=int(high), log=bool(raw.get("log", False)), step=int(raw.get("step") or 1))

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> int:
        return trial.suggest_int(key, self.low, self.high, step=self.step, log=self.log)

    def contains(self, value: Any, ctx: SpaceContext | None = None) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high \
            and (value - self.low) % self.step == 0

    def _fields(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, **({"log": True} if self.log else {}),
                **({"step": self.step} if self.step != 1 else {})}


@dataclass(frozen=True)
class FloatDim(Dim):
    low: float = 0.0
    high: float = 1.0
    log: bool = False
    step: float | None = None
    type: ClassVar[str] = "float"
    keys: ClassVar[frozenset[str]] = frozenset({"low", "high", "log", "step"})

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str, where: str) -> FloatDim:
        low, high = _range(raw, name, where)
        return cls(name, low=float(low), high=float(high), log=bool(raw.get("log", False)), step=raw.get("step"))

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> float:
        return trial.suggest_float(key, self.low, self.high, log=self.log, step=self.step)

    def contains(self, value: Any, ctx: SpaceContext | None = None) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
            and self.low <= value <= self.high

    def _fields(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, **({"log": True} if self.log else {}),
                **({"step": self.step} if self.step is not None else {})}


@dataclass(frozen=True)
class CategoricalDim(Dim):
    choices: tuple = ()
    type: ClassVar[str] = "categorical"
    keys: ClassVar[frozenset[str]] = frozenset({"choices"})

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str, where: str) -> CategoricalDim:
        if not isinstance(raw.get("choices"), list) or not raw["choices"]:
            raise UserError(f"{where}: {name} (categorical) needs a non-empty choices list")
        return cls(name, choices=tuple(raw["choices"]))

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> Any:
        return trial.suggest_categorical(key, list(self.choices))

    def contains(self, value: Any, ctx: SpaceContext | None = None) -> bool:
        return any(value == c and type(value) is type(c) for c in self.choices)

    def values(self) -> list[Any]:
        return list(self.choices)

    def _fields(self) -> dict[str, Any]:
        return {"choices": list(self.choices)}


@dataclass(frozen=True)
class PoolIndexDim(Dim):
    """An executor of the pool (its index), e.g. ``single``'s executor."""

    type: ClassVar[str] = "pool_index"

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str, where: str) -> PoolIndexDim:
        return cls(name)

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> int:
        return trial.suggest_categorical(key, list(range(ctx.size("executors"))))

    def contains(self, value: Any, ctx: SpaceContext | None = None) -> bool:
        return isinstance(value, int) and value >= 0 and (ctx is None or value < ctx.size("executors"))


@dataclass(frozen=True)
class FloatVectorDim(Dim):
    """One float in [low, high] per item of ``size`` (``<key>_<i>`` in Optuna)."""

    size: str = "executors"
    low: float = 0.0
    high: float = 1.0
    type: ClassVar[str] = "float_vector"
    keys: ClassVar[frozenset[str]] = frozenset({"size", "low", "high"})
    vector: ClassVar[bool] = True

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str, where: str) -> FloatVectorDim:
        low, high = _range(raw, name, where)
        return cls(name, size=str(raw.get("size", cls.size)), low=float(low), high=float(high))

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> list[float] | None:
        n = ctx.size(self.size)
        if n == 0:
            return None
        return [trial.suggest_float(f"{key}_{i}", self.low, self.high) for i in range(n)]

    def contains(self, value: Any, ctx: SpaceContext | None = None) -> bool:
        return isinstance(value, list) and all(self.low <= v <= self.high for v in value) \
            and (ctx is None or len(value) == ctx.size(self.size))

    def _fields(self) -> dict[str, Any]:
        return {"size": self.size, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class WeightsDim(FloatVectorDim):
    """One weight per executor of the largest topology (``static``'s ratios)."""

    type: ClassVar[str] = "weights"
    keys: ClassVar[frozenset[str]] = frozenset({"low", "high"})

    def _fields(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high}


@dataclass(frozen=True)
class IndexVectorDim(Dim):
    """One index in range(``of``) per item of ``size``, e.g. a device per block. Suggests nothing
    when there is only one choice (the strategy fills it in) or no items (unknown partition)."""

    size: str = "blocks"
    of: str = "devices"
    type: ClassVar[str] = "index_vector"
    keys: ClassVar[frozenset[str]] = frozenset({"size", "of"})
    vector: ClassVar[bool] = True

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str, where: str) -> IndexVectorDim:
        return cls(name, size=str(raw.get("size", cls.size)), of=str(raw.get("of", cls.of)))

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> list[int] | None:
        n, choices = ctx.size(self.size), ctx.size(self.of)
        if n == 0 or choices < 2:
            return None
        return [trial.suggest_categorical(f"{key}_{i}", list(range(choices))) for i in range(n)]

    def contains(self, value: Any, ctx: SpaceContext | None = None) -> bool:
        if not isinstance(value, list):
            return False
        return ctx is None or (len(value) == ctx.size(self.size) and all(0 <= v < ctx.size(self.of) for v in value))

    def _fields(self) -> dict[str, Any]:
        return {"size": self.size, "of": self.of}


@dataclass(frozen=True)
class BlockDevicesDim(IndexVectorDim):
    """A device index per block of the tuned model (placement's vector); gated by ``start: given``
    unless it says otherwise."""

    type: ClassVar[str] = "block_devices"
    keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str, where: str) -> BlockDevicesDim:
        return cls(name, when=("start", "given"))

    def _fields(self) -> dict[str, Any]:
        return {}


DIM_TYPES: dict[str, type[Dim]] = {c.type: c for c in (IntDim, FloatDim, CategoricalDim, PoolIndexDim,
                                                        FloatVectorDim, WeightsDim, IndexVectorDim, BlockDevicesDim)}


def parse_dim(raw: Any, name: str, where: str) -> Dim:
    """A dim from its YAML mapping; an unknown type or key lists the valid ones."""
    if not isinstance(raw, dict) or raw.get("type") not in DIM_TYPES:
        raise UserError(f"{where}: {name} must be a mapping with type: one of {', '.join(DIM_TYPES)}")
    cls = DIM_TYPES[raw["type"]]
    unknown = sorted(set(raw) - _COMMON - cls.keys)
    if unknown:
        raise UserError(f"{where}: {name} has unknown key {unknown[0]!r}; valid for {cls.type}: "
                        f"{', '.join(sorted(_COMMON | cls.keys))}")
    when = raw.get("when")
    if when is not None and (not isinstance(when, dict) or len(when) != 1):
        raise UserError(f"{where}: {name} has when: {when!r}; it must be one sibling and its value, "
                        "e.g. when: {start: given}")
    dim = cls.parse(raw, name, where)
    if when:
        from dataclasses import replace

        dim = replace(dim, when=next(iter(when.items())))
    return dim
