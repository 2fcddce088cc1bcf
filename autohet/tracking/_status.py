"""What happened to a trial, in one word: the same label in the table, the progress line and MLflow.

``invalid`` means one thing: the trial ran and its outputs failed the check against the
single-device reference. A trial stopped for taking too long is ``cut``; one not run because it
could not finish in time or its parameters do not fit the pool is ``refused``; ``violation``
exceeded a bound such as ``--max-temp``; ``error`` crashed; ``killed`` was running when the tune
was killed (recorded by the resume, not counted in the trial budget).
"""

from __future__ import annotations

__all__ = ["FINISHED", "STATUSES"]

STATUSES = ("ok", "invalid", "cut", "refused", "violation", "error", "killed")
FINISHED = frozenset(s for s in STATUSES if s != "killed")  # these count towards the trial budget
