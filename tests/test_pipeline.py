"""Pipelining (seed 002): the stage planner on made-up costs, pipelined numerics on two CPU groups,
the strategy through ``run_strategy``, a tune. Its stage actors on two Ray nodes are tested in
test_ray_cluster.py (on that module's cluster)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from autohet.core.errors import UserError
from autohet.core.objectives import RunMode
from autohet.planners import linear_transfer, table_transfer
from autohet.planners.stages import (
    StageProblem,
    boundary_bytes,
    boundary_values,
    evaluate_stages,
    normalise_cuts,
    plan_stages,
)
from tests.numerics import assert_fp32_close

# --- the planner, on made-up costs -------------------------------------------------------------------


def problem(times: dict[str, list[float]], sizes: list[int] | None = None, transfer=None, payer=None,
            blocks: int | None = None) -> StageProblem:
    n = blocks or len(next(iter(times.values())))
    names = [f"b{i}" for i in range(n)]
    table = {(names[i], d): t for d, row in times.items() for i, t in enumerate(row) if t is not None}
    extra = {"payer": payer} if payer else {}
    return StageProblem(names, list(times), table, sizes or [0] * (n + 1), transfer or linear_transfer(), **extra)


def brute_force(p: StageProblem) -> float:
    """The smallest bottleneck over every cut and every order of distinct devices."""
    n, best = len(p.blocks), float("inf")
    for k in range(1, len(p.devices) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            for order in itertools.permutations(range(len(p.devices)), k):
                try:
                    best = min(best, evaluate_stages(p, list(cuts), list(order)).bottleneck_s)
                except UserError:  # a block that cannot run on a device
                    continue
    return best


def test_two_equal_devices_split_the_work_in_half():
    p = problem({"a": [1, 1, 1, 1], "b": [1, 1, 1, 1]})
    plan = plan_stages(p)
    assert plan.cuts == [2] and plan.bottleneck_s == 2
    assert plan.assignment(p.blocks) == {"b0": "a", "b1": "a", "b2": "b", "b3": "b"}
    assert plan.throughput(8) == 4


def test_a_transfer_can_make_a_cut_worse_than_one_device():
    times = {"a": [1, 1], "b": [1, 1]}
    assert plan_stages(problem(times)).cuts == [1]  # free moves: cut in the middle, 1 s per frame
    slow = problem(times, sizes=[0, 1000, 0], transfer=linear_transfer(0.0, 500.0))  # the cut costs 2 s
    plan = plan_stages(slow)
    assert plan.cuts == [] and len(plan.stages) == 1 and plan.bottleneck_s == 2  # one device beats 1 + 2 s


def test_a_transfer_moves_the_cut_to_a_smaller_boundary():
    times = {"a": [2, 2, 2, 2], "b": [2, 2, 2, 2]}
    free = problem(times)
    assert plan_stages(free).cuts == [2]
    heavy = problem(times, sizes=[0, 10, 4000, 10, 0], transfer=linear_transfer(0.0, 1000.0))
    plan = plan_stages(heavy)  # the middle cut puts 4 + 4 s on b; after b0 or b2 the mover pays 0.01 s
    assert plan.cuts in ([1], [3]) and plan.bottleneck_s == pytest.approx(6.0)
    assert plan.stages[1].in_s == pytest.approx(0.01) and max(s.load_s for s in plan.stages) == 6.0


def test_the_faster_device_takes_the_heavy_part_in_either_order():
    heavy_first = problem({"slow": [4, 4, 1, 1], "fast": [1, 1, 0.25, 0.25]})
    plan = plan_stages(heavy_first)
    assert [s.device for s in plan.stages] == ["fast", "slow"] and plan.order == [1, 0]
    heavy_last = problem({"slow": [1, 1, 4, 4], "fast": [0.25, 0.25, 1, 1]})
    assert [s.device for s in plan_stages(heavy_last).stages] == ["slow", "fast"]


def test_the_payer_decides_which_device_carries_a_move():
    times = {"gpu": [1, 1], "cpu": [1, 1]}
    link = linear_transfer(0.5, float("inf"))  # every move 0.5 s
    receiver = evaluate_stages(problem(times, sizes=[8, 8, 8], transfer=link), [1], [0, 1])
    assert receiver.loads == {"gpu": 1.5, "cpu": 2.0}  # gpu pays its input; cpu its input and the output
    gpu_side = evaluate_stages(problem(times, sizes=[8, 8, 8], transfer=link,
                                       payer=lambda s, d: "gpu" if "gpu" in (s, d) else d), [1], [0, 1])
    assert gpu_side.loads == {"gpu": 2.0, "cpu": 1.5}  # the engine's rule: the GPU side issues the copy


def test_a_block_a_device_cannot_run_is_kept_off_it():
    p = problem({"a": [1, 1, 1, None], "b": [3, 3, 3, 1]})
    plan = plan_stages(p)
    assert plan.assignment(p.blocks)["b3"] == "b" and plan.bottleneck_s == pytest.approx(3)


def test_the_dynamic_program_equals_brute_force_on_random_problems():
    rng = random.Random(7)
    for _ in range(40):
        n, m = rng.randint(1, 6), rng.randint(1, 3)
        devices = [f"d{k}" for k in range(m)]
        times = {d: [rng.uniform(0.1, 3.0) for _ in range(n)] for d in devices}
        links = {(a, b): (rng.uniform(0, 0.5), rng.uniform(10, 1000)) for a in ["host", *devices]
                 for b in ["host", *devices] if a != b}
        sizes = [rng.randint(0, 500) for _ in range(n + 1)]
        payer = rng.choice([None, lambda s, d: s if s != "host" else d])
        p = problem(times, sizes, table_transfer(links), payer)
        assert plan_stages(p).bottleneck_s == pytest.approx(brute_force(p)), (times, sizes)


def test_max_stages_and_given_plans():
    p = problem({"a": [1] * 6, "b": [1] * 6, "c": [1] * 6})
    assert plan_stages(p).bottleneck_s == 2 and plan_stages(p, max_stages=2).bottleneck_s == 3
    twice = evaluate_stages(p, [2, 4], [0, 1, 0])  # a device may run two stages: it carries both
    assert twice.loads == {"a": 4, "b": 2} and twice.bottleneck_s == 4
    assert evaluate_stages(p, [4, 0, 4, 9], [1, 2, 0]).cuts == [4]  # 0, repeats, past the end: no cut
    assert normalise_cuts([5, 0, 2, 2, 6], 6) == [2, 5]
    with pytest.raises(UserError, match="need 3 stage devices"):
        evaluate_stages(p, [2, 4], [0, 1])
    with pytest.raises(UserError, match="out of range"):
        evaluate_stages(p, [2], [0, 5])


def test_boundaries_of_a_real_partition():
    from autohet.partition import partition

    graph = partition("lenet", batch=4)
    values = boundary_values(graph)
    assert values[0] == ("x",) and values[-1] == (graph.output_name,) and all(len(v) == 1 for v in values)
    sizes = boundary_bytes(graph)
    assert sizes[0] == 4 * 1 * 28 * 28 * 4 and sizes[-1] == 4 * 10 * 4
    assert sizes[1] == graph.blocks[0].out_bytes


def test_given_plan_merges_neighbours_and_checks_lengths():
    from autohet.strategies.pipeline._plan import check_plan_params, given_plan

    assert given_plan({"cuts": [1, 2], "stages": [0, 0, 1]}, 3, 2) == ([2], [0, 1])
    assert given_plan({"cuts": [2], "stages": [1, 0, 1]}, 3, 2) == ([2], [1, 0])  # extra entries unused
    assert given_plan({"cuts": [0], "stages": None}, 3, 2) == ([], [0])
    with pytest.raises(UserError, match="need 3 stage devices"):
        given_plan({"cuts": [1, 2], "stages": [0, 1]}, 3, 2)
    with pytest.raises(UserError, match="only used with start=given"):
        check_plan_params({"start": "greedy", "cuts": [1]}, ["a", "b"])
    with pytest.raises(UserError, match="needs cuts"):
        check_plan_params({"start": "given"}, ["a", "b"])
    with pytest.raises(UserError, match="device index 2"):
        check_plan_params({"start": "given", "cuts": [1], "stages": [0, 2]}, ["a", "b"])


# --- numerics and the strategy on two CPU groups ------------------------------------------------------


def cpu_specs():
    from autohet.pool import load_pool

    return load_pool("actors/cpu2.yaml").executors


def test_pipelined_frames_come_out_in_order_and_equal_the_model():
    """Stage 0 on one CPU group, stage 1 on the other, three frames in flight: every frame's output
    (the last one padded) equals the model's, in image order."""
    from autohet.core.models import ModelSpec, build_model
    from autohet.engine import build_engine, stream_frames
    from autohet.strategies.pipeline._plan import StagePrograms, model_graph

    images = np.random.default_rng(0).standard_normal((70, 3, 32, 32), dtype=np.float32)
    engine = build_engine(cpu_specs())
    try:
        graph = model_graph(ModelSpec("cifarnet"), 8)
        cut = len(graph.names) // 2
        assignment = {b: ("cpu0" if i < cut else "cpu1") for i, b in enumerate(graph.names)}
        program = StagePrograms(engine, graph).program(assignment)
        assert {s.device for s in program.steps if s.kind == "compute"} == {"cpu0", "cpu1"}
        _, out = stream_frames(engine, program, lambda s, n: images[s:s + n], len(images), 8, depth=3)
    finally:
        engine.close()
    with torch.inference_mode():
        ref = build_model(ModelSpec("cifarnet"))(torch.from_numpy(images)).numpy()
    assert out.shape == ref.shape
    assert_fp32_close(out, ref, build_model(ModelSpec("cifarnet")))


def run_pipeline(params: dict, images: int = 384, model: str = "lenet"):
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec, input_shape
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.pool import LocalPool, load_pool
    from autohet.strategy_run import run_strategy

    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    ctx = RunContext(ModelSpec(model), Workload.from_spec(WorkloadSpec(images, input_shape(model))), check_images=16)
    try:
        return run_strategy("pipeline", params, pool, ctx)
    finally:
        pool.shutdown()


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_the_planned_pipeline_reports_its_stages_bound_and_baselines():
    m = run_pipeline({})
    assert m.output_ok, m.failures
    assert m.strategy == "pipeline" and not m.simulated
    assert m.limit_ips == pytest.approx(m.extra.get("limit_raised", {}).get("run_ips", m.extra["bound_ips"]))
    assert m.efficiency == pytest.approx(m.throughput_ips / m.limit_ips) and m.efficiency <= 1.02
    stages = m.extra["stages"]
    assert [b for s in stages for b in s["blocks"]] == m.extra["blocks"]  # contiguous, every block once
    assert len({s["device"] for s in stages}) == len(stages)
    for s in stages:
        assert s["frame_ms"] > 0 and s["standalone_ips"] > 0 and s["modelled_frame_ms"] > 0
    slowest = min(s["standalone_ips"] for s in stages)
    assert m.extra["bound_ips"] == pytest.approx(slowest)
    assert set(m.extra["single_ips"]) == {"cpu0", "cpu1"} and m.extra["best_single"]["ips"] > 0
    assert m.extra["speedup_vs_best_single"] > 0
    assert {"host->cpu0", "cpu0->cpu1"} <= set(m.extra["links"])
    assert m.params["batch"] == 48 and m.params["depth"] == 2 * len(stages) + 2  # 384 images / (4 x 2 devices)
    assert m.params["cuts"] is None  # the planner's cut is in extra; the config stays start=greedy
    assert sum(e.images for e in m.executors) == 384 * len(stages)
    frames = 384 // 48  # the timeline: one unit per frame on each stage's device, frames in order
    for stage in stages:
        units = [u for u in m.timeline if u.executor == stage["device"]]
        assert [u.start_image for u in units] == [48 * k for k in range(frames)]
        assert all(a.end_s <= b.start_s + 1e-6 for a, b in zip(units, units[1:], strict=False))
    assert max(u.end_s for u in m.timeline) <= m.wall_s


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_a_given_cut_runs_as_given_and_is_exported():
    m = run_pipeline({"start": "given", "cuts": [2], "stages": [1, 0], "batch": 32, "depth": 2})
    assert m.output_ok, m.failures
    assert [s["device"] for s in m.extra["stages"]] == ["cpu1", "cpu0"]
    assert [len(s["blocks"]) for s in m.extra["stages"]] == [2, 1]
    assert m.params["cuts"] == [2] and m.params["stages"] == [1, 0] and m.params["batch"] == 32
    assert m.extra["modelled_bound_ips"] is None and m.extra["block_times_ms"] == {}
    one = run_pipeline({"start": "given", "cuts": [0], "stages": [1, 1]})  # a tuner's vector: no cut
    assert one.output_ok and [s["device"] for s in one.extra["stages"]] == ["cpu1"]
    assert one.params["cuts"] == [] and one.params["stages"] == [1]


def test_bad_parameters_fail_in_one_line_before_running():
    for params, text in [({"cuts": [1]}, "only used with start=given"), ({"start": "given"}, "needs cuts"),
                         ({"start": "given", "cuts": [1], "stages": [0, 7]}, "device index 7"),
                         ({"devices": [0, 0]}, "twice")]:
        with pytest.raises(UserError, match=text) as info:
            run_pipeline(params, images=64)
        assert "\n" not in str(info.value)


def test_space_sizes_follow_the_pool_and_the_model():
    from autohet.core.models import ModelSpec
    from autohet.pool import PoolSpec, load_pool
    from autohet.strategies import get_strategy

    strategy = get_strategy("pipeline")
    assert strategy.space_sizes(ModelSpec("lenet"), load_pool("actors/cpu2.yaml")) == {"blocks": 3, "cut_points": 1}
    one = PoolSpec("one", load_pool("actors/cpu1.yaml").executors[:1])
    assert strategy.space_sizes(ModelSpec("lenet"), one) == {}


def test_the_throughput_space_offers_pipeline_next_to_data_parallel():
    from autohet.core.models import ModelSpec
    from autohet.pool import load_pool
    from autohet.tuning.sizing import space_context
    from autohet.tuning.space import load_search_space

    space = load_search_space("search_spaces").restrict(None, RunMode.THROUGHPUT)
    assert {"pipeline", "fifo", "fast_split"} <= set(space.strategies)
    ctx = space_context(space, load_pool("actors/cpu2.yaml"), ModelSpec("lenet"), False)
    assert ctx.size("cut_points") == 1 and ctx.size("blocks") == 3 and ctx.size("devices") == 2

    class Trial:  # Optuna's define-by-run calls, answered in order
        def __init__(self):
            self.asked = {}

        def suggest_categorical(self, key, choices):
            value = {"strategy": "pipeline", "pipeline.start": "given"}.get(key, choices[-1])
            self.asked[key] = value
            return value

        def suggest_int(self, key, low, high, step=1, log=False):
            self.asked[key] = low
            return low

    trial = Trial()
    space.define(trial, ctx)
    strategy, params, _, _ = space.decode(trial.asked)
    assert strategy == "pipeline" and params["cuts"] == [2] and params["stages"] == [1, 1] and params["depth"] == 2
    from autohet.strategies import get_strategy

    get_strategy("pipeline").validate(params)


# --- a tune that includes pipeline trials ---------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_a_tune_chooses_among_single_and_pipeline_trials(tmp_path):
    import yaml

    from autohet.core.models import ModelSpec
    from autohet.pool import load_pool
    from autohet.tuning.initial import initial_points
    from autohet.tuning.sizing import space_context
    from autohet.tuning.space import load_search_space
    from tests.test_tune import REPO, autohet, client_for, setup_dir

    # the budget: the tuner's first points (single, then the pipeline at its defaults) and two drawn by the
    # seeded sampler over a space that is the same on every machine (the draws: single, then a pipeline
    # with start=given; issue 24)
    cwd, env = setup_dir(tmp_path, trials=1)
    space = load_search_space(cwd / "spaces").restrict(["pipeline"], RunMode.THROUGHPUT).for_machine()[0]
    pool = load_pool(str(REPO / "actors/cpu2.yaml"))
    first = initial_points(space, pool, space_context(space, pool, ModelSpec("lenet"), False))
    assert [p["strategy"] for p in first] == ["single", "single", "pipeline"]  # the other batch, then the pipeline
    trials = len(first) + 2
    conf = yaml.safe_load((cwd / "conf.yaml").read_text())
    # the auto trial timeout: its calibration starts the pool before the first trial, as the draws above assume
    (cwd / "conf.yaml").write_text(yaml.safe_dump({**conf, "trials": trials, "images": 768,
                                                   "strategies": "pipeline", "trial_timeout_s": "auto"}))
    proc = autohet(["tune", "--model", "lenet", "--conf", "conf.yaml", "--experiment", "pipe"], cwd, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = client_for(cwd)
    exp = client.get_experiment_by_name("pipe")
    runs = client.search_runs([exp.experiment_id], "tags.autohet_kind = 'trial'")
    pipes = [r for r in runs if r.data.tags["strategy"] == "pipeline"]
    assert len(runs) == trials and len(pipes) >= 2
    assert all(r.data.tags["status"] == "ok" for r in pipes), [r.data.tags.get("error") for r in pipes]
    for run in pipes:
        assert {"throughput_ips", "limit_ips", "efficiency", "share.cpu0", "busy.cpu1"} <= set(run.data.metrics)
        assert run.data.metrics["efficiency"] <= 1.02
        assert {"timeline.png", "config.yaml", "measurement.json"} <= {a.path for a in client.list_artifacts(
            run.info.run_id)}
    given = [r for r in pipes if r.data.params.get("pipeline.start") == "given"]
    assert given and all("pipeline.cuts_0" in r.data.params for r in given), [r.data.params for r in pipes]
    for run in given:  # the searched vector is what ran
        path = client.download_artifacts(run.info.run_id, "measurement.json", str(tmp_path))
        ran = json.loads(Path(path).read_text())
        assert ran["params"]["start"] == "given" and ran["params"]["cuts"] is not None
    best = yaml.safe_load((cwd / "runs" / "pipe" / "best.yaml").read_text())
    assert best["measured"]["output_ok"] is True


# --- the benchmark's smoke path -------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_smoke_runs_pipeline_next_to_data_parallel_and_single(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "pipeline.json"
    proc = subprocess.run([sys.executable, "-m", "bench.pipeline", "--smoke", "--out", str(out)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["kind"] for r in rows} == {"pipeline", "single", "data-parallel"}
    assert all(r["output_ok"] for r in rows)
    pipe = next(r for r in rows if r["kind"] == "pipeline")
    assert pipe["limit_ips"] > 0 and pipe["stages"] and pipe["single_ips_same_batch"]


@pytest.mark.gpu
def test_a_pipeline_over_two_gpus_passes_activations_gpu_to_gpu_and_matches_the_reference():
    """Issue 46: stages on two GPUs of one process; the cut's activations move device to device (no
    host copy between the stages), outputs within fp32's check."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec
    from autohet.core.workload import Workload, WorkloadSpec
    from autohet.executors import ExecutorSpec
    from autohet.pool import LocalPool, PoolSpec
    from autohet.strategy_run import run_strategy

    spec = PoolSpec("gpus", [ExecutorSpec(f"gpu{g}", "gpu", (g,), g, batch=16, precision="fp32") for g in (0, 1)])
    ctx = RunContext(ModelSpec("resnet18"), Workload.from_spec(WorkloadSpec(256, (3, 224, 224))), check_images=16,
                     standalone_seconds=0.2)
    m = run_strategy("pipeline", {"start": "given", "cuts": [5], "stages": [0, 1], "batch": 16}, LocalPool(spec), ctx)
    assert m.output_ok, m.failures
    assert {s["device"] for s in m.extra["stages"]} == {"gpu0", "gpu1"}
