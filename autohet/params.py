"""Declared parameters of a strategy or executor: validation of user values against them.

Parameters are data: each has a type, a default and a valid range or set of choices. The
search spaces in search_spaces/*.yaml name the same parameters; an unknown name or a value
out of range is an error that lists what is valid (never silently dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from autohet.errors import UserError

__all__ = ["Param", "validate_params", "parse_set_options"]

_TYPES = ("int", "float", "bool", "choice", "str", "int_list", "float_list")


@dataclass(frozen=True)
class Param:
    """One parameter: ``kind`` is one of int, float, bool, choice, str, int_list, float_list."""

    name: str
    kind: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    choices: tuple = field(default_factory=tuple)
    help: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _TYPES:
            raise ValueError(f"param {self.name}: kind {self.kind!r} not in {_TYPES}")

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.name} (one of {', '.join(map(str, self.choices))})"
        if self.low is not None or self.high is not None:
            return f"{self.name} ({self.kind} in [{self.low}, {self.high}])"
        return f"{self.name} ({self.kind})"

    def coerce(self, value: Any, owner: str) -> Any:
        """Turns a YAML/CLI value into this parameter's type, or raises a UserError naming the fix."""
        where = f"{owner}: parameter {self.name}"
        try:
            if self.kind == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                value = int(value)
            elif self.kind == "float":
                value = float(value)
            elif self.kind == "bool":
                if isinstance(value, str):
                    if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError
                    value = value.lower() in ("true", "1", "yes")
                else:
                    value = bool(value)
            elif self.kind in ("int_list", "float_list"):
                if isinstance(value, str):
                    value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
                conv = int if self.kind == "int_list" else float
                value = [conv(v) for v in value]
            elif self.kind == "str":
                value = str(value)
        except (TypeError, ValueError):
            raise UserError(f"{where} must be {self.kind}, got {value!r}") from None
        if self.kind == "choice":
            if value not in self.choices and str(value) not in map(str, self.choices):
                raise UserError(f"{where} must be one of {', '.join(map(str, self.choices))}, got {value!r}")
            value = next(c for c in self.choices if str(c) == str(value))
        items = value if isinstance(value, list) else [value]
        if self.kind in ("int", "float", "int_list", "float_list"):
            for item in items:
                if (self.low is not None and item < self.low) or (self.high is not None and item > self.high):
                    raise UserError(f"{where} = {item} is out of range [{self.low}, {self.high}]")
        return value


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
