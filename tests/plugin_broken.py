"""A test plug-in strategy that is fast because it is wrong: it skips half the images.

Used to show that a trial whose outputs fail the check is recorded invalid and never exported.
It uses public API only, as an outside plug-in would.
"""

from __future__ import annotations

from typing import Any

from autohet.strategies import FifoScheduler, SchedState, register_strategy


class BrokenFifo(FifoScheduler):
    name = "broken"

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> list[tuple[int, int]]:
        if state.remaining <= state.total // 2:  # pretends the second half was done
            state.remaining = 0
            return []
        return super().assign(state, idle, params)


register_strategy("broken", "tests.plugin_broken:BrokenFifo")
