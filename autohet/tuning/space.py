"""search_spaces/*.yaml -> an Optuna define-by-run space: the strategy first, then its parameters.

A family file::

    family: data_parallel
    strategies:
      fast_split:
        w_s: {type: int, low: 16, high: 1024, log: true}
        r: {type: float, low: 0.1, high: 1.0}

``executors.yaml`` gives the executor parameters every trial may vary, per executor kind, and
pool-level dimensions (``cpu_group_size``, used when the pool is ``auto``). Types: int, float
(low/high, optional log/step), categorical (choices), pool_index (an executor of the pool),
weights (one float per executor, low/high). Optuna names are ``<strategy>.<param>``,
``exec.<kind>.<param>`` and ``pool.<name>``, so conditional parameters never collide.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autohet.errors import UserError
from autohet.executors.base import EXECUTOR_PARAMS
from autohet.strategies import get_strategy, strategy_names
from autohet.yaml_files import read_yaml_mapping

__all__ = ["Dim", "SearchSpace", "load_search_space"]

_TYPES = ("int", "float", "categorical", "pool_index", "weights")
_POOL_DIMS = ("cpu_group_size",)


@dataclass(frozen=True)
class Dim:
    """One searchable dimension."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial: Any, key: str, pool_size: int) -> Any:
        if self.type == "int":
            step = int(self.step or 1)
            return trial.suggest_int(key, int(self.low), int(self.high), step=step, log=self.log)
        if self.type == "float":
            return trial.suggest_float(key, float(self.low), float(self.high), log=self.log, step=self.step)
        if self.type == "categorical":
            return trial.suggest_categorical(key, list(self.choices))
        if self.type == "pool_index":
            return trial.suggest_categorical(key, list(range(pool_size)))
        return [trial.suggest_float(f"{key}_{i}", float(self.low), float(self.high)) for i in range(pool_size)]


def _dim(raw: Any, name: str, where: str) -> Dim:
    if not isinstance(raw, dict) or raw.get("type") not in _TYPES:
        raise UserError(f"{where}: {name} must be a mapping with type: one of {', '.join(_TYPES)}")
    kind = raw["type"]
    unknown = sorted(set(raw) - {"type", "low", "high", "log", "step", "choices"})
    if unknown:
        raise UserError(f"{where}: {name} has unknown key {unknown[0]!r}; valid: type, low, high, log, step, choices")
    if kind in ("int", "float", "weights"):
        if not isinstance(raw.get("low"), (int, float)) or not isinstance(raw.get("high"), (int, float)):
            raise UserError(f"{where}: {name} ({kind}) needs numeric low and high")
        if raw["low"] > raw["high"]:
            raise UserError(f"{where}: {name} has low {raw['low']} > high {raw['high']}")
        if raw.get("log") and raw["low"] <= 0:
            raise UserError(f"{where}: {name} is log-scaled, so low must be > 0")
    if kind == "categorical" and (not isinstance(raw.get("choices"), list) or not raw["choices"]):
        raise UserError(f"{where}: {name} (categorical) needs a non-empty choices list")
    return Dim(name, kind, raw.get("low"), raw.get("high"), bool(raw.get("log", False)), raw.get("step"),
               tuple(raw.get("choices") or ()))


@dataclass
class SearchSpace:
    """Per strategy its dims; per executor kind its dims; pool-level dims."""

    strategies: dict[str, dict[str, Dim]]
    executors: dict[str, dict[str, Dim]]
    pool: dict[str, Dim]

    def restrict(self, names: list[str] | None, objective: str) -> SearchSpace:
        """Only ``names`` (plus ``single``, always) among strategies that serve the objective."""
        valid = [n for n in self.strategies if get_strategy(n).objective == objective or n == "single"]
        if names:
            unknown = [n for n in names if n not in self.strategies]
            if unknown:
                raise UserError(f"--strategies: {unknown[0]!r} has no search space; valid: "
                                f"{', '.join(sorted(self.strategies))}")
            wrong = [n for n in names if n not in valid]
            if wrong:
                raise UserError(f"--strategies: {wrong[0]!r} does not serve --objective {objective}; "
                                f"valid for it: {', '.join(valid)}")
            valid = [n for n in valid if n in names or n == "single"]
        return SearchSpace({n: self.strategies[n] for n in valid}, self.executors, self.pool)

    def define(self, trial: Any, pool_size: int, kinds: set[str], pool_dims: bool) -> None:
        """The define-by-run function body: strategy first, then its params, executors, pool."""
        strategy = trial.suggest_categorical("strategy", list(self.strategies))
        for name, dim in self.strategies[strategy].items():
            dim.suggest(trial, f"{strategy}.{name}", pool_size)
        for kind in sorted(kinds):
            for name, dim in self.executors.get(kind, {}).items():
                dim.suggest(trial, f"exec.{kind}.{name}", pool_size)
        if pool_dims:
            for name, dim in self.pool.items():
                dim.suggest(trial, f"pool.{name}", pool_size)

    @staticmethod
    def decode(config: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
        """A trial's flat config -> (strategy, params, executor params by kind, pool params)."""
        strategy = config["strategy"]
        params: dict[str, Any] = {}
        weights: dict[str, dict[int, float]] = {}
        executors: dict[str, dict[str, Any]] = {}
        pool: dict[str, Any] = {}
        for key, value in config.items():
            head, _, rest = key.partition(".")
            if head == strategy:
                base, _, index = rest.rpartition("_")
                if index.isdigit() and base:
                    weights.setdefault(base, {})[int(index)] = value
                else:
                    params[rest] = value
            elif head == "exec":
                kind, _, name = rest.partition(".")
                executors.setdefault(kind, {})[name] = value
            elif head == "pool":
                pool[rest] = value
        for name, by_index in weights.items():
            if name in params:
                continue
            params[name] = [by_index[i] for i in sorted(by_index)]
        return strategy, params, executors, pool


def load_search_space(directory: str | Path = "search_spaces") -> SearchSpace:
    """Reads every *.yaml in ``directory``; strategies and params are checked against the registry."""
    folder = Path(directory)
    if not folder.is_dir():
        raise UserError(f"search space folder {folder} not found; run from the project root or pass --spaces")
    strategies: dict[str, dict[str, Dim]] = {}
    executors: dict[str, dict[str, Dim]] = {}
    pool: dict[str, Dim] = {}
    for path in sorted(folder.glob("*.yaml")):
        raw = read_yaml_mapping(path, "a search space file", "search_spaces/data_parallel.yaml")
        unknown = sorted(set(raw) - {"family", "strategies", "executors", "pool", "objective"})
        if unknown:
            raise UserError(f"{path}: unknown key {unknown[0]!r}; valid: family, strategies, executors, pool")
        for name, dims in (raw.get("strategies") or {}).items():
            if name not in strategy_names():
                valid = ", ".join(sorted(strategy_names()))
                raise UserError(f"{path}: strategy {name!r} is not registered; valid: {valid}")
            declared = get_strategy(name).params
            dims = dims or {}
            bad = sorted(set(dims) - set(declared))
            if bad:
                raise UserError(f"{path}: strategy {name} has no parameter {bad[0]!r}; valid: "
                                f"{', '.join(declared) or 'none'}")
            strategies[name] = {p: _dim(d, f"{name}.{p}", str(path)) for p, d in dims.items()}
        for kind, dims in (raw.get("executors") or {}).items():
            if kind not in ("cpu", "gpu", "sim"):
                raise UserError(f"{path}: executor kind {kind!r} is not cpu, gpu or sim")
            bad = sorted(set(dims or {}) - set(EXECUTOR_PARAMS))
            if bad:
                raise UserError(f"{path}: executors.{kind} has no parameter {bad[0]!r}; valid: "
                                f"{', '.join(EXECUTOR_PARAMS)}")
            executors[kind] = {p: _dim(d, f"{kind}.{p}", str(path)) for p, d in (dims or {}).items()}
        for name, dim in (raw.get("pool") or {}).items():
            if name not in _POOL_DIMS:
                raise UserError(f"{path}: pool has no dimension {name!r}; valid: {', '.join(_POOL_DIMS)}")
            pool[name] = _dim(dim, f"pool.{name}", str(path))
    if "single" not in strategies:
        strategies["single"] = {"executor": Dim("executor", "pool_index")}
    return SearchSpace(strategies, executors, pool)
