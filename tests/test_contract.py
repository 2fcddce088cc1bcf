"""The contract every registered strategy passes (parametrised over the registry)."""

from __future__ import annotations

import numpy as np
import pytest

from autohet.errors import UserError
from autohet.models import ModelSpec
from autohet.params import Param
from autohet.pool import VirtualPool
from autohet.run import RunContext, run_strategy
from autohet.strategies import STRATEGIES, Strategy, get_strategy
from autohet.workload import Workload, WorkloadSpec
from tests.conftest import sim_pool_spec

THROUGHPUT = [n for n in STRATEGIES if get_strategy(n).objective == "throughput"]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_registry_entry_is_a_strategy_with_declared_params(name):
    strategy = get_strategy(name)
    assert isinstance(strategy, Strategy)
    assert strategy.name == name
    assert strategy.family
    assert strategy.objective in ("throughput", "latency")
    assert all(isinstance(p, Param) and p.name == k for k, p in strategy.params.items())
    defaults = strategy.validate({})
    assert set(defaults) == set(strategy.params)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_unknown_parameter_is_an_error_listing_the_valid_ones(name):
    strategy = get_strategy(name)
    with pytest.raises(UserError) as info:
        strategy.validate({"no_such_param": 1})
    message = str(info.value)
    assert "no_such_param" in message
    for param in strategy.params:
        assert param in message


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_out_of_range_values_are_rejected(name):
    strategy = get_strategy(name)
    for param in strategy.params.values():
        if param.kind in ("int", "float") and param.low is not None:
            with pytest.raises(UserError, match="out of range"):
                strategy.validate({param.name: param.low - 1})


def test_unknown_strategy_lists_the_registry():
    with pytest.raises(UserError) as info:
        get_strategy("round_robin")
    for name in STRATEGIES:
        assert name in str(info.value)


@pytest.mark.parametrize("name", THROUGHPUT)
def test_strategy_run_on_simulated_pool_is_complete_checked_and_labelled(name):
    workload = Workload.from_spec(WorkloadSpec(3000, (1, 28, 28)))
    pool = VirtualPool(sim_pool_spec([1000.0, 2500.0], [0.002, 0.001]))
    m = run_strategy(name, {}, pool, RunContext(ModelSpec("lenet"), workload))
    assert m.output_ok, m.failures
    assert m.simulated is True
    assert sum(e.images for e in m.executors) == 3000
    assert m.throughput_ips > 0 and m.limit_ips > 0
    assert m.efficiency == pytest.approx(m.throughput_ips / m.limit_ips)
    assert sum(u.size for u in m.timeline) == 3000
    starts = sorted((u.start_image, u.size) for u in m.timeline)
    assert [s for s, _ in starts] == list(np.cumsum([0] + [z for _, z in starts[:-1]]))
    losses = m.losses()  # the profile of the gap to the limit accounts for all of it
    assert set(losses) == {e.name for e in m.executors}
    assert sum(sum(parts.values()) for parts in losses.values()) == pytest.approx(m.waste, abs=1e-9)
    idle = [e.name for e in m.executors if e.images == 0]
    assert all(losses[name]["before"] > 0 and losses[name]["slow"] == 0 for name in idle)
