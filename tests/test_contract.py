"""The contract every registered strategy passes (parametrised over the registry), from the suite
shipped in ``autohet.testing``; and a plug-in written with public API only passes it too."""

from __future__ import annotations

import pytest

from autohet.core.errors import UserError
from autohet.strategies import STRATEGIES, get_strategy
from autohet.testing import (
    StrategyContract,
    check_declared_params,
    check_out_of_range_rejected,
    check_real_run,
    check_simulated_run,
    check_unknown_param_lists_valid,
)

NAMES = list(STRATEGIES)


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_is_a_strategy_with_declared_params(name):
    check_declared_params(name)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameter_is_an_error_listing_the_valid_ones(name):
    check_unknown_param_lists_valid(name)


@pytest.mark.parametrize("name", NAMES)
def test_out_of_range_values_are_rejected(name):
    check_out_of_range_rejected(name)


@pytest.mark.parametrize("name", NAMES)
def test_run_on_simulated_executors_is_complete_checked_and_labelled_or_refused(name):
    check_simulated_run(name)


@pytest.mark.parametrize("name", NAMES)
def test_real_run_on_two_cpu_groups_matches_the_reference(name):
    check_real_run(name)


def test_unknown_strategy_lists_the_registry():
    with pytest.raises(UserError) as info:
        get_strategy("round_robin_nope")
    for name in NAMES:
        assert name in str(info.value)


def test_the_suite_catches_a_wrong_strategy():
    """The shipped contract fails a strategy whose outputs are wrong (it can fail)."""
    import tests.plugin_broken  # noqa: F401  (registers "broken")

    with pytest.raises(AssertionError, match="not processed exactly once"):
        check_simulated_run("broken")


class TestRoundRobinPlugin(StrategyContract):
    """tests/plugin_round_robin.py uses public API only and passes the whole suite."""

    strategy_name = "round_robin"

    @pytest.fixture(autouse=True)
    def _registered(self):
        import tests.plugin_round_robin  # noqa: F401
