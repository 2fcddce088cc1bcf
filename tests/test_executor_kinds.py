"""Executor kinds own what callers used to decide by comparing kind names (no Ray here)."""

from __future__ import annotations

import pytest

from autohet.core.errors import UserError
from autohet.executors import EXECUTOR_KINDS, ExecutorKind, ExecutorSpec, executor_kind, register_executor_kind
from autohet.pool.actors import actor_options


def test_kinds_answer_what_they_are() -> None:
    cpu, gpu, sim = (executor_kind(k) for k in ("cpu", "gpu", "sim"))
    assert (cpu.is_cpu, gpu.is_cpu, sim.is_cpu) == (True, False, False)
    assert (cpu.holds_gpu, gpu.holds_gpu, sim.holds_gpu) == (False, True, False)
    assert (cpu.uses_gpu(), gpu.uses_gpu(), sim.uses_gpu(), sim.uses_gpu(needs_gpu=True)) == (False, True, False, True)
    assert (cpu.torch_device(None), gpu.torch_device(2), sim.torch_device(None)) == ("cpu", "cuda:2", None)


def test_spec_delegates_to_its_kind() -> None:
    cpu = ExecutorSpec("cpu0", "cpu", (0, 1), batch=8)
    gpu = ExecutorSpec("gpu0", "gpu", (2,), 1, batch=8, sms=66)
    sim = ExecutorSpec("sim0", "sim", (3,), batch=8, needs_gpu=True, speed_ips=10.0)
    assert cpu.kind_type is EXECUTOR_KINDS["cpu"]
    assert [s.is_cpu for s in (cpu, gpu, sim)] == [True, False, False]
    assert [s.is_gpu for s in (cpu, gpu, sim)] == [False, True, False]
    assert [s.uses_gpu for s in (cpu, gpu, sim)] == [False, True, True]
    assert [s.simulated for s in (cpu, gpu, sim)] == [False, False, True]
    assert [s.device for s in (cpu, gpu, sim)] == ["cpu[0,1]", "cuda:1/66sm", "simulated-gpu"]
    assert [s.pinned_cores for s in (cpu, gpu, sim)] == [(0, 1), (2,), ()]
    assert [s.max_unit_images for s in (cpu, gpu, sim)] == [64, 128, 64]


def test_ray_options_claim_a_gpu_only_for_gpu_users() -> None:
    cpu = actor_options(ExecutorSpec("cpu0", "cpu", (0, 1)))
    gpu = actor_options(ExecutorSpec("gpu0", "gpu", (2,), 0), name="g")
    sim = actor_options(ExecutorSpec("sim0", "sim", (3,), needs_gpu=True, speed_ips=1.0))
    assert (cpu["num_cpus"], cpu["num_gpus"]) == (2, 0)
    assert (gpu["num_cpus"], gpu["num_gpus"], gpu["name"]) == (1, 1, "g")
    assert (sim["num_cpus"], sim["num_gpus"]) == (0, 1)
    assert actor_options(ExecutorSpec("cpu0", "cpu", (0, 1)), reserve_cpus=False)["num_cpus"] == 0


def test_gpu_index_defaults_and_is_checked_by_the_kind() -> None:
    gpu, cpu = executor_kind("gpu"), executor_kind("cpu")
    assert gpu.parse_gpu({}, "here") == 0
    assert gpu.parse_gpu({"gpu": 3}, "here") == 3
    assert cpu.parse_gpu({}, "here") is None
    with pytest.raises(UserError, match="here: gpu must be a GPU index"):
        gpu.parse_gpu({"gpu": -1}, "here")
    with pytest.raises(UserError, match="needs cores"):
        cpu.check_cores((), "here")
    with pytest.raises(UserError, match="needs speed_ips > 0"):
        executor_kind("sim").check_speed(0.0, "here", "sim0")


def test_unknown_kind_lists_the_valid_ones() -> None:
    with pytest.raises(UserError, match="unknown executor kind 'tpu'; valid: cpu, gpu, sim"):
        executor_kind("tpu")
    with pytest.raises(UserError, match="valid: cpu, gpu, sim"):
        _ = ExecutorSpec("t0", "tpu").uses_gpu


def test_a_registered_kind_brings_its_behaviour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autohet.executors.kinds.EXECUTOR_KINDS", dict(EXECUTOR_KINDS))
    register_executor_kind(ExecutorKind("npu", "autohet.executors.gpu:GpuExecutor", ("batch",), holds_gpu=True))
    spec = ExecutorSpec("npu0", "npu", (), 4)
    assert (spec.is_gpu, spec.uses_gpu, spec.is_cpu, spec.device) == (True, True, False, "cuda:4")
    assert "npu" not in EXECUTOR_KINDS  # registered in the test's copy only


def test_the_engine_device_follows_the_kind_not_a_gpu_claim() -> None:
    """A cpu entry that also claims a GPU (``needs_gpu``) still runs on its cores in the engine; a sim
    entry is refused there in one line."""
    from autohet.engine import CpuDevice, device_for

    assert isinstance(device_for(ExecutorSpec("cpu0", "cpu", (0,), batch=8, needs_gpu=True)), CpuDevice)
    with pytest.raises(UserError, match="in-process strategies run real devices"):
        device_for(ExecutorSpec("sim0", "sim", (3,), batch=8, speed_ips=10.0))
