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
weights (one float per executor, low/high), block_devices (one device index per block of the tuned
model's partition: ``<strategy>.<param>_<i>``, categorical over the pool's devices). Optuna names are
``<strategy>.<param>``, ``exec.<kind>.<param>`` and ``pool.<name>``, so conditional parameters never collide.

``when: {sibling: value}`` makes a strategy dim conditional: it is suggested only in trials where
the sibling dim (suggested first, whatever the YAML order) took that value. A block_devices dim is
gated by ``start: given`` unless it says otherwise, and suggests nothing on a one-device pool (the
only vector is all-CPU; the strategy fills it in), nor when the partition is unknown (no blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autohet.errors import UserError
from autohet.executors.base import EXECUTOR_PARAMS
from autohet.strategies import get_strategy, strategy_names
from autohet.yaml_files import read_yaml_mapping

__all__ = ["Dim", "SearchSpace", "SpaceContext", "load_search_space"]

_TYPES = ("int", "float", "categorical", "pool_index", "weights", "block_devices")
_POOL_DIMS = ("cpu_group_size", "max_cpu_groups")
_BLOCK_GATE = ("start", "given")  # block_devices without ``when``: only for a given start


@dataclass(frozen=True)
class SpaceContext:
    """What sizes the dims of one tune: fixed for the whole study, so it is computed once.

    ``pool_size`` sizes pool_index and weights; ``blocks`` (the tuned model's partition) and
    ``devices`` (1, or 2 with a GPU executor) size block_devices.
    """

    pool_size: int
    kinds: frozenset[str] = field(default_factory=frozenset)
    pool_dims: bool = False
    blocks: int = 0
    devices: int = 1

    @staticmethod
    def devices_for(kinds: set[str] | frozenset[str]) -> int:
        """Placement devices: the CPU, plus ``cuda:0`` when any executor is a GPU."""
        return 2 if "gpu" in kinds else 1


@dataclass(frozen=True)
class Dim:
    """One searchable dimension; ``when`` is the (sibling, value) that gates it, or None."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    when: tuple[str, Any] | None = None

    def suggest(self, trial: Any, key: str, ctx: SpaceContext) -> Any:
        if self.type == "int":
            step = int(self.step or 1)
            return trial.suggest_int(key, int(self.low), int(self.high), step=step, log=self.log)
        if self.type == "float":
            return trial.suggest_float(key, float(self.low), float(self.high), log=self.log, step=self.step)
        if self.type == "categorical":
            return trial.suggest_categorical(key, list(self.choices))
        if self.type == "pool_index":
            return trial.suggest_categorical(key, list(range(ctx.pool_size)))
        if self.type == "block_devices":
            if ctx.devices < 2:
                return None
            return [trial.suggest_categorical(f"{key}_{i}", list(range(ctx.devices))) for i in range(ctx.blocks)]
        return [trial.suggest_float(f"{key}_{i}", float(self.low), float(self.high)) for i in range(ctx.pool_size)]


def _dim(raw: Any, name: str, where: str) -> Dim:
    if not isinstance(raw, dict) or raw.get("type") not in _TYPES:
        raise UserError(f"{where}: {name} must be a mapping with type: one of {', '.join(_TYPES)}")
    kind = raw["type"]
    unknown = sorted(set(raw) - {"type", "low", "high", "log", "step", "choices", "when"})
    if unknown:
        raise UserError(f"{where}: {name} has unknown key {unknown[0]!r}; valid: type, low, high, log, step, "
                        "choices, when")
    when = raw.get("when")
    if when is not None and (not isinstance(when, dict) or len(when) != 1):
        raise UserError(f"{where}: {name} has when: {when!r}; it must be one sibling and its value, "
                        "e.g. when: {start: given}")
    if kind in ("int", "float", "weights"):
        if not isinstance(raw.get("low"), (int, float)) or not isinstance(raw.get("high"), (int, float)):
            raise UserError(f"{where}: {name} ({kind}) needs numeric low and high")
        if raw["low"] > raw["high"]:
            raise UserError(f"{where}: {name} has low {raw['low']} > high {raw['high']}")
        if raw.get("log") and raw["low"] <= 0:
            raise UserError(f"{where}: {name} is log-scaled, so low must be > 0")
    if kind == "categorical" and (not isinstance(raw.get("choices"), list) or not raw["choices"]):
        raise UserError(f"{where}: {name} (categorical) needs a non-empty choices list")
    gate = next(iter(when.items())) if when else (_BLOCK_GATE if kind == "block_devices" else None)
    return Dim(name, kind, raw.get("low"), raw.get("high"), bool(raw.get("log", False)), raw.get("step"),
               tuple(raw.get("choices") or ()), gate)


def _plain(dim: Dim, where: str) -> Dim:
    """Executor and pool dims: no gates, no per-block vectors (those belong to a strategy)."""
    if dim.type == "block_devices" or dim.when is not None:
        raise UserError(f"{where}: {dim.name} is an executor or pool dim; block_devices and when: are only "
                        "for strategy parameters")
    return dim


def _check_gates(dims: dict[str, Dim], strategy: str, where: str) -> None:
    """Every ``when`` names a categorical sibling that can take the value, and gates form no cycle."""
    for name, dim in dims.items():
        if dim.when is None:
            continue
        sibling, value = dim.when
        gate = dims.get(sibling)
        if gate is None or gate.type != "categorical" or value not in gate.choices:
            raise UserError(f"{where}: {strategy}.{name} is searched only when {sibling} is {value!r}, so "
                            f"{strategy} needs {sibling}: {{type: categorical, choices: [..., {value}]}}")
    _gate_order(dims, f"{where}: {strategy}")


def _gate_order(dims: dict[str, Dim], where: str = "search space") -> list[str]:
    """Dim names with each gate before the dims it gates (YAML order otherwise)."""
    order: list[str] = []

    def visit(name: str, seen: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in seen:
            raise UserError(f"{where}: the when: gates of {', '.join(seen)} form a cycle")
        gate = dims[name].when
        if gate is not None and gate[0] in dims:
            visit(gate[0], (*seen, name))
        order.append(name)

    for name in dims:
        visit(name, ())
    return order


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

    def define(self, trial: Any, ctx: SpaceContext) -> None:
        """The define-by-run function body: strategy first, then its params (gates before the dims
        they gate), executors, pool."""
        strategy = trial.suggest_categorical("strategy", list(self.strategies))
        dims = self.strategies[strategy]
        chosen: dict[str, Any] = {}
        for name in _gate_order(dims):
            dim = dims[name]
            if dim.when is not None and chosen.get(dim.when[0]) != dim.when[1]:
                continue
            chosen[name] = dim.suggest(trial, f"{strategy}.{name}", ctx)
        for kind in sorted(ctx.kinds):
            for name, dim in self.executors.get(kind, {}).items():
                dim.suggest(trial, f"exec.{kind}.{name}", ctx)
        if ctx.pool_dims:
            for name, dim in self.pool.items():
                dim.suggest(trial, f"pool.{name}", ctx)

    def has_type(self, kind: str) -> bool:
        """Whether any strategy dim is of this type (the tuner partitions the model only for block_devices)."""
        return any(d.type == kind for dims in self.strategies.values() for d in dims.values())

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
            _check_gates(strategies[name], name, str(path))
        for kind, dims in (raw.get("executors") or {}).items():
            if kind not in ("cpu", "gpu", "sim"):
                raise UserError(f"{path}: executor kind {kind!r} is not cpu, gpu or sim")
            bad = sorted(set(dims or {}) - set(EXECUTOR_PARAMS))
            if bad:
                raise UserError(f"{path}: executors.{kind} has no parameter {bad[0]!r}; valid: "
                                f"{', '.join(EXECUTOR_PARAMS)}")
            executors[kind] = {p: _plain(_dim(d, f"{kind}.{p}", str(path)), str(path))
                               for p, d in (dims or {}).items()}
        for name, dim in (raw.get("pool") or {}).items():
            if name not in _POOL_DIMS:
                raise UserError(f"{path}: pool has no dimension {name!r}; valid: {', '.join(_POOL_DIMS)}")
            pool[name] = _plain(_dim(dim, f"pool.{name}", str(path)), str(path))
    if "single" not in strategies:
        strategies["single"] = {"executor": Dim("executor", "pool_index")}
    return SearchSpace(strategies, executors, pool)
