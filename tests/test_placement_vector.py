"""The placement as a searchable vector (issue 4): a given start for the correction rounds, the
block_devices search dim gated by ``start: given``, its errors, and the vector in exported configs."""

from __future__ import annotations

import pickle

import optuna
import pytest

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, build_model
from autohet.core.objectives import RunMode
from autohet.executors import ExecutorSpec
from autohet.planners import Problem, decode, greedy, linear_transfer, place
from autohet.pool import PoolSpec
from autohet.strategies.placement import check_vector
from autohet.tuning.initial import initial_points
from autohet.tuning.sizing import space_context, strategy_sizes
from autohet.tuning.space import DefineByRun, SearchSpace, SpaceContext, load_search_space
from tests.numerics import assert_run_fp32_close


def block_count(model: ModelSpec) -> int:
    from autohet.partition import partition

    return len(partition(model.name, batch=1, seed=model.seed).blocks)

DEVS = ["cpu", "gpu"]
CPU_GPU = SpaceContext({"executors": 2, "blocks": 5, "devices": 2}, frozenset({"cpu", "gpu"}))


def _myopic() -> Problem:
    """Greedy puts A on the cpu (5 < 6), then B pays a transfer to the gpu; A on the gpu is better."""
    times = {("A", "cpu"): 5, ("A", "gpu"): 6, ("B", "cpu"): 20, ("B", "gpu"): 2}
    return Problem(["A", "B"], [("input", "A"), ("A", "B")], DEVS, times, {("A", "B"): 8}, linear_transfer(3.0))


# --- the algorithm: a given start, x=0 ------------------------------------------------------------

def test_given_start_with_x0_is_measured_as_given_and_skips_greedy(monkeypatch) -> None:
    import autohet.planners._placement as search

    monkeypatch.setattr(search, "greedy", lambda *a, **k: pytest.fail("greedy must not run for a given start"))
    calls: list[dict[str, str]] = []

    def measure(assign: dict[str, str]) -> float:
        calls.append(assign)
        return 1.0

    start = {"A": "cpu", "B": "cpu"}
    result = place(_myopic(), measure=measure, x=0, start=start)
    assert calls == [start]  # the vector alone, no correction move tried
    assert result.assignment == start and result.greedy == start and result.start == "given"
    # exact: Python float arithmetic on the test's own figures
    assert result.rounds == 0 and result.time_s == 1.0 and result.to_dict()["start"] == "given"


def test_given_start_is_corrected_from_where_it_starts() -> None:
    problem = _myopic()
    assert greedy(problem) == {"A": "cpu", "B": "gpu"}
    result = place(problem, x=1, start={"A": "gpu", "B": "cpu"})
    assert result.greedy == {"A": "gpu", "B": "cpu"} and result.start == "given"
    assert result.assignment == {"A": "gpu", "B": "gpu"} and result.time_s == pytest.approx(8.0)


def test_greedy_start_with_x0_is_the_greedy_placement() -> None:
    result = place(_myopic(), x=0)
    assert result.start == "greedy" and result.rounds == 0
    assert result.assignment == result.greedy == {"A": "cpu", "B": "gpu"}


def test_given_start_on_an_unknown_device_is_a_user_error() -> None:
    with pytest.raises(UserError, match="puts block 'A' on 'tpu'; valid: cpu, gpu"):
        place(_myopic(), x=0, start={"A": "tpu", "B": "cpu"})


def test_vector_errors_name_expected_length_blocks_and_valid_indices() -> None:
    with pytest.raises(UserError) as info:
        decode([0], ["b0", "b1", "b2"], ["cpu", "cuda:0"])
    text = str(info.value)
    assert "\n" not in text and "1 entries; expected 3" in text and "b0, b1, b2" in text
    with pytest.raises(UserError, match=r"index 2 for block b1 is out of range; valid: 0 \(cpu\), 1 \(cuda:0\)"):
        decode([0, 2], ["b0", "b1"], ["cpu", "cuda:0"])


def test_check_vector_before_partitioning() -> None:
    check_vector({"start": "greedy", "assignment": None}, ["cpu"])
    check_vector({"start": "given", "assignment": None}, ["cpu"])  # one device: all-CPU is implied
    check_vector({"start": "given", "assignment": [0, 1, 1]}, ["cpu", "cuda:0"])
    with pytest.raises(UserError, match=r"start=given needs assignment.*valid: 0 \(cpu\), 1 \(cuda:0\)"):
        check_vector({"start": "given", "assignment": None}, ["cpu", "cuda:0"])
    with pytest.raises(UserError, match=r"device index 1; valid: 0 \(cpu\)$"):
        check_vector({"start": "given", "assignment": [0, 1]}, ["cpu"])
    with pytest.raises(UserError, match="only used with start=given"):
        check_vector({"start": "greedy", "assignment": [0]}, ["cpu"])


# --- the search space ------------------------------------------------------------------------------

def _placement_trials(space: SearchSpace, ctx: SpaceContext, n: int = 40) -> list[dict]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    define = DefineByRun(space.restrict(["placement"], RunMode.LATENCY), ctx)
    out = []
    for _ in range(n):
        trial = study.ask()
        define(trial)
        out.append(dict(trial.params))
        study.tell(trial, 1.0)
    return [p for p in out if p["strategy"] == "placement"]


def test_vector_is_suggested_only_for_a_given_start() -> None:
    trials = _placement_trials(load_search_space("search_spaces"), CPU_GPU)
    starts = {p["placement.start"] for p in trials}
    assert starts == {"greedy", "given"}
    for p in trials:
        keys = {k for k in p if k.startswith("placement.assignment_")}
        if p["placement.start"] == "given":
            assert keys == {f"placement.assignment_{i}" for i in range(5)}
            assert {p[k] for k in keys} <= {0, 1}
            _, params, _, _ = SearchSpace.decode(p)
            assert len(params["assignment"]) == 5 and params["start"] == "given"
        else:
            assert not keys
            assert "assignment" not in SearchSpace.decode(p)[1]


def test_gate_is_suggested_first_whatever_the_yaml_order(tmp_path) -> None:
    (tmp_path / "p.yaml").write_text(
        "strategies:\n  placement:\n    assignment: {type: block_devices}\n"
        "    start: {type: categorical, choices: [greedy, given]}\n")
    space = load_search_space(tmp_path)
    assert space.strategies["placement"]["assignment"].when == ("start", "given")  # the default gate
    trials = _placement_trials(space, CPU_GPU)
    given = [p for p in trials if p["placement.start"] == "given"]
    assert given and all(len([k for k in p if "assignment_" in k]) == 5 for p in given)
    assert all(not any("assignment_" in k for k in p) for p in trials if p["placement.start"] == "greedy")


def test_one_device_pool_suggests_no_vector() -> None:
    cpu_only = SpaceContext({"executors": 1, "blocks": 5, "devices": 1}, frozenset({"cpu"}))
    trials = _placement_trials(load_search_space("search_spaces"), cpu_only)
    assert any(p["placement.start"] == "given" for p in trials)
    assert not any("assignment_" in k for p in trials for k in p)


@pytest.mark.parametrize("text, fragment", [
    ("placement: {assignment: {type: block_devices}}", "needs start: {type: categorical"),
    ("placement: {start: {type: categorical, choices: [greedy]}, assignment: {type: block_devices}}",
     "only when start is 'given'"),
    ("placement: {x: {type: int, low: 0, high: 2, when: [start]}}", "must be one sibling and its value"),
    ("placement: {x: {type: int, low: 0, high: 2, when: {runs: 3}}, runs: {type: int, low: 1, high: 3, "
     "when: {x: 1}}}", "needs runs: {type: categorical"),
    ("placement: {start: {type: categorical, choices: [greedy, given], when: {backend: torch}}, "
     "backend: {type: categorical, choices: [torch], when: {start: given}}}", "form a cycle"),
])
def test_bad_gates_are_clear_errors(tmp_path, text, fragment) -> None:
    (tmp_path / "bad.yaml").write_text(f"strategies: {{{text}}}\n")
    with pytest.raises(UserError) as info:
        load_search_space(tmp_path)
    assert fragment in str(info.value)


def test_block_devices_is_only_for_strategies(tmp_path) -> None:
    (tmp_path / "bad.yaml").write_text("executors: {cpu: {batch: {type: block_devices}}}\n")
    with pytest.raises(UserError, match="only for strategy parameters"):
        load_search_space(tmp_path)


def test_space_context_partitions_only_when_a_vector_can_be_searched(monkeypatch) -> None:
    import autohet.partition as partition_mod
    import autohet.tuning.sizing as sizing

    space = load_search_space("search_spaces")
    one = PoolSpec("cpu", [ExecutorSpec("cpu01", "cpu", cores=(0, 1))])
    mixed = PoolSpec("mixed", [ExecutorSpec("cpu0", "cpu", cores=(0,)), ExecutorSpec("gpu0", "gpu", gpu=0)])
    sizing._SIZES.clear()
    monkeypatch.setattr(partition_mod, "partition", lambda *a, **k: pytest.fail("no partition for one device"))
    ctx_one = space_context(space, one, ModelSpec("lenet"), False)
    assert ctx_one.size("blocks") == 0 and ctx_one.size("devices") == 1 and ctx_one.kinds == frozenset({"cpu"})
    monkeypatch.undo()
    ctx = space_context(space, mixed, ModelSpec("lenet"), False)
    n = block_count(ModelSpec("lenet"))
    assert (ctx.size("blocks"), ctx.size("devices"), ctx.kinds) == (n, 2, frozenset({"cpu", "gpu"}))
    assert strategy_sizes("placement", ModelSpec("lenet"), mixed) == {"blocks": n}  # cached per model and pool
    define = pickle.loads(pickle.dumps(DefineByRun(space, ctx)))  # Tune checkpoints the searcher
    assert define.ctx == ctx
    points = initial_points(space, mixed)
    placement = next(p for p in points if p["strategy"] == "placement")
    assert placement["placement.start"] == "greedy" and not any("assignment" in k for k in placement)


# --- the strategy, in-process on this machine's CPU --------------------------------------------------

def _lenet_ctx(runs: int = 8):
    from autohet.context import RunContext
    from autohet.core.workload import Workload, WorkloadSpec

    workload = Workload.from_spec(WorkloadSpec(16, (1, 28, 28)))
    return RunContext(ModelSpec("lenet"), workload, mode="latency", latency_runs=runs)


def _local_pool():
    from autohet.pool import LocalPool, load_pool

    return LocalPool(load_pool("actors/cpu1.yaml"))  # one device: the CPU group of both cores


def test_given_vector_runs_as_given_on_a_cpu_pool_and_is_recorded() -> None:
    from autohet.strategy_run import run_strategy

    n = block_count(ModelSpec("lenet"))
    vector = [0] * n
    m = run_strategy("placement", {"start": "given", "assignment": vector, "x": 0, "runs": 2}, _local_pool(),
                     _lenet_ctx())
    assert_run_fp32_close(m, build_model("lenet"))
    assert m.extra["start"] == "given" and m.extra["start_vector"] == vector
    assert m.extra["assignment_vector"] == vector and m.extra["rounds"] == 0 and m.extra["greedy"] is None
    assert m.extra["start_assignment"] == m.extra["assignment"] == dict.fromkeys(m.extra["blocks"], "cpu01")
    assert m.params["assignment"] == vector and m.params["start"] == "given"


def test_given_start_without_vector_on_a_cpu_pool_is_all_cpu_and_exported() -> None:
    from autohet.strategy_run import run_strategy

    m = run_strategy("placement", {"start": "given", "x": 0, "runs": 2}, _local_pool(), _lenet_ctx())
    assert m.output_ok
    assert m.params["assignment"] == [0] * len(m.extra["blocks"])  # the config names the vector it ran


def test_wrong_length_or_index_is_a_one_line_user_error() -> None:
    from autohet.strategy_run import run_strategy

    n = block_count(ModelSpec("lenet"))
    with pytest.raises(UserError) as info:
        run_strategy("placement", {"start": "given", "assignment": [0], "x": 0}, _local_pool(), _lenet_ctx())
    assert "\n" not in str(info.value) and f"1 entries; expected {n}" in str(info.value)
    with pytest.raises(UserError, match=r"device index 1; valid: 0 \(cpu01\)"):
        run_strategy("placement", {"start": "given", "assignment": [1] * n}, _local_pool(), _lenet_ctx())


@pytest.mark.ray
@pytest.mark.slow  # with its Ray start, more than 10 s on the 2-core box
def test_wrong_length_through_the_ray_actor_is_the_same_one_line_error(ray_local) -> None:
    from autohet.pool import RayPool, load_pool
    from autohet.strategy_run import run_strategy

    pool = RayPool(load_pool("actors/cpu1.yaml"))
    try:
        with pytest.raises(UserError) as info:
            run_strategy("placement", {"start": "given", "assignment": [0, 0], "x": 0}, pool, _lenet_ctx())
    finally:
        pool.shutdown()
    text = str(info.value)
    assert "\n" not in text and text.startswith("placement vector has 2 entries; expected")


# --- the exported config ---------------------------------------------------------------------------

def test_exported_config_carries_the_vector_for_autohet_run(tmp_path) -> None:
    from autohet.config import RunConfig, load_config, write_config
    from autohet.core.params import validate_params
    from autohet.pool import load_pool
    from autohet.strategies import get_strategy

    trial = {"strategy": "placement", "placement.start": "given", "placement.x": 0, "placement.backend": "torch",
             **{f"placement.assignment_{i}": v for i, v in enumerate([0, 1, 1, 0])}}
    strategy, params, _, _ = SearchSpace.decode(trial)
    checked = validate_params(strategy, get_strategy(strategy).params, params)
    path = write_config(RunConfig(ModelSpec("lenet"), load_pool("actors/cpu2.yaml"), strategy, checked,
                                  objective="latency"), tmp_path / "best.yaml")
    assert "- 1" in path.read_text()  # a plain YAML int list
    loaded = load_config(path)
    assert loaded.params == checked and loaded.params["assignment"] == [0, 1, 1, 0]
    assert validate_params(strategy, get_strategy(strategy).params, loaded.params) == checked
