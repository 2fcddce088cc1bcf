"""Test helpers shipped with autohet, for its own tests and for plug-ins: the contract every
strategy passes, and simulated pools (always labelled simulated).

A plug-in strategy passes the contract with public API only::

    from autohet.testing import StrategyContract

    class TestMyStrategy(StrategyContract):
        strategy_name = "my_strategy"
"""

from __future__ import annotations

from autohet.testing._contract import (
    StrategyContract,
    check_declared_params,
    check_out_of_range_rejected,
    check_real_run,
    check_simulated_run,
    check_unknown_param_lists_valid,
    sim_pool_spec,
)

__all__ = [
    "StrategyContract", "check_declared_params", "check_out_of_range_rejected", "check_real_run",
    "check_simulated_run", "check_unknown_param_lists_valid", "sim_pool_spec",
]
