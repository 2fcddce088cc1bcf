"""Channel partitioning (seed 004): OCP and IOP pieces reproduce the model on CPU devices, the
pairing planner on made-up costs, and the strategy end to end on two CPU groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from autohet.context import TOLERANCE, RunContext
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.core.workload import Workload, WorkloadSpec
from autohet.engine import CpuDevice, Engine
from autohet.planners.pairing import (
    LayerCost,
    Unit,
    channel_counts,
    compare_pairs,
    layer_shares,
    linear_link,
    plan_pairing,
    proportional_shares,
)
from autohet.pool import LocalPool, load_pool
from autohet.strategies import get_strategy
from autohet.strategies.channels._layers import channel_graph
from autohet.strategies.channels._programs import ChannelPrograms
from autohet.strategy_run import run_strategy
from tests.numerics import assert_fp32_close


class Net(nn.Module):
    """conv-bn-relu -> conv-bn-relu-pool (IOP-able), a depthwise conv and a residual add (whole),
    conv-relu -> adaptive pool -> flatten -> linear (IOP over the flatten), linear-relu-dropout -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64)
        self.conv2, self.bn2 = nn.Conv2d(64, 30, 3), nn.BatchNorm2d(30)
        self.pool = nn.MaxPool2d(2)
        self.dw = nn.Conv2d(30, 30, 3, padding=1, groups=30)
        self.conv3 = nn.Conv2d(30, 17, 1, bias=False)
        self.avg = nn.AdaptiveAvgPool2d(2)
        self.fc1, self.drop, self.fc2 = nn.Linear(17 * 4, 33), nn.Dropout(0.5), nn.Linear(33, 7)
        for bn in (self.bn1, self.bn2):  # non-trivial running statistics: slicing them must be right
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        x = self.dw(x) + x
        x = torch.flatten(self.avg(torch.relu(self.conv3(x))), 1)
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


@pytest.fixture(scope="module")
def engine():
    eng = Engine([CpuDevice("a", (0,)), CpuDevice("b", (1,)), CpuDevice("c", (0,))])
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = model(x)
    return model, x, ref, channel_graph(model, x)


def test_analysis_finds_layers_chains_and_pairs(net):
    _, _, _, g = net
    assert [layer.name for layer in g.layers] == ["conv1", "conv2", "conv3", "fc1", "fc2"]  # dw is grouped
    assert [layer.pairs_next for layer in g.layers] == [True, False, True, True, False]
    assert [n.name for n in g.layers[1].chain] == ["bn2", "relu_1", "pool"]  # the add reads the pool twice
    assert g.layers[2].spatial == 4 and [n.name for n in g.layers[2].bridge] == ["flatten"]
    assert [layer.channels for layer in g.layers] == [64, 30, 17, 33, 7]


def _units(g, devices, shares, firsts: set[int]) -> list[Unit]:
    """OCP everywhere but IOP at the pairs starting at ``firsts``."""
    units, i = [], 0
    while i < len(g.layers):
        counts = channel_counts(shares, g.layers[i].channels)
        if i in firsts:
            units.append(Unit("iop", (i, i + 1), counts, 0.0))
            i += 2
        else:
            units.append(Unit("ocp", (i,), counts, 0.0))
            i += 1
    return units


@pytest.mark.parametrize("devices,shares", [
    (["a", "b"], [0.5, 0.5]),
    (["a", "b"], [0.97, 0.03]),                 # one channel of conv2 and of conv3 on b, none of fc2
    (["a", "b", "c"], [0.33, 0.33, 0.34]),      # 64 channels over 3: 21/21/22
    (["a", "b", "c"], [0.6, 0.02, 0.38]),       # 1 channel of conv1 on b
])
@pytest.mark.parametrize("firsts", [set(), {0, 2}, {0, 3}], ids=["ocp", "iop-conv-flatten", "iop-linear"])
def test_partitioned_program_matches_the_model(engine, net, devices, shares, firsts):
    """OCP alone; IOP conv->conv (bn/relu between) and conv->pool->flatten->linear; IOP linear->linear."""
    model, x, ref, g = net
    programs = ChannelPrograms(engine, g)
    units = _units(g, devices, shares, firsts)
    for rest in (devices[0], devices[-1]):
        y = engine.run(programs.program(units, devices, rest), {"x": x})
        assert_fp32_close(y, ref, model, f"{devices} {shares} {firsts} rest={rest}")  # IOP sums reorder


def test_lenet_iop_over_flatten_and_linear_pair(engine):
    from autohet.core.models import build_model

    model = build_model("lenet")
    x = torch.randn(3, 1, 28, 28)
    ref = model(x).detach()
    g = channel_graph(model, x)
    assert [layer.pairs_next for layer in g.layers] == [True, True, True, False]
    programs = ChannelPrograms(engine, g)
    # conv2 -> flatten -> fc1 paired (4x4 features per channel), then fc2 alone on 3 devices
    units = [Unit("ocp", (0,), (7, 6, 7), 0), Unit("iop", (1, 2), (17, 16, 17), 0), Unit("ocp", (3,), (4, 3, 3), 0)]
    y = engine.run(programs.program(units, ["a", "b", "c"], "b"), {"x": x})
    assert_fp32_close(y, ref, model)


def test_a_units_time_is_its_program_less_the_empty_one_and_never_negative(engine, net, monkeypatch):
    """``unit_time`` = the unit's program's median less a one-step program's from the same source; a
    difference below zero (noise on a unit cheaper than its hand-offs) is 0, not a negative cost."""
    _, _, _, g = net
    programs = ChannelPrograms(engine, g)
    unit = Unit("iop", (0, 1), (32, 32), 0.0)
    for timed, want in (([0.005, 0.002], 0.003), ([0.001, 0.002], 0.0)):
        seen, steps = iter(timed), []

        def fake(program_steps, *args, _seen=seen, _steps=steps):
            _steps.append(len(program_steps))
            return next(_seen)

        monkeypatch.setattr(programs, "_time", fake)
        assert programs.unit_time(unit, ["a", "b"], "a") == pytest.approx(want)
        assert steps[0] > 1 and steps[1] == 1  # the unit's steps, then the empty program's one


def test_timings_cover_every_layer_and_unit(engine, net):
    _, _, _, g = net
    programs = ChannelPrograms(engine, g)
    times = programs.layer_times(["a", "b"], runs=2, warmup=1)
    assert set(times) == {(i, d) for i in range(5) for d in ("a", "b")} and min(times.values()) > 0
    unit = Unit("iop", (0, 1), (32, 32), 0.0)
    # a conv pair split over two devices with its hand-offs and join, less a one-step program: it takes time
    assert programs.unit_time(unit, ["a", "b"], "a", runs=5, warmup=1) > 0
    assert set(programs.hop_times(["a", "b"], "a", runs=3, warmup=1)) == {("a", "b"), ("b", "a")}


@pytest.mark.gpu
@pytest.mark.parametrize("precision,graphs,sms", [("fp32", True, None), ("fp32", False, None), ("fp16", True, None),
                                                 ("fp32", True, (60, 60)), ("fp32", True, "two gpus")])
def test_gpu_pieces_match_the_model(net, precision, graphs, sms):
    """A GPU (whole, or two green-context partitions, or two GPUs: pieces moved GPU to GPU) next to a CPU
    group: graphed pieces, GPU joins and sums, transfers both ways; the rest device on either side."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from autohet.engine import GpuDevice
    from autohet.executors.green import sm_partitions

    model, x, ref, g = net
    if sms == "two gpus":
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two CUDA GPUs")
        gpus = [GpuDevice(f"g{k}", k, precision, True) for k in range(2)]
    elif sms:
        parts = sm_partitions(0, list(sms))
        gpus = [GpuDevice(f"g{k}", 0, precision, True, lambda p=p: p.stream) for k, p in enumerate(parts)]
    else:
        gpus = [GpuDevice("g0", 0, precision, True)]
    eng = Engine([*gpus, CpuDevice("a", (0,))])
    devices = [d.name for d in gpus] + ["a"]
    try:
        programs = ChannelPrograms(eng, g, graphs)
        tol = TOLERANCE[precision]  # the output check's own (GpuDevice turns TF32 off for fp32)
        shares = [0.5, 0.3, 0.2][-len(devices):] if len(devices) == 3 else [0.8, 0.2]
        for firsts in (set(), {0, 2}, {0, 3}):
            units = _units(g, devices, shares, firsts)
            for rest in (devices[0], "a"):
                program = programs.program(units, devices, rest)
                for _ in range(3):  # replays of the graphed pieces reuse their buffers
                    y = eng.run(program, {"x": x}).float()
                    err = float((y - ref).abs().max() / ref.abs().max())
                    assert err <= tol, (firsts, rest, err)
        assert programs.unit_time(Unit("iop", (0, 1), channel_counts(shares, 64), 0), devices, devices[0], 5, 1) > 0
    finally:
        eng.close()


# --- the planner on made-up costs ------------------------------------------------------------------

DEVICES = ["gpu", "cpu"]


def _layer(name: str, channels: int, t_gpu: float, t_cpu: float, in_b: float, out_b: float, sum_b: float,
           pairs: bool = True) -> LayerCost:
    return LayerCost(name, channels, {"gpu": t_gpu, "cpu": t_cpu}, in_b, out_b, sum_b, pairs)


def test_iop_is_chosen_when_communication_latency_dominates():
    layers = [_layer(f"l{i}", 64, 1e-3, 2e-3, 1e5, 1e5, 1e5) for i in range(4)]
    layers[-1] = _layer("l3", 64, 1e-3, 2e-3, 1e5, 1e5, 1e5, pairs=False)
    plan = plan_pairing(layers, DEVICES, "gpu", linear_link(latency_s=5e-3, bytes_per_s=1e10))
    assert [u.kind for u in plan.units] == ["iop", "iop"] and plan.pairing == [1, 0, 1, 0]
    assert all(c.iop_wins for c in plan.comparisons)
    # every IOP unit's modelled time: one broadcast, both layers' compute, one partial sum back
    share = plan.units[0].counts[1] / 64
    assert plan.units[0].modelled_s == pytest.approx(5e-3 + 1e-5 + share * 4e-3 + 5e-3 + 1e-5)


def test_ocp_is_chosen_when_partial_sums_outweigh_joins():
    # the second layer widens its output 100x: IOP sends it whole from every device, OCP only a share
    a = _layer("a", 64, 1e-3, 2e-3, 1e6, 1e5, 1e5)
    b = _layer("b", 64, 1e-3, 2e-3, 1e5, 1e7, 1e7, pairs=False)
    plan = plan_pairing([a, b], DEVICES, "gpu", linear_link(latency_s=1e-6, bytes_per_s=1e9))
    assert [u.kind for u in plan.units] == ["ocp", "ocp"] and plan.pairing == [0, 0]
    (cmp,) = plan.comparisons
    assert not cmp.iop_wins and cmp.iop_s > cmp.ocp_s


def test_shares_follow_rates_and_round_to_whole_channels():
    assert proportional_shares({"gpu": 1.0, "cpu": 3.0}, DEVICES) == pytest.approx([0.75, 0.25])
    assert channel_counts([0.75, 0.25], 10) == (8, 2)  # 7.5 and 2.5: the tie goes to the first
    assert channel_counts([1 / 3] * 3, 64) == (22, 21, 21)
    assert channel_counts([0.98, 0.02], 64) == (63, 1)
    assert channel_counts([1.0, 0.0], 5) == (5, 0)
    layers = [_layer("a", 10, 1.0, 3.0, 1, 1, 1), _layer("b", 10, 1.0, 1.0, 1, 1, 1, pairs=False)]
    assert layer_shares(layers, DEVICES, [0.2, 0.9]) == [[0.2, 0.8], [0.9, pytest.approx(0.1)]]
    assert layer_shares(layers, DEVICES, [1, 3, 1, 1]) == [[0.25, 0.75], [0.5, 0.5]]
    with pytest.raises(ValueError, match="2 \\(one per"):
        layer_shares(layers, DEVICES, [0.5, 0.5, 0.5])


def test_given_pairing_and_shares_are_followed():
    layers = [_layer(f"l{i}", 10, 1e-3, 1e-3, 1e4, 1e4, 1e4, pairs=i != 1) for i in range(4)]
    link = linear_link(latency_s=1e-9, bytes_per_s=1e15)  # pairing never wins on its own here
    plan = plan_pairing(layers, DEVICES, "gpu", link, pairing=[1, 1, 1, 1], shares=[0.3, 0.5, 0.7, 0.1])
    # l1 cannot pair (the 1 counts as 0), l3 is the last: pairs (0,1) and (2,3) as given
    assert [(u.kind, u.layers, u.counts) for u in plan.units] == [("iop", (0, 1), (3, 7)), ("iop", (2, 3), (7, 3))]
    # exact: Python float arithmetic on the test's own figures
    assert plan.pairing == [1, 0, 1, 0] and plan.shares[1] == [0.3, 0.7]
    assert [c.first for c in compare_pairs(layers, DEVICES, "gpu", link)] == [0, 2]
    with pytest.raises(ValueError, match="pairing has 2"):
        plan_pairing(layers, DEVICES, "gpu", link, pairing=[0, 1])


def test_unsplit_keeps_a_layer_whole_where_links_cost_more_than_the_split_saves():
    layers = [_layer("a", 100, 1e-3, 50e-3, 1e6, 1e6, 1e6, pairs=False)]
    slow = linear_link(latency_s=1e-3, bytes_per_s=1e8)
    (split,) = plan_pairing(layers, DEVICES, "gpu", slow).units
    assert split.kind == "ocp" and split.counts == (98, 2)
    (unit,) = plan_pairing(layers, DEVICES, "gpu", slow, unsplit=True).units
    assert unit.kind == "whole" and unit.counts == (100, 0) and unit.modelled_s == pytest.approx(1e-3)


# --- the strategy ----------------------------------------------------------------------------------


def _ctx(mode: str) -> RunContext:
    workload = Workload.from_spec(WorkloadSpec(96, (1, 28, 28)))
    return RunContext(ModelSpec("lenet"), workload, standalone_seconds=0.05, mode=mode, latency_runs=8,
                      check_images=16)


@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_strategy_runs_lenet_on_two_cpu_groups(mode):
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    try:
        m = run_strategy("channels", {"runs": 3, "batch": 16}, pool, _ctx(mode))
    finally:
        pool.shutdown()
    assert m.output_ok, m.failures
    e = m.extra
    assert e["layers"] == ["features.0", "features.2", "classifier.1", "classifier.3"]
    assert len(e["pairing"]) == 4 and len(e["shares"]) == 4 and e["rest"] in ("cpu0", "cpu1")
    assert sum(len(u["layers"]) for u in e["units"]) == 4
    assert all(u["modelled_ms"] > 0 and u["measured_ms"] >= 0 for u in e["units"])
    assert [(p["first"], p["second"]) for p in e["pairs"]] == [("features.0", "features.2"),
                                                              ("features.2", "classifier.1"),
                                                              ("classifier.1", "classifier.3")]
    assert all(p["iop_measured_ms"] >= 0 and p["ocp_measured_ms"] >= 0 for p in e["pairs"])
    if mode == "latency":
        assert m.latency_ms["p50"] > 0 and set(e["baselines_p50_ms"]) == {"cpu0", "cpu1"}
    else:
        assert m.limit_ips == pytest.approx(sum(e["baselines_ips"].values())) and m.throughput_ips > 0


def test_given_vectors_run_as_given():
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    params = {"start": "given", "pairing": [0, 1, 0, 0], "shares": [0.5, 0.25, 0.25, 1.0], "runs": 2,
              "compare": False, "rest": 0}
    try:
        m = run_strategy("channels", params, pool, _ctx("latency"))
    finally:
        pool.shutdown()
    assert m.output_ok, m.failures
    e = m.extra
    assert e["pairing"] == [0, 1, 0, 0] and e["rest"] == "cpu0" and "iop_measured_ms" not in e["pairs"][0]
    assert [(u["kind"], u["channels"]) for u in e["units"]] == [
        ("ocp", {"cpu0": 10, "cpu1": 10}), ("iop", {"cpu0": 13, "cpu1": 37}), ("ocp", {"cpu0": 10, "cpu1": 0})]


def test_bad_vectors_are_refused_in_one_line():
    pool = LocalPool(load_pool("actors/cpu2.yaml"))
    try:
        with pytest.raises(UserError, match="only used with start=given"):
            run_strategy("channels", {"pairing": [0, 0, 0, 0]}, pool, _ctx("latency"))
        with pytest.raises(UserError, match="pairing has 3 values; lenet has 4"):
            run_strategy("channels", {"start": "given", "pairing": [0, 0, 0]}, pool, _ctx("latency"))
        with pytest.raises(UserError, match="rest = 2"):
            run_strategy("channels", {"rest": 2}, pool, _ctx("latency"))
    finally:
        pool.shutdown()


def test_space_sizes_and_search_space():
    from autohet.tuning.space import load_search_space

    sizes = get_strategy("channels").space_sizes(ModelSpec("lenet"), load_pool("actors/cpu2.yaml"))
    assert sizes == {"layers": 4, "binary": 2}
    assert get_strategy("channels").space_sizes(ModelSpec("lenet"), load_pool("actors/cpu1.yaml")) == {}
    dims = load_search_space().strategies["channels"]
    assert dims["pairing"].size == "layers" and dims["pairing"].of == "binary"
    assert dims["shares"].size == "layers" and dims["pairing"].when == ("start", "given")


@pytest.mark.slow  # a benchmark subprocess, 5-9 s on the 2-core box, as the other bench smokes
def test_bench_smoke(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "channels.json"
    proc = subprocess.run([sys.executable, "-m", "bench.channels", "--smoke", "--modes", "latency", "--out", str(out)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    plans = [r for r in rows if r["row"] == "plan"]
    assert {r["name"] for r in plans} >= {"planned", "ocp", "iop"} and all(r["output_ok"] for r in plans)
    assert np.isfinite([r["measured_ms"] for r in plans]).all()
    assert [r["name"] for r in rows if r["row"] == "pair"] == ["features.0 + features.2", "features.2 + classifier.1",
                                                              "classifier.1 + classifier.3"]
