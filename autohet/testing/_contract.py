"""The strategy contract: what every registered strategy, built in or plug-in, must do.

Each check is a plain function (usable with ``pytest.mark.parametrize`` over the registry);
``StrategyContract`` bundles them as a test class a plug-in subclasses.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from autohet.context import RunContext
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.objectives import RUN_MODES, RunMode
from autohet.core.params import FloatParam, IntParam, Param
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec
from autohet.pool import LocalPool, PoolSpec, VirtualPool
from autohet.strategies import Strategy, get_strategy
from autohet.strategy_run import run_strategy

__all__ = ["StrategyContract", "check_declared_params", "check_out_of_range_rejected", "check_real_run",
           "check_simulated_run", "check_unknown_param_lists_valid", "sim_pool_spec"]


def sim_pool_spec(speeds: list[float], overheads: list[float] | None = None, batch: int = 16) -> PoolSpec:
    """SIMULATED executors with the given speeds (images/s) and per-unit overheads (s)."""
    overheads = overheads or [0.0] * len(speeds)
    return PoolSpec("sim", [ExecutorSpec(f"sim{i}", "sim", batch=batch, speed_ips=s, overhead_s=o)
                            for i, (s, o) in enumerate(zip(speeds, overheads, strict=True))])


def check_declared_params(name: str) -> None:
    """A Strategy under its registry name, with a family, run modes and declared parameters."""
    strategy = get_strategy(name)
    assert isinstance(strategy, Strategy)
    assert strategy.name == name
    assert strategy.family
    assert strategy.modes and set(strategy.modes) <= set(RUN_MODES)
    assert all(isinstance(p, Param) and p.name == k for k, p in strategy.params.items())
    assert set(strategy.validate({})) == set(strategy.params)


def check_unknown_param_lists_valid(name: str) -> None:
    strategy = get_strategy(name)
    try:
        strategy.validate({"no_such_param": 1})
    except UserError as exc:
        message = str(exc)
    else:
        raise AssertionError(f"{name} accepted an unknown parameter")
    assert "no_such_param" in message
    for param in strategy.params:
        assert param in message, f"{name}: the error does not list {param}"


def check_out_of_range_rejected(name: str) -> None:
    strategy = get_strategy(name)
    for param in strategy.params.values():
        if isinstance(param, IntParam | FloatParam) and param.low is not None:
            try:
                strategy.validate({param.name: param.low - 1})
            except UserError as exc:
                assert "out of range" in str(exc)
            else:
                raise AssertionError(f"{name}: {param.name} = {param.low - 1} was accepted")


def check_simulated_run(name: str) -> None:
    """Throughput strategies on the pool's executors: every image once, checked, labelled simulated;
    the profile of the gap to the limit accounts for all of it. Engine strategies refuse simulated
    executors in one line (they run the real model)."""
    strategy = get_strategy(name)
    workload = Workload.from_spec(WorkloadSpec(3000, (1, 28, 28)))
    pool = VirtualPool(sim_pool_spec([1000.0, 2500.0], [0.002, 0.001]))
    ctx = RunContext(ModelSpec("lenet"), workload)
    if strategy.on_engine or RunMode.THROUGHPUT not in strategy.modes:
        try:
            run_strategy(name, {}, pool, RunContext(ModelSpec("lenet"), workload, mode=strategy.modes[0]))
        except UserError as exc:
            assert "\n" not in str(exc)
            return
        raise AssertionError(f"{name} ran on simulated executors")
    m = run_strategy(name, {}, pool, ctx)
    assert m.output_ok, m.failures
    assert m.simulated is True
    assert sum(e.images for e in m.executors) == 3000
    assert m.throughput_ips > 0 and m.limit_ips > 0
    assert abs(m.efficiency - m.throughput_ips / m.limit_ips) < 1e-9
    assert m.efficiency <= 1.0 + 1e-9, f"{name}: efficiency {m.efficiency} above the limit"
    assert sum(u.size for u in m.timeline) == 3000
    starts = sorted((u.start_image, u.size) for u in m.timeline)
    assert [s for s, _ in starts] == list(np.cumsum([0] + [z for _, z in starts[:-1]]))
    losses = m.losses()
    assert set(losses) == {e.name for e in m.executors}
    assert abs(sum(sum(parts.values()) for parts in losses.values()) - m.waste) < 1e-9


def check_real_run(name: str, pool_file: str = "actors/cpu2.yaml", model: str = "lenet") -> None:
    """The real model on a CPU pool in each run mode the strategy serves: outputs match the
    single-device reference; a latency run reports percentiles and no made-up limit."""
    from autohet.pool import load_pool

    strategy = get_strategy(name)
    for mode in strategy.modes:
        workload = Workload.from_spec(WorkloadSpec(256, (1, 28, 28) if model == "lenet" else (3, 32, 32)))
        pool = LocalPool(load_pool(pool_file))
        ctx = RunContext(ModelSpec(model), workload, standalone_seconds=0.05, mode=mode, latency_runs=8,
                         check_images=16)
        try:
            m = run_strategy(name, {}, pool, ctx)
        finally:
            pool.shutdown()
        assert m.output_ok, f"{name} ({mode}): {m.failures}"
        assert not m.simulated
        if mode.per_request:
            assert m.latency_ms["p50"] > 0 and m.limit_ips is None and m.efficiency is None
        else:
            assert m.throughput_ips > 0 and m.limit_ips is not None and m.limit_ips > 0


class StrategyContract:
    """Subclass with ``strategy_name`` set; pytest collects these checks for that strategy."""

    strategy_name: ClassVar[str]

    def test_declared_params(self) -> None:
        check_declared_params(self.strategy_name)

    def test_unknown_param_lists_valid(self) -> None:
        check_unknown_param_lists_valid(self.strategy_name)

    def test_out_of_range_rejected(self) -> None:
        check_out_of_range_rejected(self.strategy_name)

    def test_simulated_run(self) -> None:
        check_simulated_run(self.strategy_name)

    def test_real_run(self) -> None:
        check_real_run(self.strategy_name)
