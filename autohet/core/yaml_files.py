"""Reading the project's YAML files with one-line errors that say where the syntax broke, and finding them
from another folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autohet.core.errors import UserError

__all__ = ["PROJECT_ROOT", "project_path", "read_yaml_mapping"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The checkout autohet runs from: its conf/, actors/ and search_spaces/ sit here."""


def project_path(path: str | Path) -> Path:
    """``path`` as given where it exists (or is absolute), else the project's own file of that relative
    name where that exists: ``autohet tune`` run from another folder still finds the default conf, pool
    and search space files (a bench's working folder, a user's data folder)."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    own = PROJECT_ROOT / given
    return own if own.exists() else given


def read_yaml_mapping(path: Path, what: str, example: str) -> dict[str, Any]:
    """The file's top-level mapping ({} when empty); bad syntax or another type is a UserError."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        at = f" at line {line + 1}" if line is not None else ""
        raise UserError(f"{path} is not valid YAML{at}; fix the syntax (see {example})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: {what} is a YAML mapping (see {example})")
    return raw
