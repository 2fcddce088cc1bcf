"""Reading the project's YAML files with one-line errors that say where the syntax broke."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autohet.core.errors import UserError

__all__ = ["read_yaml_mapping"]


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
