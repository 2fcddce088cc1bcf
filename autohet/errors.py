"""The one exception type the CLI turns into a one-line message and a non-zero exit."""

from __future__ import annotations

__all__ = ["RunTimeout", "UserError", "unknown_name"]


class UserError(Exception):
    """Bad input from the user: the message says what was wrong and how to fix it."""


class RunTimeout(UserError):
    """A run passed its time limit (a hopeless trial, e.g. a huge unit on a slow CPU group).

    ``busy`` lists the executors still working on a unit: their actors must be replaced before the
    next run, or that run would queue behind the abandoned work.
    """

    def __init__(self, message: str, busy: list[int]) -> None:
        super().__init__(message)
        self.busy = busy


def unknown_name(kind: str, name: str, valid: list[str] | tuple[str, ...]) -> UserError:
    """An error for an unknown registry key that lists the valid keys."""
    return UserError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")
