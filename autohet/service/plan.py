"""Which replicas serve a config, what each loads and what Ray resources it claims (no Ray here).

- throughput, data-parallel: one replica per executor the config uses (``autohet.load(config,
  executor=i)``); the green-context partitions of one GPU share one replica (they must share a
  process), each idle partition taking the next batch (``fifo`` of one batch). The service's router
  replaces the tuned scheduler: it shares requests by each replica's speed (``routing.share``).
- throughput, engine families (placement, split, coedge, channels, pipeline): one replica holding
  the whole ``autohet.load(config)`` runner.
- latency: one replica holding ``autohet.load(config)``, each request on the tuned batch-1 path,
  without dynamic batching.

A replica's speed is the sum of its executors' standalone img/s that the tune exported
(``measured.executor_ips``); where the config has none and the service has several replicas,
each replica measures itself once at warm-up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autohet.config import RunConfig
from autohet.core.errors import UserError

__all__ = ["ReplicaSpec", "plan_replicas", "replica_load"]

WHOLE = "whole"  # autohet.load(config)
EXECUTOR = "executor"  # autohet.load(config, executor=i)
PARTITIONS = "partitions"  # the partitions of one GPU, one batch at a time to the idle one


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica: its deployment ``name``, the config's ``executors`` it runs (indices), ``how`` it
    loads them, whether requests are batched, the cores and GPUs it claims, the node it must run on
    (a pool file's ``node:``, None: anywhere), its exported speed (None: unknown) and whether it
    measures its speed at warm-up (the router needs one and the config has none)."""

    name: str
    executors: tuple[int, ...]
    how: str
    batching: bool
    cores: int
    gpus: int
    node: str | None
    speed_ips: float | None
    measure: bool

    def describe(self, config: RunConfig) -> str:
        names = ", ".join(config.pool.executors[i].device for i in self.executors)
        return f"{self.name} ({names})"


def plan_replicas(config: RunConfig, where: str) -> list[ReplicaSpec]:
    """The config's replicas; one line (UserError) for a config the service cannot run."""
    from autohet.core.objectives import ObjectiveSet
    from autohet.strategies import get_strategy

    strategy = get_strategy(config.strategy)
    mode = ObjectiveSet.parse(config.objective).mode
    if mode not in strategy.modes:
        raise UserError(f"{where}: strategy {config.strategy} does not serve {mode} configs; re-export the config")
    executors = config.pool.executors
    if mode.per_request or strategy.family != "data_parallel":
        return [_replica(config, "runner", tuple(range(len(executors))), WHOLE, not mode.per_request, False, where)]
    if strategy.one_executor:
        index = int({**config.params, **config.plan}.get("executor", 0))
        if not 0 <= index < len(executors):
            raise UserError(f"{where}: single's executor {index} is out of range; the pool has {len(executors)}")
        used = [index]
    else:
        used = list(range(len(executors)))
    groups = [tuple(i for i in group if i in used) for group in config.pool.partition_groups()]
    grouped = {i for group in groups for i in group}
    units = [(i,) for i in used if i not in grouped] + [g for g in groups if g]
    units.sort()
    several = len(units) > 1
    return [_replica(config, "exec-" + "+".join(executors[i].name for i in unit), unit,
                     EXECUTOR if len(unit) == 1 else PARTITIONS, True, several, where) for unit in units]


def _replica(config: RunConfig, name: str, unit: tuple[int, ...], how: str, batching: bool, routed: bool,
             where: str) -> ReplicaSpec:
    executors = [config.pool.executors[i] for i in unit]
    nodes = {e.node for e in executors if e.node is not None}
    if len(nodes) > 1:
        raise UserError(f"{where}: {config.strategy} runs one input over devices on several Ray nodes "
                        f"({', '.join(sorted(nodes))}); the service serves one node's devices per replica: "
                        "tune a config of one node's devices")
    gpus = len({(e.node, e.gpu) for e in executors if e.is_gpu}) + sum(
        1 for e in executors if not e.is_gpu and e.uses_gpu)
    speeds = config.measured.get("executor_ips") or {}
    known = [speeds.get(e.name) for e in executors]
    speed = float(sum(known)) if all(isinstance(v, int | float) and v > 0 for v in known) else None
    return ReplicaSpec(name=re.sub(r"[^A-Za-z0-9_+-]", "_", name), executors=unit, how=how, batching=batching,
                       cores=sum(len(e.pinned_cores) for e in executors), gpus=gpus,
                       node=next(iter(nodes), None), speed_ips=speed, measure=routed and speed is None)


def replica_load(config: RunConfig, spec: ReplicaSpec) -> tuple[RunConfig, dict[str, Any]]:
    """What the replica passes to ``autohet.load``: a config and keyword arguments."""
    if spec.how == WHOLE:
        return config, {}
    if spec.how == EXECUTOR:
        return config, {"executor": spec.executors[0]}
    from dataclasses import replace

    pool = replace(config.pool, executors=[config.pool.executors[i] for i in spec.executors], auto={})
    return replace(config, pool=pool, strategy="fifo", params={"c": 1, "unit": "batches"}, plan={}), {}
