"""Pool files (actors/*.yaml): the executors of a run, declared explicitly or detected (``auto``).

An explicit file lists executors::

    version: 1
    executors:
      - {name: cpu0, kind: cpu, cores: [0], batch: 64}
      - {name: gpu0, kind: gpu, gpu: 0, cores: [2], batch: 256, precision: fp16}

``auto`` detects the machine (or every node of a Ray cluster): one executor per GPU with one
core reserved to feed it, the remaining cores in CPU groups of ``cpu_group_size`` (``all``: one
group). Its default, ``auto``, is one core per group on a CPU-only node (the seed's per-core
executors) and groups of four next to a GPU: there a one-core group adds next to nothing to the GPU's
throughput while its actor costs seconds to start and measure (docs/why.md, pool/spec.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from autohet.core.errors import UserError
from autohet.core.params import validate_params
from autohet.core.settings import GPU_BOX_GROUP
from autohet.core.yaml_files import project_path, read_yaml_mapping
from autohet.executors.base import EXECUTOR_PARAMS, ExecutorSpec
from autohet.executors.kinds import EXECUTOR_KINDS

__all__ = ["GPU_BOX_GROUP", "POOL_DIMS", "POOL_VERSION", "PoolSpec", "detect_executors", "load_pool"]

POOL_VERSION = 1
_EXECUTOR_KEYS = {"name", "kind", "cores", "gpu", "node", "speed_ips", "overhead_s", "needs_gpu",
                  "die_after_units"} | set(EXECUTOR_PARAMS)
_AUTO_KEYS = {"cpu_group_size", "reserve_core_per_gpu", "cpu", "gpu", "max_cpu_groups", "gpu_partitions"}
POOL_DIMS = ("cpu_group_size", "max_cpu_groups", "gpu_partitions")  # auto settings a tune may search


@dataclass
class PoolSpec:
    """The executors of a run and where they came from."""

    name: str
    executors: list[ExecutorSpec]
    source: str = "inline"
    auto: dict[str, Any] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return any(e.simulated for e in self.executors)

    @property
    def gpus_needed(self) -> int:
        return sum(1 for e in self.executors if e.is_gpu)

    def partition_groups(self) -> list[list[int]]:
        """Executor indices that must share a process: the green-context partitions (``sms``) of one
        GPU of one node (kernels of different processes time-slice a GPU instead of sharing it)."""
        groups: dict[tuple, list[int]] = {}
        for i, e in enumerate(self.executors):
            if e.is_gpu and e.sms:
                groups.setdefault((e.node, e.gpu), []).append(i)
        return list(groups.values())

    def to_dict(self) -> dict[str, Any]:
        return {"version": POOL_VERSION, "name": self.name, "source": self.source,
                "executors": [e.to_dict() for e in self.executors]}

    def with_executor_params(self, by_kind: dict[str, dict[str, Any]]) -> PoolSpec:
        """A copy whose executors take ``by_kind[kind]`` params (e.g. {'gpu': {'batch': 256}})."""
        execs = [e.with_params(by_kind.get(e.kind, {})) for e in self.executors]
        return PoolSpec(self.name, execs, self.source, self.auto)


def _executor(raw: Any, index: int, where: str) -> ExecutorSpec:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: executor #{index} must be a mapping like {{name: cpu0, kind: cpu, cores: [0]}}")
    unknown = sorted(set(raw) - _EXECUTOR_KEYS)
    if unknown:
        raise UserError(f"{where}: executor #{index} has unknown key {unknown[0]!r}; valid: "
                        f"{', '.join(sorted(_EXECUTOR_KEYS))}")
    kind = raw.get("kind")
    if kind not in EXECUTOR_KINDS:
        raise UserError(f"{where}: executor #{index} needs kind: one of {', '.join(EXECUTOR_KINDS)} (got {kind!r})")
    kind_type = EXECUTOR_KINDS[kind]
    name = str(raw.get("name") or f"{kind}{index}")
    foreign = [k for k in EXECUTOR_PARAMS if k in raw and k not in kind_type.params]
    if foreign:
        raise UserError(f"{where}: executor {name}: {foreign[0]} does not apply to {kind} executors; valid for "
                        f"them: {', '.join(kind_type.params)}")
    params = validate_params(f"{where}: executor {name}", EXECUTOR_PARAMS,
                             {k: raw[k] for k in EXECUTOR_PARAMS if k in raw})
    params["sms"] = params["sms"] or None
    params["streams"] = params["streams"] or None
    cores = raw.get("cores", [])
    if isinstance(cores, int):
        cores = [cores]
    if not isinstance(cores, list) or not all(isinstance(c, int) and c >= 0 for c in cores):
        raise UserError(f"{where}: executor {name}: cores must be a list of core numbers, e.g. [0, 1]")
    kind_type.check_cores(cores, f"{where}: executor {name}")
    gpu = kind_type.parse_gpu(raw, f"{where}: executor {name}")
    extra = {"die_after_units": raw["die_after_units"]} if "die_after_units" in raw else {}
    try:
        speed = float(raw.get("speed_ips", 0.0))
        overhead = float(raw.get("overhead_s", 0.0))
    except (TypeError, ValueError):
        raise UserError(f"{where}: executor {name}: speed_ips and overhead_s must be numbers") from None
    kind_type.check_speed(speed, where, name)
    return ExecutorSpec(name=name, kind=kind, cores=tuple(cores), gpu=gpu,
                        node=None if raw.get("node") is None else str(raw["node"]),
                        speed_ips=speed, overhead_s=overhead, needs_gpu=bool(raw.get("needs_gpu", False)),
                        extra=extra, **params)


def detect_executors(cores: list[int], gpus: int, settings: dict[str, Any], node: str | None = None,
                     prefix: str = "", sm_shares: list[int] | None = None) -> list[ExecutorSpec]:
    """One executor per GPU (with a feeding core), or ``gpu_partitions`` executors per GPU on disjoint
    equal shares of its SMs (``sm_shares``: each GPU's SMs per partition, ``green.equal_share``); the
    rest of the cores in CPU groups."""
    group = settings.get("cpu_group_size", "auto")
    if group == "auto":
        group = GPU_BOX_GROUP if gpus else 1
    if group != "all" and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
        raise UserError(f"cpu_group_size must be auto, all or a whole number of cores >= 1, got {group!r}")
    free = list(cores)
    gpu_params = validate_params("auto: gpu", EXECUTOR_PARAMS, settings.get("gpu") or {})
    cpu_params = validate_params("auto: cpu", EXECUTOR_PARAMS, settings.get("cpu") or {})
    parts = settings.get("gpu_partitions", 1)
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise UserError(f"gpu_partitions must be a whole number >= 1, got {parts!r}")
    if parts > 1 and gpus and (not sm_shares or len(sm_shares) < gpus):
        raise UserError("gpu_partitions needs each GPU's SM count (local GPUs only); set gpu_partitions: 1 on a "
                        "cluster, or list partitions with sms: in a pool file")
    out: list[ExecutorSpec] = []
    for g in range(gpus):
        for k in range(parts):
            feed = (free.pop(0),) if settings.get("reserve_core_per_gpu", True) and len(free) > 1 else ()
            name = f"{prefix}gpu{g}" + (f"p{k}" if parts > 1 else "")
            params = {**gpu_params, "sms": sm_shares[g] if parts > 1 else gpu_params.get("sms")}
            out.append(ExecutorSpec(name, "gpu", feed, g, node=node, **params))
    limit = settings.get("max_cpu_groups")
    limit = None if limit == "all" else limit  # every group (a tune's pool dim names it so)
    if group == "all":  # one group of every core the GPUs leave: a backend's streams spread over them all
        group = max(1, len(free))
    for k, first in enumerate(range(0, len(free), group)):
        if limit is not None and k >= int(limit):
            break
        chunk = tuple(free[first : first + group])
        out.append(ExecutorSpec(f"{prefix}cpu{k}", "cpu", chunk, node=node, **cpu_params))
    return out


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _local_sm_shares(parts: int) -> list[int]:
    from autohet.executors.green import equal_share

    return [equal_share(i, parts) for i in range(_local_gpus())]


def load_pool(path: str | None, auto_overrides: dict[str, Any] | None = None) -> PoolSpec:
    """Reads a pool file; ``None`` or 'auto' means actors/auto.yaml semantics on this machine."""
    raw: dict[str, Any]
    if path in (None, "auto"):
        raw, where = {"version": POOL_VERSION, "auto": {}}, "auto"
        name = "auto"
    else:
        file = project_path(path)
        where = str(file)
        if not file.is_file():
            raise UserError(f"pool file {file} not found; use actors/auto.yaml, actors/cpu2.yaml or your own")
        raw = read_yaml_mapping(file, "a pool file", "actors/cpu2.yaml")
        name = file.stem
    if not isinstance(raw, dict):
        raise UserError(f"{where}: a pool file is a mapping with 'executors:' or 'auto:'")
    version = raw.get("version", POOL_VERSION)
    if version != POOL_VERSION:
        raise UserError(f"{where}: pool version {version} is not supported; this autohet reads version "
                        f"{POOL_VERSION}")
    unknown = sorted(set(raw) - {"version", "executors", "auto", "name"})
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; a pool file has version, name, executors or auto")
    if ("executors" in raw) == ("auto" in raw):
        raise UserError(f"{where}: give either 'executors:' (a list) or 'auto:' (settings), not both or neither")
    if "auto" in raw:
        settings = dict(raw.get("auto") or {})
        settings.update(auto_overrides or {})
        bad = sorted(set(settings) - _AUTO_KEYS)
        if bad:
            raise UserError(f"{where}: auto has no setting {bad[0]!r}; valid: {', '.join(sorted(_AUTO_KEYS))}")
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
            range(os.cpu_count() or 1))
        parts = settings.get("gpu_partitions", 1)
        execs = detect_executors(cores, _local_gpus(), settings,
                                 sm_shares=_local_sm_shares(parts) if parts not in (None, 1) else None)
        return PoolSpec(raw.get("name", name), execs, where, auto=settings)
    items = raw["executors"]
    if not isinstance(items, list) or not items:
        raise UserError(f"{where}: executors must be a non-empty list")
    execs = [_executor(item, i, where) for i, item in enumerate(items)]
    names = [e.name for e in execs]
    if len(set(names)) != len(names):
        raise UserError(f"{where}: executor names must be unique, got {names}")
    return PoolSpec(raw.get("name", name), execs, where)


def check_local_devices(spec: PoolSpec) -> None:
    """Fails early, in one line, when a pool asks for GPUs or cores this machine does not have."""
    need = [e for e in spec.executors if e.is_gpu and e.node is None]
    if need:
        have = _local_gpus()
        missing = [e for e in need if (e.gpu or 0) >= have]
        if missing:
            raise UserError(f"pool {spec.source} asks for GPU {missing[0].gpu} ({missing[0].name}) but this "
                            f"machine has {have} CUDA GPUs; use actors/cpu2.yaml or actors/auto.yaml")
    ncpu = os.cpu_count() or 1
    for e in spec.executors:
        bad = [c for c in e.cores if c >= ncpu]
        if e.node is None and bad:
            raise UserError(f"pool {spec.source}: executor {e.name} pins core {bad[0]} but this machine has "
                            f"{ncpu} cores (0-{ncpu - 1}); fix cores or use actors/auto.yaml")
