"""The one exception type the CLI turns into a one-line message and a non-zero exit."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Interrupted", "RunTimeout", "UserError", "last_line", "unknown_name"]


class Interrupted(BaseException):
    """SIGINT or SIGTERM: the command stops, shuts Ray down and exits 128 + the signal number.
    A BaseException, like KeyboardInterrupt, so ``except Exception`` blocks do not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class UserError(Exception):
    """Bad input from the user: the message says what was wrong and how to fix it."""


class RunTimeout(UserError):
    """A run passed its time limit (a hopeless trial, e.g. a huge unit on a slow CPU group).

    ``busy`` lists the executors still working on a unit: their actors must be replaced before the
    next run, or that run would queue behind the abandoned work. ``settle(seconds)``, where the run's
    dispatcher can wait for work it already sent, waits up to that long and names those still busy
    after it: an executor whose last parts finish within it need not be replaced (a fresh actor costs
    seconds: starting, building the model, warming every shape).
    """

    def __init__(self, message: str, busy: list[int], settle: Callable[[float], list[int]] | None = None) -> None:
        super().__init__(message)
        self.busy = busy
        self.settle = settle


def unknown_name(kind: str, name: str, valid: list[str] | tuple[str, ...]) -> UserError:
    """An error for an unknown registry key that lists the valid keys."""
    return UserError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")


def last_line(exc: BaseException) -> str:
    """The underlying error's own line (a Ray task error wraps it in a traceback), at most 300 chars."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
