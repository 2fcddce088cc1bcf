"""The one exception type the CLI turns into a one-line message and a non-zero exit."""

from __future__ import annotations

__all__ = ["UserError", "unknown_name"]


class UserError(Exception):
    """Bad input from the user: the message says what was wrong and how to fix it."""


def unknown_name(kind: str, name: str, valid: list[str] | tuple[str, ...]) -> UserError:
    """An error for an unknown registry key that lists the valid keys."""
    return UserError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")
