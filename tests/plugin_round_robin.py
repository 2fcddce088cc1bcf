"""A correct plug-in scheduler written against autohet's public API only: equal chunks of ``c``
images to the idle executors in turn. It passes the shipped contract (tests/test_contract.py)."""

from __future__ import annotations

from typing import Any

from autohet.core.params import IntParam
from autohet.strategies import DataParallelStrategy, SchedState, register_strategy


class RoundRobin(DataParallelStrategy):
    name = "round_robin"
    params = {"c": IntParam("c", 32, low=1, high=100000, help="images per chunk")}

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> list[tuple[int, int]]:
        return [(i, params["c"]) for i in idle]


register_strategy("round_robin", "tests.plugin_round_robin:RoundRobin")
