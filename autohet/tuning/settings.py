"""Tune settings: conf/*.yaml defaults, overridden by command-line options."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from autohet.core.errors import UserError
from autohet.core.objectives import ObjectiveSet
from autohet.core.yaml_files import project_path, read_yaml_mapping

__all__ = ["TuneSettings", "load_settings"]


@dataclass
class TuneSettings:
    objective: str = "throughput"
    trials: int = 30
    time_budget_s: float = 600.0
    seed: int = 0
    pool: str = "actors/auto.yaml"
    strategies: str | list[str] = "all"
    tracking_uri: str | None = None
    experiment: str | None = None
    images: int | str = "auto"
    target_trial_seconds: float = 3.0
    min_images: int = 32
    max_images: int | str = "auto"  # auto: as many as keep a trial's outputs within MAX_OUTPUT_BYTES
    check_images: int = 16
    standalone_seconds: float = 0.5
    search_spaces: str = "search_spaces"
    latency_runs: int = 50
    trial_timeout_s: float | str = "auto"  # auto: max(20 s, 10x the expected run time)
    cut_factor: float = 4.0  # throughput: cut a run longer than this x the fastest valid run so far (0: never)
    finalists: int = 3  # the best distinct configurations measured again by turns before export (0: none)
    final_rounds: int = 2  # ... this many times each
    final_within: float = 0.15  # finalists: ok trials within this fraction of the best trial's figure
    max_temp: float | None = None  # C: a trial whose measured max temperature exceeds it is a violation
    cool_margin_c: float = 5.0  # with max_temp: each trial first waits until max_temp - this ...
    cool_max_s: float = 120.0  # ... for at most this many seconds

    def validate(self) -> TuneSettings:
        self.objective = ObjectiveSet.parse(str(self.objective)).name
        for name in ("trials", "min_images", "check_images", "latency_runs", "final_rounds"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_images != "auto" and (not str(self.max_images).isdigit() or int(self.max_images) < 1):
            raise UserError(f"max_images must be 'auto' or a positive integer, got {self.max_images!r}")
        if int(self.finalists) < 0:
            raise UserError(f"finalists must be 0 (no finals) or more, got {self.finalists}")
        if not 0 <= float(self.final_within) < 1:
            raise UserError(f"final_within must be a fraction from 0 to below 1, got {self.final_within}")
        if float(self.time_budget_s) <= 0:
            raise UserError(f"time budget must be positive seconds, got {self.time_budget_s}")
        if self.images != "auto" and (not str(self.images).isdigit() or int(self.images) < 1):
            raise UserError(f"images must be 'auto' or a positive integer, got {self.images!r}")
        if self.trial_timeout_s != "auto":
            try:
                ok = float(self.trial_timeout_s) > 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise UserError(f"trial_timeout_s must be 'auto' or positive seconds, got {self.trial_timeout_s!r}")
        try:
            ok = float(self.cut_factor) == 0 or float(self.cut_factor) >= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise UserError(f"cut_factor must be 0 (never cut) or at least 1, got {self.cut_factor!r}")
        self._validate_thermal()
        if isinstance(self.strategies, str) and self.strategies != "all":
            self.strategies = [s.strip() for s in self.strategies.split(",") if s.strip()]
        return self

    def _validate_thermal(self) -> None:
        if self.max_temp is not None:
            try:
                self.max_temp = float(self.max_temp)
            except (TypeError, ValueError):
                raise UserError(f"max_temp must be degrees C (or null), got {self.max_temp!r}") from None
            if not 0 < self.max_temp < 150:
                raise UserError(f"max_temp must be between 0 and 150 C, got {self.max_temp:g}")
        for name in ("cool_margin_c", "cool_max_s"):
            try:
                value = float(getattr(self, name))
            except (TypeError, ValueError):
                value = -1.0
            if value < 0:
                raise UserError(f"{name} must be a number of at least 0, got {getattr(self, name)!r}")
            setattr(self, name, value)

    def trial_timeout(self, images: int, limit_ips: float) -> float:
        """Seconds a trial's run may take before it is cut (and its busy executors replaced)."""
        if self.trial_timeout_s != "auto":
            return float(self.trial_timeout_s)
        expected = images / limit_ips if limit_ips > 0 else 60.0
        return max(20.0, 10.0 * expected)

    @property
    def objectives(self) -> ObjectiveSet:
        return ObjectiveSet.parse(self.objective)

    @property
    def strategy_list(self) -> list[str] | None:
        return None if self.strategies == "all" else list(self.strategies)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_settings(path: str | None, overrides: dict[str, Any]) -> TuneSettings:
    """Reads ``path`` (default conf/default.yaml when present) and applies non-None overrides."""
    raw: dict[str, Any] = {}
    file = project_path(path or "conf/default.yaml")
    if path and not file.is_file():
        raise UserError(f"tune conf {file} not found; use conf/default.yaml or your own copy of it")
    if file.is_file():
        raw = read_yaml_mapping(file, "a tune conf", "conf/default.yaml")
    known = {f.name for f in fields(TuneSettings)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"{file}: unknown setting {unknown[0]!r}; valid: {', '.join(sorted(known))}")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return TuneSettings(**raw).validate()
