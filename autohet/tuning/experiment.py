"""A tune's experiment (its name, its folder under runs/, the state a resume reads back) and the pool it
runs on (the spec, the image bank, the manager actor that owns the executors)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.pool import PoolSpec
from autohet.tuning.settings import TuneSettings

__all__ = ["Experiment", "TunePool", "open_experiment"]


def load_state(state_file: Path, tune_dir: Path, experiment: str, model: ModelSpec, resume: bool,
                exp_dir: Path) -> dict[str, Any]:
    if resume:
        if not state_file.is_file():
            raise UserError(f"nothing to resume for experiment {experiment!r} (no {state_file}); "
                            "run `autohet tune` without --resume")
        state = json.loads(state_file.read_text())
        if state["model"] != model.to_dict():
            raise UserError(f"experiment {experiment!r} tuned model {state['model']['name']}; resume it with "
                            f"--model {state['model']['name']} or pick another --experiment")
        return state
    if state_file.is_file():
        raise UserError(f"experiment {experiment!r} already has a tune in {exp_dir}; add --resume to continue "
                        "it or pass --experiment NEW_NAME")
    return {}


@dataclass
class Experiment:
    """Where a tune lives: its name, runs/<name>/, and the state a resume reads back (empty: a new tune)."""

    name: str
    dir: Path
    state: dict[str, Any]

    @property
    def state_file(self) -> Path:
        return self.dir / "tune_state.json"


def open_experiment(model: ModelSpec, settings: TuneSettings, resume: bool) -> Experiment:
    """The experiment's name and directory, and its saved state: a resume's must exist and be this
    model's; a new tune's must not exist yet."""
    name = settings.experiment or model.name.replace(":", "_").replace("/", "_")
    exp_dir = (Path("runs") / name).resolve()
    state = load_state(exp_dir / "tune_state.json", exp_dir / "tune", name, model, resume, exp_dir)
    return Experiment(name, exp_dir, state)


@dataclass
class TunePool:
    """The tune's pool: its spec, the image bank trials draw from, and the manager actor that owns the
    executors (by name: trials find it with ``ray.get_actor``)."""

    spec: PoolSpec
    bank: Any  # ``workload_for``'s bank: ``.bank`` (the images) and ``.shape``
    manager_name: str
    manager: Any
