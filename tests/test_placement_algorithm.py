"""Greedy critical-path placement and correction rounds against made-up per-device times."""

from __future__ import annotations

import pytest

from autohet.core.errors import UserError
from autohet.planners import (
    Problem,
    critical_path,
    decode,
    encode,
    greedy,
    linear_transfer,
    place,
    search_space,
    table_transfer,
)

DEVS = ["cpu", "gpu"]


def _times(table: dict[str, tuple[float, float]]) -> dict[tuple[str, str], float]:
    return {(b, d): t for b, pair in table.items() for d, t in zip(DEVS, pair, strict=True)}


def _diamond() -> Problem:
    """S feeds a heavy branch B1 and a light branch B2 that join in J; no transfer cost."""
    times = _times({"S": (1, 1), "B1": (20, 10), "B2": (6, 5), "J": (1, 1)})
    edges = [("input", "S"), ("S", "B1"), ("S", "B2"), ("B1", "J"), ("B2", "J")]
    return Problem(["S", "B1", "B2", "J"], edges, DEVS, times)


def test_critical_path_takes_the_most_expensive_branch() -> None:
    assert critical_path(_diamond()) == ["S", "B1", "J"]


def test_critical_path_forces_a_block_off_its_fastest_device() -> None:
    problem = _diamond()
    assign = greedy(problem)
    # B2 alone is fastest on the gpu (5 < 6), but the gpu is busy with the critical B1
    assert problem.times[("B2", "gpu")] < problem.times[("B2", "cpu")]
    assert assign["B1"] == "gpu"
    assert assign["B2"] == "cpu"
    assert problem.makespan(assign) == pytest.approx(12.0)
    assert problem.makespan(dict.fromkeys(problem.blocks, "gpu")) == pytest.approx(17.0)


def _chain(latency: float) -> Problem:
    times = _times({"A": (1, 5), "B": (3, 2), "C": (1, 5)})
    edges = [("input", "A"), ("A", "B"), ("B", "C")]
    bytes_ = {("A", "B"): 1000, ("B", "C"): 1000}
    return Problem(["A", "B", "C"], edges, DEVS, times, bytes_, linear_transfer(latency))


def test_transfer_cost_makes_co_location_win() -> None:
    free = greedy(_chain(0.0))
    assert free["B"] == "gpu"  # without transfers, B goes to its fastest device
    costly = _chain(4.0)
    assign = greedy(costly)
    assert assign == {"A": "cpu", "B": "cpu", "C": "cpu"}
    assert costly.makespan(assign) == pytest.approx(5.0)
    assert costly.makespan({"A": "cpu", "B": "gpu", "C": "cpu"}) == pytest.approx(1 + 4 + 2 + 4 + 1)


def _myopic() -> Problem:
    """Greedy puts A on the cpu (5 < 6), then B must pay a transfer to the gpu; A on gpu is better."""
    times = _times({"A": (5, 6), "B": (20, 2)})
    return Problem(["A", "B"], [("input", "A"), ("A", "B")], DEVS, times, {("A", "B"): 8},
                   linear_transfer(3.0))


def test_correction_rounds_improve_the_greedy_result() -> None:
    result = place(_myopic(), x=2)
    assert result.greedy == {"A": "cpu", "B": "gpu"}
    assert result.greedy_s == pytest.approx(10.0)
    assert result.assignment == {"A": "gpu", "B": "gpu"}
    assert result.time_s == pytest.approx(8.0)
    assert any(h["accepted"] and h["block"] == "A" for h in result.history)
    # the accepting round is followed by x=2 rounds without gain
    assert result.rounds == 3


def test_correction_uses_the_measured_time_when_given() -> None:
    problem = _myopic()
    calls: list[dict[str, str]] = []

    def measure(assign: dict[str, str]) -> float:
        calls.append(assign)
        penalty = 5.0 if assign["A"] == "gpu" else 0.0  # contention the model does not see
        return problem.makespan(assign) + penalty

    result = place(problem, measure=measure, x=1)
    assert calls
    assert result.measured
    assert result.assignment == {"A": "cpu", "B": "gpu"}
    assert result.time_s == pytest.approx(10.0)
    assert result.modelled_s == pytest.approx(10.0)


def test_source_and_sink_devices_charge_transfers() -> None:
    times = _times({"A": (10, 1)})
    problem = Problem(["A"], [("input", "A")], DEVS, times, {("input", "A"): 1, ("A", "output"): 1},
                      table_transfer({("cpu", "gpu"): (2.0, 1e9), ("gpu", "cpu"): (3.0, 1e9)}),
                      source_device="cpu", sink_device="cpu")
    assert problem.makespan({"A": "gpu"}) == pytest.approx(2.0 + 1.0 + 3.0, rel=1e-6)
    assert place(problem).assignment == {"A": "gpu"}


def test_encode_decode_round_trip_and_space() -> None:
    problem = _diamond()
    assign = greedy(problem)
    vec = encode(assign, problem.blocks, DEVS)
    assert vec == [DEVS.index(assign[b]) for b in problem.blocks]
    assert decode(vec, problem.blocks, DEVS) == assign
    assert search_space(problem) == [[0, 1]] * 4


def test_bad_inputs_raise_user_errors() -> None:
    with pytest.raises(UserError, match="topological"):
        Problem(["B", "A"], [("A", "B")], DEVS, _times({"A": (1, 1), "B": (1, 1)}))
    with pytest.raises(UserError, match="no measured time"):
        Problem(["A"], [], DEVS, {})
    with pytest.raises(UserError, match="out of range"):
        decode([0, 5], ["A", "B"], DEVS)
    with pytest.raises(UserError, match="at least 0"):
        place(_myopic(), x=-1)


def test_greedy_counts_returning_the_output_to_the_sink_device() -> None:
    # B is faster on the gpu (2 < 3) but its output would take 5 s to come back to the cpu
    times = _times({"A": (1, 9), "B": (3, 2)})
    problem = Problem(["A", "B"], [("input", "A"), ("A", "B")], DEVS, times,
                      {("A", "B"): 0, ("B", "output"): 100}, linear_transfer(5.0),
                      source_device="cpu", sink_device="cpu")
    assert greedy(problem) == {"A": "cpu", "B": "cpu"}
    assert problem.makespan({"A": "cpu", "B": "gpu"}) == pytest.approx(1 + 2 + 5)


def test_placement_strategy_runs_lenet_in_process_with_output_check():
    """The strategy end to end on this machine's CPU: blocks timed, placed, latency checked."""
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.pool import LocalPool, load_pool
    from autohet.strategy_run import run_strategy

    workload = Workload.from_spec(WorkloadSpec(64, (1, 28, 28)))
    ctx = RunContext(ModelSpec("lenet"), workload, mode="latency", latency_runs=20)
    m = run_strategy("placement", {"runs": 3}, LocalPool(load_pool("actors/cpu2.yaml")), ctx)
    from autohet.core.models import build_model
    from tests.numerics import assert_run_fp32_close

    assert_run_fp32_close(m, build_model("lenet"))
    assert m.latency_ms["runs"] == 20 and m.latency_ms["p50"] > 0
    assert set(m.extra["assignment"]) == set(m.extra["blocks"])
    assert set(m.extra["assignment"].values()) <= {"cpu0", "cpu1"} and m.extra["devices"] == ["cpu0", "cpu1"]
    assert {"cpu0/torch", "cpu1/torch"} <= set(m.extra["baselines_p50_ms"])  # each device alone, same run


def test_placement_refuses_simulated_pools():
    import pytest

    from autohet.context import RunContext
    from autohet.core.errors import UserError
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.pool import VirtualPool
    from autohet.strategy_run import run_strategy
    from tests.conftest import sim_pool_spec

    workload = Workload.from_spec(WorkloadSpec(8, (1, 28, 28)))
    with pytest.raises(UserError, match="real devices"):
        run_strategy("placement", {}, VirtualPool(sim_pool_spec([100.0])),
                     RunContext(ModelSpec("lenet"), workload, mode="latency"))
