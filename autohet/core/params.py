"""Declared parameters of strategies and executors: one class per kind, each checks its own values.

Parameters are data: a kind, a default and a valid range or set of choices. ``validate_params``
fills the defaults and converts and checks every given value (``Param.coerce``). A search space
file may only name declared parameters, and its loader (``autohet.tuning.space``) coerces the ends
of each int/float dim and every choice of a categorical dim, so those cannot suggest a value the
parameter refuses; vector dims are not checked against the parameter there.
``contains`` says whether a value is valid as given, with no conversion. An unknown name or a value
out of range is an error that lists what is valid (never dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from autohet.core.errors import UserError

__all__ = [
    "BoolParam", "ChoiceParam", "FloatListParam", "FloatParam", "IntListParam", "IntParam", "Param", "StrParam",
    "parse_set_options", "validate_params",
]


@dataclass(frozen=True)
class Param:
    """One parameter. Subclasses convert a YAML/CLI value (``_convert``) and check it (``_check``)."""

    name: str
    default: Any = None
    help: str = ""
    kind: ClassVar[str] = "any"

    def describe(self) -> str:
        return f"{self.name} ({self.kind})"

    def _convert(self, value: Any) -> Any:
        return value

    def _check(self, value: Any) -> str | None:
        """A reason the converted value is invalid, or None."""
        return None

    def coerce(self, value: Any, owner: str) -> Any:
        """The value in this parameter's type, or a UserError naming the fix."""
        where = f"{owner}: parameter {self.name}"
        try:
            value = self._convert(value)
        except (TypeError, ValueError):
            raise UserError(f"{where} must be {self.kind}, got {value!r}") from None
        problem = self._check(value)
        if problem:
            raise UserError(f"{where} {problem}")
        return value

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is valid as given (no conversion needed)."""
        try:
            return self._convert(value) == value and self._check(value) is None
        except (TypeError, ValueError):
            return False


@dataclass(frozen=True)
class _Ranged(Param):
    low: float | None = None
    high: float | None = None

    def describe(self) -> str:
        if self.low is None and self.high is None:
            return f"{self.name} ({self.kind})"
        return f"{self.name} ({self.kind} in [{self.low}, {self.high}])"

    def _out_of_range(self, item: float) -> str | None:
        if (self.low is not None and item < self.low) or (self.high is not None and item > self.high):
            return f"= {item} is out of range [{self.low}, {self.high}]"
        return None


@dataclass(frozen=True)
class IntParam(_Ranged):
    kind: ClassVar[str] = "int"

    def _convert(self, value: Any) -> int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        return int(value)

    def _check(self, value: int) -> str | None:
        return self._out_of_range(value)


@dataclass(frozen=True)
class FloatParam(_Ranged):
    kind: ClassVar[str] = "float"

    def _convert(self, value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)

    def _check(self, value: float) -> str | None:
        return self._out_of_range(value)


@dataclass(frozen=True)
class BoolParam(Param):
    kind: ClassVar[str] = "bool"

    def _convert(self, value: Any) -> bool:
        if isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool | int):
            raise ValueError(value)
        return bool(value)


@dataclass(frozen=True)
class StrParam(Param):
    kind: ClassVar[str] = "str"

    def _convert(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class ChoiceParam(Param):
    choices: tuple = field(default_factory=tuple)
    kind: ClassVar[str] = "choice"

    def describe(self) -> str:
        return f"{self.name} (one of {', '.join(map(str, self.choices))})"

    def _convert(self, value: Any) -> Any:
        match = next((c for c in self.choices if c == value or str(c) == str(value)), None)
        return value if match is None else match

    def _check(self, value: Any) -> str | None:
        if value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        return None


@dataclass(frozen=True)
class _ListParam(_Ranged):
    item: ClassVar[type] = float

    def _convert(self, value: Any) -> list:
        if isinstance(value, str):
            value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
        if not isinstance(value, Sequence):
            raise ValueError(value)
        out = []
        for v in value:
            if isinstance(v, bool) or (self.item is int and isinstance(v, float) and not v.is_integer()):
                raise ValueError(v)
            out.append(self.item(v))
        return out

    def _check(self, value: list) -> str | None:
        for item in value:
            problem = self._out_of_range(item)
            if problem:
                return problem
        return None


@dataclass(frozen=True)
class IntListParam(_ListParam):
    kind: ClassVar[str] = "int_list"
    item: ClassVar[type] = int


@dataclass(frozen=True)
class FloatListParam(_ListParam):
    kind: ClassVar[str] = "float_list"
    item: ClassVar[type] = float


def validate_params(owner: str, declared: dict[str, Param], given: dict[str, Any]) -> dict[str, Any]:
    """Fills defaults and checks every given value; an unknown name lists the valid ones."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        valid = ", ".join(p.describe() for p in declared.values()) or "none"
        raise UserError(f"{owner} has no parameter {unknown[0]!r}; valid: {valid}")
    out = {}
    for name, param in declared.items():
        if name in given and given[name] is not None:
            out[name] = param.coerce(given[name], owner)
        else:
            out[name] = param.default
    return out


def parse_set_options(items: list[str] | None) -> dict[str, Any]:
    """Parses repeated ``--set key=value`` options; values are read as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r} must look like key=value, e.g. --set w_s=64")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out
