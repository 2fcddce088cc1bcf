"""The exported run config: a versioned YAML file that ``autohet run --config`` loads.

Schema (version 1)::

    autohet_config: 1
    model: {name: lenet, seed: 0, checkpoint: null}
    workload: {images: 10000, seed: 0, npy: null}
    pool: {name: cpu2, executors: [{name: cpu0, kind: cpu, cores: [0], batch: 64, ...}, ...]}
    strategy: fast_split
    objective: throughput                    # or latency (batch-1 p50)
    params: {w_s: 64, r: 0.5, threshold: 100}
    plan: {}                                 # what a planning strategy planned (autohet.load runs it as given)
    preprocess: {resize: 256, mean: [...], std: [...], interpolation: bilinear}   # optional: decoding images
    executor_params: {cpu: {batch: 64}}     # what the tuner chose per executor kind
    platform: {...}                          # fingerprint of the machine it was measured on
    measured: {throughput_ips: ..., efficiency: ..., ...}
    mlflow: {experiment: ..., run_id: ...}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.pool.spec import PoolSpec, _executor

__all__ = ["CONFIG_VERSION", "INTERPOLATIONS", "Preprocess", "RunConfig", "load_config", "write_config"]

CONFIG_VERSION = 1
_KEYS = {"autohet_config", "model", "workload", "pool", "strategy", "objective", "params", "executor_params",
         "platform", "measured", "mlflow", "artifacts", "plan", "preprocess"}
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")


@dataclass(frozen=True)
class Preprocess:
    """How an image file becomes a model input (``autohet run --input``): the shorter side resized to
    ``resize`` pixels, a centre crop of the model's input size, scaled to [0, 1], normalised by
    ``mean`` and ``std`` per channel. Unset fields take the defaults of torchvision's ImageNet weights
    for the model's input size (``autohet.runtime.images``)."""

    resize: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    interpolation: str = "bilinear"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"interpolation": self.interpolation}
        if self.resize is not None:
            out["resize"] = self.resize
        for key in ("mean", "std"):
            if getattr(self, key) is not None:
                out[key] = list(getattr(self, key))
        return out


@dataclass
class RunConfig:
    model: ModelSpec
    pool: PoolSpec
    strategy: str
    params: dict[str, Any]
    images: int = 10000
    workload_seed: int = 0
    npy: str | None = None
    executor_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    platform: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    mlflow: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)
    objective: str = "throughput"
    plan: dict[str, Any] = field(default_factory=dict)
    preprocess: Preprocess | None = None

    def to_dict(self) -> dict[str, Any]:
        pool = self.pool.to_dict()
        pool.pop("version", None)
        return {
            "autohet_config": CONFIG_VERSION,
            "model": self.model.to_dict(),
            "workload": {"images": self.images, "seed": self.workload_seed, "npy": self.npy},
            "pool": pool,
            "strategy": self.strategy,
            "objective": self.objective,
            "params": self.params,
            "plan": self.plan,
            "executor_params": self.executor_params,
            "platform": self.platform,
            "measured": self.measured,
            "mlflow": self.mlflow,
            "artifacts": self.artifacts,
            **({"preprocess": self.preprocess.to_dict()} if self.preprocess is not None else {}),
        }


def write_config(config: RunConfig, path: str | Path) -> Path:
    """Writes atomically (temp file + rename) so a half-written config never looks complete."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    tmp.replace(out)
    return out


def load_config(path: str | Path) -> RunConfig:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"config {file} not found; export one with `autohet tune` or `autohet export`")
    try:
        raw = yaml.safe_load(file.read_text())
    except yaml.YAMLError:
        raise UserError(f"{file} is not valid YAML; re-export it with `autohet export`") from None
    if not isinstance(raw, dict) or "autohet_config" not in raw:
        raise UserError(f"{file} is not an autohet config (no 'autohet_config' version key); "
                        "re-export it with `autohet export`")
    if raw["autohet_config"] != CONFIG_VERSION:
        raise UserError(f"{file} has config version {raw['autohet_config']}; this autohet reads version "
                        f"{CONFIG_VERSION}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise UserError(f"{file}: unknown key {unknown[0]!r}; valid: {', '.join(sorted(_KEYS))}")
    for key in ("model", "pool", "strategy"):
        if key not in raw:
            raise UserError(f"{file}: missing {key!r}; re-export it with `autohet export`")
    model = raw["model"] if isinstance(raw["model"], dict) else {"name": raw["model"]}
    pool_raw = raw["pool"] or {}
    execs = pool_raw.get("executors") if isinstance(pool_raw, dict) else None
    if not isinstance(execs, list) or not execs:
        raise UserError(f"{file}: pool.executors must be a non-empty list")
    pool = PoolSpec(pool_raw.get("name", "config"), [_executor(e, i, str(file)) for i, e in enumerate(execs)],
                    str(pool_raw.get("source") or file))
    workload = raw.get("workload") or {}
    return RunConfig(
        model=ModelSpec(str(model["name"]), int(model.get("seed", 0)), model.get("checkpoint")),
        pool=pool, strategy=str(raw["strategy"]), params=dict(raw.get("params") or {}),
        images=int(workload.get("images", 10000)), workload_seed=int(workload.get("seed", 0)),
        npy=workload.get("npy"), executor_params=dict(raw.get("executor_params") or {}),
        platform=dict(raw.get("platform") or {}), measured=dict(raw.get("measured") or {}),
        mlflow=dict(raw.get("mlflow") or {}), artifacts=dict(raw.get("artifacts") or {}),
        objective=_objective(raw.get("objective", "throughput"), file),
        plan=_mapping(raw, "plan", file), preprocess=_preprocess(raw.get("preprocess"), file),
    )


def _mapping(raw: dict[str, Any], key: str, file: Path) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise UserError(f"{file}: {key} must be a mapping of parameter names to values; re-export it with "
                        "`autohet export`")
    return dict(value)


def _preprocess(raw: Any, file: Path) -> Preprocess | None:
    """The ``preprocess`` block, each field checked (one line naming the field and its fix)."""
    if raw is None:
        return None
    where = f"{file}: preprocess"
    if not isinstance(raw, dict):
        raise UserError(f"{where} must be a mapping (resize, mean, std, interpolation)")
    unknown = sorted(set(raw) - {"resize", "mean", "std", "interpolation"})
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; valid: interpolation, mean, resize, std")
    resize = raw.get("resize")
    if resize is not None and (isinstance(resize, bool) or not isinstance(resize, int) or resize < 1):
        raise UserError(f"{where}.resize must be a positive whole number of pixels (the shorter side), got {resize!r}")
    lists = {}
    for key in ("mean", "std"):
        value = raw.get(key)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise UserError(f"{where}.{key} must be a number or a list of numbers, one per channel; got {value!r}")
        if key == "std" and any(v <= 0 for v in values):
            raise UserError(f"{where}.std must be positive, got {value!r}")
        lists[key] = tuple(float(v) for v in values)
    interpolation = raw.get("interpolation", "bilinear")
    if interpolation not in INTERPOLATIONS:
        raise UserError(f"{where}.interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}")
    return Preprocess(resize, lists.get("mean"), lists.get("std"), interpolation)


def _objective(value: Any, file: Path) -> str:
    from autohet.core.objectives import ObjectiveSet

    try:
        return ObjectiveSet.parse(str(value)).name
    except UserError as exc:
        raise UserError(f"{file}: {exc}") from None
