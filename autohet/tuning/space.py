"""search_spaces/*.yaml -> an Optuna define-by-run space: the strategy first, then its parameters.

A family file::

    family: data_parallel
    strategies:
      fast_split:
        w_s: {type: int, low: 16, high: 1024, log: true}
        r: {type: float, low: 0.1, high: 1.0}

``executors.yaml`` gives the executor parameters every trial may vary, per executor kind, and
pool-level dimensions (``cpu_group_size``, ``max_cpu_groups``, ``gpu_partitions``: used when the pool is
``auto``).
Dimension types are the classes of ``autohet.tuning.dims`` (int, float, categorical, pool_index,
weights, float_vector, index_vector, block_devices). Optuna names are ``<strategy>.<param>``,
``exec.<kind>.<param>`` and ``pool.<name>``, so conditional parameters never collide; vectors add
``_<i>``. ``when: {sibling: value}`` makes a strategy dim conditional: it is suggested only in
trials where the sibling dim (suggested first, whatever the YAML order) took that value. Every dim
is checked against the parameter it searches: a space cannot suggest what a strategy refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autohet.core.errors import UserError
from autohet.core.objectives import RunMode
from autohet.core.params import Param
from autohet.core.yaml_files import project_path, read_yaml_mapping
from autohet.executors import EXECUTOR_KINDS, EXECUTOR_PARAMS
from autohet.pool.spec import POOL_DIMS, PoolSpec
from autohet.strategies import BASELINE, get_strategy, is_baseline, strategy_names
from autohet.tuning.dims import CategoricalDim, Dim, FloatDim, IntDim, SpaceContext, parse_dim

__all__ = ["OPTUNA_TRIAL_KEY", "DefineByRun", "SearchSpace", "SpaceContext", "load_search_space"]

# Config key carrying the Optuna trial number (returned by the define-by-run function): it ties each
# Tune trial to its Optuna trial, so a resumed tune can settle trials a kill left running.
OPTUNA_TRIAL_KEY = "optuna_trial"


def _check_fits(dim: Dim, param: Param, where: str) -> None:
    """Scalar dims must only suggest values the parameter accepts."""
    values: list[Any] = []
    if isinstance(dim, IntDim | FloatDim):
        values = [dim.low, dim.high]
    elif isinstance(dim, CategoricalDim):
        values = list(dim.choices)
    for value in values:
        try:
            param.coerce(value, where)
        except UserError as exc:
            raise UserError(f"{where}: {dim.name} would suggest {value!r}, which the parameter refuses "
                            f"({str(exc).split(': ', 1)[-1]}); narrow the dim") from None


def _plain(dim: Dim, where: str) -> Dim:
    """Executor and pool dims: no gates, no vectors (those belong to a strategy)."""
    if dim.vector or dim.when is not None:
        raise UserError(f"{where}: {dim.name} is an executor or pool dim; vectors and when: are only "
                        "for strategy parameters")
    return dim


def _check_gates(dims: dict[str, Dim], strategy: str, where: str) -> None:
    """Every ``when`` names a categorical sibling that can take the value, and gates form no cycle."""
    for name, dim in dims.items():
        if dim.when is None:
            continue
        sibling, value = dim.when
        gate = dims.get(sibling)
        if not isinstance(gate, CategoricalDim) or value not in gate.choices:
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

    def restrict(self, names: list[str] | None, mode: RunMode) -> SearchSpace:
        """Only ``names`` (plus ``single``, always) among strategies that serve runs of ``mode``; for
        latency, without the executors' batch (requests are batch 1: trials varying it measure the
        same thing)."""
        valid = [n for n in self.strategies if mode in get_strategy(n).modes or is_baseline(n)]
        if names:
            unknown = [n for n in names if n not in self.strategies]
            if unknown:
                raise UserError(f"--strategies: {unknown[0]!r} has no search space; valid: "
                                f"{', '.join(sorted(self.strategies))}")
            wrong = [n for n in names if n not in valid]
            if wrong:
                raise UserError(f"--strategies: {wrong[0]!r} does not serve {mode} runs; "
                                f"valid for them: {', '.join(valid)}")
            valid = [n for n in valid if n in names or is_baseline(n)]
        executors = self.executors if not mode.per_request else {
            kind: {p: d for p, d in dims.items() if p != "batch"} for kind, dims in self.executors.items()}
        return SearchSpace({n: self.strategies[n] for n in valid}, executors, self.pool)

    def for_machine(self) -> tuple[SearchSpace, list[str]]:
        """The space without executor values this machine cannot run well (``executors.compiled.
        unsupported``), and a note per value left out."""
        from dataclasses import replace

        from autohet.executors.compiled import unsupported

        notes: list[str] = []
        executors: dict[str, dict[str, Dim]] = {}
        for kind, dims in self.executors.items():
            executors[kind] = {}
            for name, dim in dims.items():
                if isinstance(dim, CategoricalDim):
                    keep = []
                    for value in dim.choices:
                        why = unsupported(kind, name, value)
                        if why:
                            notes.append(f"{kind} {name}={value} left out: {why}")
                        else:
                            keep.append(value)
                    dim = replace(dim, choices=tuple(keep or dim.choices[:1]))
                executors[kind][name] = dim
        return SearchSpace(self.strategies, executors, self.pool), notes

    def for_pool(self, spec: PoolSpec) -> SearchSpace:
        """The space without pool dims that cannot vary this pool: ``max_cpu_groups`` where it has no GPU
        (without its CPU groups it would have no executor)."""
        if any(e.uses_gpu for e in spec.executors):
            return self
        pool = {k: v for k, v in self.pool.items() if k != "max_cpu_groups"}
        return SearchSpace(self.strategies, self.executors, pool)

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

    def vector_sizes(self) -> set[str]:
        """The context sizes the strategy dims need (the tuner computes only those)."""
        out = set()
        for dims in self.strategies.values():
            for dim in dims.values():
                for attr in ("size", "of"):
                    if hasattr(dim, attr):
                        out.add(getattr(dim, attr))
                if dim.type == "pool_index":
                    out.add("executors")
        return out

    @staticmethod
    def decode(config: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
        """A trial's flat config -> (strategy, params, executor params by kind, pool params)."""
        strategy = config["strategy"]
        params: dict[str, Any] = {}
        vectors: dict[str, dict[int, Any]] = {}
        executors: dict[str, dict[str, Any]] = {}
        pool: dict[str, Any] = {}
        for key, value in config.items():
            head, _, rest = key.partition(".")
            if head == strategy:
                base, _, index = rest.rpartition("_")
                if index.isdigit() and base:
                    vectors.setdefault(base, {})[int(index)] = value
                else:
                    params[rest] = value
            elif head == "exec":
                kind, _, name = rest.partition(".")
                executors.setdefault(kind, {})[name] = value
            elif head == "pool":
                pool[rest] = value
        for name, by_index in vectors.items():
            if name in params:
                continue
            params[name] = [by_index[i] for i in sorted(by_index)]
        return strategy, params, executors, pool


class DefineByRun:
    """The define-by-run space as a picklable callable (Tune checkpoints its searcher); it returns
    the Optuna trial number as a constant of the config (``OPTUNA_TRIAL_KEY``)."""

    def __init__(self, space: SearchSpace, ctx: SpaceContext) -> None:
        self.space, self.ctx = space, ctx

    def __call__(self, trial: Any) -> dict[str, Any]:
        self.space.define(trial, self.ctx)
        return {OPTUNA_TRIAL_KEY: trial.number}


def load_search_space(directory: str | Path = "search_spaces") -> SearchSpace:
    """Reads every *.yaml in ``directory`` (``project_path``); strategies and params are checked against
    the registries."""
    folder = project_path(directory)
    if not folder.is_dir():
        raise UserError(f"search space folder {directory} not found; run from the project root or set "
                        "search_spaces in the conf file (--conf)")
    strategies: dict[str, dict[str, Dim]] = {}
    executors: dict[str, dict[str, Dim]] = {}
    pool: dict[str, Dim] = {}
    for path in sorted(folder.glob("*.yaml")):
        where = str(path)
        raw = read_yaml_mapping(path, "a search space file", "search_spaces/data_parallel.yaml")
        unknown = sorted(set(raw) - {"family", "strategies", "executors", "pool", "objective"})
        if unknown:
            raise UserError(f"{path}: unknown key {unknown[0]!r}; valid: family, strategies, executors, pool")
        for name, dims in (raw.get("strategies") or {}).items():
            if name not in strategy_names():
                raise UserError(f"{path}: strategy {name!r} is not registered; valid: "
                                f"{', '.join(sorted(strategy_names()))}")
            declared = get_strategy(name).params
            dims = dims or {}
            bad = sorted(set(dims) - set(declared))
            if bad:
                raise UserError(f"{path}: strategy {name} has no parameter {bad[0]!r}; valid: "
                                f"{', '.join(declared) or 'none'}")
            parsed = {p: parse_dim(d, f"{name}.{p}", where) for p, d in dims.items()}
            for p, dim in parsed.items():
                _check_fits(dim, declared[p], f"{where}: {name}")
            strategies[name] = parsed
            _check_gates(parsed, name, where)
        for kind, dims in (raw.get("executors") or {}).items():
            if kind not in EXECUTOR_KINDS:
                raise UserError(f"{path}: executor kind {kind!r} is not one of {', '.join(EXECUTOR_KINDS)}")
            applicable = EXECUTOR_KINDS[kind].params
            bad = sorted(set(dims or {}) - set(applicable))
            if bad:
                raise UserError(f"{path}: executors.{kind} has no parameter {bad[0]!r}; valid: {', '.join(applicable)}")
            executors[kind] = {}
            for p, d in (dims or {}).items():
                dim = _plain(parse_dim(d, f"{kind}.{p}", where), where)
                _check_fits(dim, EXECUTOR_PARAMS[p], f"{where}: executors.{kind}")
                executors[kind][p] = dim
        for name, dim in (raw.get("pool") or {}).items():
            if name not in POOL_DIMS:
                raise UserError(f"{path}: pool has no dimension {name!r}; valid: {', '.join(POOL_DIMS)}")
            pool[name] = _plain(parse_dim(dim, f"pool.{name}", where), where)
    if BASELINE not in strategies:
        from autohet.tuning.dims import PoolIndexDim

        strategies[BASELINE] = {"executor": PoolIndexDim("executor")}
    return SearchSpace(strategies, executors, pool)
