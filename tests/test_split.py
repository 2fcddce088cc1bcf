"""Row splits (``split``, seed 003; ``coedge``, seed 004's baseline): the row arithmetic, the numerics
against the unsplit model on two and three CPU devices, the ratio planner on made-up costs, the
strategies end to end on cpu2, and the temperature constraint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autohet.context import RunContext
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, input_shape
from autohet.core.workload import Workload, WorkloadSpec
from autohet.engine import CpuDevice, Engine
from autohet.planners.split import ChainCost, balance
from autohet.platform import sensors, thermal
from autohet.platform.thermal import temperature_violation
from autohet.pool import LocalPool, load_pool
from autohet.strategies.split._chains import spatial_graph
from autohet.strategies.split._programs import StagePrograms, coedge_groups
from autohet.strategies.split._rows import RowNode, Window, needs, pieces, split_rows
from autohet.strategy_run import run_strategy
from tests.numerics import assert_fp32_close

# --- the row arithmetic -------------------------------------------------------------------------------


def test_split_rows_cover_every_row_once_and_honour_zero_shares():
    for height in (1, 4, 7, 37, 224):
        for shares in ((0.5, 0.5), (0.0, 1.0), (1.0, 0.0), (0.13, 0.87), (0.2, 0.0, 0.8), (1, 2, 3)):
            parts = split_rows(height, shares)
            assert parts[0][0] == 0 and parts[-1][1] == height
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
            assert all(hi == lo for (lo, hi), s in zip(parts, shares, strict=True) if s == 0)


def test_window_reads_kernel_stride_padding_dilation():
    assert Window(3, 1, 1).reads((0, 5)) == (-1, 6)
    assert Window(3, 2, 1).reads((2, 4)) == (3, 8)
    assert Window(3, 1, 2, dilation=2).reads((4, 6)) == (2, 8)  # rows 4 and 5 read 2,4,6 and 3,5,7
    assert Window(1).pointwise and not Window(1, 2).pointwise


def test_needs_walks_back_through_a_chain_with_a_residual_join():
    # conv3x3 p1 -> conv3x3 p1 -> add(conv2, input): rows 10..20 of the output of a 32-row image
    chain = [RowNode("c1", ("x",), 32, Window(3, 1, 1), 32), RowNode("c2", ("c1",), 32, Window(3, 1, 1), 32),
             RowNode("add", ("c2", "x"), 32)]
    need = needs(chain, {"add": (10, 20)})
    assert need == {"add": (10, 20), "c2": (10, 20), "c1": (9, 21), "x": (8, 22)}
    assert needs(chain, {"add": (0, 4)})["x"] == (0, 6)  # clipped at the top: the rest is padding
    assert pieces((3, 9), [(0, 5), (5, 7), (7, 12)]) == [(0, (3, 5)), (1, (5, 7)), (2, (7, 9))]


# --- numerics against the unsplit model ------------------------------------------------------------------


class Windows(nn.Module):
    """Odd heights, stride 2, dilation, 'same' and grouped convs, pooling with ceil_mode inside one chain."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=2, dilation=2), nn.ReLU6(),
            nn.MaxPool2d(3, stride=2, ceil_mode=True),
            nn.Conv2d(8, 8, 3, padding="same", groups=4), nn.SiLU(),
            nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
            nn.Conv2d(8, 8, 5, padding=1), nn.Dropout(0.5),
            nn.AvgPool2d(2, ceil_mode=True), nn.Conv2d(8, 6, 1))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Residual(nn.Module):
    """A resnet basic block with a stride-2 1x1 downsample, in-place adds and functional relus."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.c1, self.b1 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.down = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2), nn.BatchNorm2d(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        out = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        out += self.down(x)
        return torch.flatten(nn.functional.adaptive_avg_pool2d(out.relu_(), 2), 1)


class Inception(nn.Module):
    """GoogLeNet-like: four branches (1x1, 3x3, 5x5, 3x3 max pool stride 1 ceil_mode) joined by cat."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, stride=2, padding=3), nn.MaxPool2d(3, 2, ceil_mode=True))
        self.b1 = nn.Conv2d(8, 4, 1)
        self.b2 = nn.Sequential(nn.Conv2d(8, 4, 1), nn.Conv2d(4, 6, 3, padding=1))
        self.b3 = nn.Sequential(nn.Conv2d(8, 2, 1), nn.Conv2d(2, 3, 5, padding=2))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, padding=1, ceil_mode=True), nn.Conv2d(8, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.cat([self.b1(x), nn.functional.relu(self.b2(x), inplace=True), self.b3(x), self.b4(x)], 1)
        return torch.cat([x, self.b1(x[:, :8])], 1).mean((2, 3))  # a slice: not local, then a chain again


@pytest.fixture(scope="module")
def engine():
    engine = Engine([CpuDevice("a", (0,)), CpuDevice("b", (1,)), CpuDevice("c", (0,))])
    yield engine
    engine.close()


CASES = [(Windows, (3, 37, 30)), (Windows, (3, 29, 17)), (Residual, (3, 21, 16)), (Inception, (3, 33, 40))]
SHARES = [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (0.37, 0.63), (0.91, 0.09)]


@pytest.mark.parametrize("factory, shape", CASES, ids=[f"{c.__name__}-{s[1]}x{s[2]}" for c, s in CASES])
def test_split_and_coedge_match_the_unsplit_model(engine, factory, shape):
    torch.manual_seed(0)
    model = factory().eval()
    x = torch.randn(2, *shape)
    with torch.inference_mode():
        ref = model(x)
    for max_windows in (0, 2):
        graph = spatial_graph(model, x[:1], max_windows)
        assert graph.chains and all(c.windows for c in graph.chains)
        two = StagePrograms(engine, graph, ["a", "b"], "a", 2, graphs=False)
        three = StagePrograms(engine, graph, ["a", "b", "c"], "b", 2, graphs=False)
        for how in ("split", "coedge"):
            for shares in SHARES:
                out = engine.run(two.program([shares] * len(graph.chains), how), {"x": x})
                assert_fp32_close(out, ref, model, f"{how} {shares} {max_windows}")
            out = engine.run(three.program([(0.3, 0.2, 0.5)] * len(graph.chains), how), {"x": x})
            assert_fp32_close(out, ref, model, f"{how} 3 devices {max_windows}")


def test_chains_end_at_non_local_layers_and_coedge_exchanges_before_windows():
    graph = spatial_graph(Windows().eval(), torch.zeros(1, 3, 37, 30))
    assert [s.kind for s in graph.stages] == ["chain", "rest"]
    assert {type(graph.gm.get_submodule(str(n.target))).__name__ for n in graph.stages[1].nodes
            if n.op == "call_module"} == {"AdaptiveAvgPool2d", "Flatten", "Linear"}
    groups = coedge_groups(graph.chains[0].ops)
    assert [g[0].kind for g in groups] == ["conv", "conv", "maxpool", "conv", "avgpool", "conv", "avgpool"]
    cut = spatial_graph(Windows().eval(), torch.zeros(1, 3, 37, 30), max_windows=2)
    assert [c.windows for c in cut.chains] == [2, 2, 2, 2]


def test_the_program_moves_only_the_rows_a_device_needs(engine):
    graph = spatial_graph(nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(1, 1, 3, padding=1)).eval(),
                          torch.zeros(1, 1, 20, 5))
    steps = StagePrograms(engine, graph, ["a", "b"], "a", 1, graphs=False).program([(0.5, 0.5)]).steps
    moves = {s.name: s.rows for s in steps if s.kind == "transfer"}
    assert moves["move x[0:12] host->a"] == (0, 12) and moves["move x[8:20] host->b"] == (8, 20)  # halo of 2
    coedge = StagePrograms(engine, graph, ["a", "b"], "a", 1, graphs=False).program([(0.5, 0.5)], "coedge").steps
    halos = sorted(s.name for s in coedge if s.kind == "transfer" and "#" in s.name and "->host" not in s.name)
    assert halos == ["move _0#a[9:10] a->b", "move _0#b[10:11] b->a", "move _1#b b->a"]  # a row each way, a gather


# --- the planner on made-up costs --------------------------------------------------------------------------


def linear(cpu: float, gpu: float, join: float = 0.0):
    """Device 0 takes ``cpu`` s for all rows, device 1 ``gpu`` s; joining costs ``join`` when both work."""
    def measure(shares):
        both = all(s > 0 for s in shares)
        return ChainCost((shares[0] * cpu, shares[1] * gpu), join if both else 0.0)
    return measure


def test_planner_converges_to_balanced_sides():
    plan = balance(linear(10.0, 2.0), r0=0.5, s0=0.1, threshold=0.05)
    assert plan.balanced and abs(plan.ratio - 1 / 6) < 0.02
    cpu, gpu = plan.cost.sides
    assert abs(cpu - gpu) <= 0.05 * max(cpu, gpu)
    # exact: Python float arithmetic on the test's own figures
    assert [s for s, _ in plan.trace[:3]] == [(0.5, 0.5), (0.4, 0.6), (0.3, 0.7)]  # steps of s0 off the slower


def test_planner_keeps_one_device_alone_when_the_join_costs_more():
    plan = balance(linear(10.0, 2.0, join=1.0))
    assert plan.shares == (0.0, 1.0)  # exact: Python float arithmetic on the test's own figures
    assert {(1.0, 0.0), (0.0, 1.0)} <= {s for s, _ in plan.trace}  # r = 1 and r = 0 always measured
    # exact: Python float arithmetic on the test's own figures
    assert balance(linear(1.0, 50.0, join=0.1)).shares == (1.0, 0.0)
    assert balance(linear(1.0, 50.0)).ratio > 0.95  # no join: the slow device still takes a few rows


def test_planner_threshold_and_step_halving_end_the_search():
    loose = balance(linear(3.0, 2.0), r0=0.5, threshold=0.5)
    # exact: Python float arithmetic on the test's own figures
    assert loose.balanced and loose.trace[0][0] == (0.5, 0.5) and loose.shares == (0.5, 0.5)
    lumpy = balance(lambda s: ChainCost((round(s[0] * 4) * 2.5, round(s[1] * 4) * 1.0)), s0=0.3, threshold=0.0)
    assert not lumpy.balanced and "step below" in lumpy.reason and len(lumpy.trace) < 20


def test_planner_spreads_over_three_devices():
    plan = balance(lambda s: ChainCost((s[0] * 1.0, s[1] * 2.0, s[2] * 4.0)), devices=3, s0=0.1, threshold=0.05)
    assert plan.balanced and plan.shares[0] > plan.shares[1] > plan.shares[2] > 0


# --- the strategies through run_strategy on cpu2 ---------------------------------------------------------------


def run(name: str, mode: str, params: dict | None = None, model: str = "lenet"):
    workload = Workload.from_spec(WorkloadSpec(128, input_shape(model)))
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    ctx = RunContext(ModelSpec(model), workload, mode=mode, latency_runs=6, check_images=16, standalone_seconds=0.05)
    try:
        return run_strategy(name, params or {}, pool, ctx)
    finally:
        pool.shutdown()


@pytest.mark.parametrize("mode", ["latency", pytest.param("throughput", marks=pytest.mark.slow)])  # ~8 s
def test_split_runs_checked_with_baselines_chain_timings_and_temperature(mode):
    m = run("split", mode, {"runs": 2, "batch": 32})
    assert m.output_ok, m.failures
    assert set(m.extra["baselines"]) == {"cpu0", "cpu1"} and m.extra["best_single"]["device"] in ("cpu0", "cpu1")
    table = m.extra["chain_table"]
    assert len(table) == len(m.extra["ratios"]) == m.extra["chains"] == 1
    assert {"side_ms", "join_ms", "total_ms", "search", "rows"} <= set(table[0])
    assert any(e["shares"] in ([1.0, 0.0], [0.0, 1.0]) for e in table[0]["search"])
    devices = m.extra["temperature"]["devices"]  # every readable sensor, or why there is none
    assert devices.get("unavailable") or all(d["max_c"] is not None for d in devices.values())
    if mode == "throughput":
        assert m.limit_ips == pytest.approx(sum(b["ips"] for b in m.extra["baselines"].values()))
    else:
        assert m.latency_ms["p50"] > 0 and m.limit_ips is None


@pytest.mark.parametrize("mode", ["latency", pytest.param("throughput", marks=pytest.mark.slow)])  # ~8 s
def test_coedge_runs_checked_with_a_per_layer_table(mode):
    m = run("coedge", mode, {"runs": 1, "batch": 32})
    assert m.output_ok, m.failures
    assert all(e.busy_estimated for e in m.executors)  # one timed frame, scaled: labelled an estimate
    layers = m.extra["layer_table"]
    assert [layer["layer"] for layer in layers] == ["features_0", "features_1", "features_2", "features_3"]
    assert all(set(layer["compute_ms"]) == {"cpu0", "cpu1"} for layer in layers)
    assert m.extra["shares_from"] == "measured speeds" and abs(sum(m.extra["ratios"]) - 1) < 1e-3


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_given_ratios_are_used_as_given_and_checked():
    m = run("split", "latency", {"start": "given", "ratios": [0.25], "runs": 1})
    # exact: the given ratios, passed through
    assert m.output_ok and m.extra["ratios"] == [0.25] and "search" not in m.extra["chain_table"][0]
    with pytest.raises(UserError, match="needs ratios"):
        run("split", "latency", {"start": "given"})
    with pytest.raises(UserError, match="only used with start=given"):
        run("split", "latency", {"ratios": [0.5]})
    with pytest.raises(UserError, match="ratios has 3 values"):
        run("split", "latency", {"start": "given", "ratios": [0.5, 0.5, 0.5], "runs": 1})
    m = run("coedge", "latency", {"ratios": [0.8], "runs": 1})
    # exact: the given ratios, passed through
    assert m.output_ok and m.extra["ratios"] == [0.8, 0.2] and m.extra["shares_from"] == "given"


@pytest.mark.slow  # more than 10 s on the 2-core box
@pytest.mark.parametrize("name", ["split", "coedge"])
def test_a_user_model_with_a_non_square_input(name):
    model = "tests.split_user_model:tiny"
    assert input_shape(model) == (3, 40, 24)
    m = run(name, "latency", {"runs": 1}, model=model)
    assert m.output_ok, m.failures
    m = run(name, "throughput", {"runs": 1, "batch": 16, "max_temp": 150.0}, model=model)
    assert m.output_ok and "violation" not in m.extra


def test_space_sizes_give_the_chain_count():
    from autohet.strategies import get_strategy

    spec = load_pool("actors/cpu2.yaml")
    assert get_strategy("split").space_sizes(ModelSpec("lenet"), spec) == {"chains": 1}
    assert get_strategy("split").space_sizes(ModelSpec("tests.split_user_model:tiny"), spec) == {"chains": 1}


# --- the temperature constraint ---------------------------------------------------------------------------------


def test_temperature_unavailable_says_why(tmp_path):
    none = sensors.psutil_temperatures(read=dict) + sensors.sysfs_temperatures(tmp_path / "none")
    with thermal.TemperatureWatch(none) as watch:
        pass
    report = watch.report()
    assert "is empty" in report["unavailable"] and "no readable thermal zone" in report["unavailable"]
    assert temperature_violation(report, 10.0) is None  # unreadable: not checked, not a violation


def test_temperature_from_sysfs_and_a_violation(tmp_path, monkeypatch):
    zone = tmp_path / "thermal_zone0"
    zone.mkdir()
    (zone / "type").write_text("x86_pkg_temp\n")
    (zone / "temp").write_text("71500\n")
    assert sensors.read_temperatures(sensors.sysfs_temperatures(tmp_path))[0] == {"x86_pkg_temp": 71.5}
    hot = sensors.Sources(gauges=[sensors.Gauge("temp_c", lambda: {"cpu": 99.0})])
    monkeypatch.setattr(sensors, "default_sources", lambda gpus=(): hot)
    m = run("split", "latency", {"runs": 1, "max_temp": 80.0})
    assert m.extra["temperature"]["devices"]["cpu"]["max_c"] == 99.0  # exact: the fake sensor's reading
    assert "cpu reached 99.0 °C, above max_temp 80" in m.extra["violation"]


@pytest.mark.slow  # more than 10 s on the 2-core box
def test_bench_smoke_runs_and_writes_json(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "split.json"
    proc = subprocess.run([sys.executable, "-m", "bench.split", "--smoke", "--out", str(out)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert [r["cpu_share"] for r in got["rows"]] == [k / 10 for k in range(11)]
    assert all(got["results"][0][k]["output_ok"] for k in ("split_planned", "split_swept", "coedge"))
