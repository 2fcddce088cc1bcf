"""Engine jobs are bounded like data-parallel runs: past the run's deadline a job is stopped and the
trial cut (RunTimeout), in this process and in the engine actor; a job in time returns its result."""

from __future__ import annotations

import threading
import time

import pytest

from autohet.core.errors import RunTimeout
from autohet.engine import EngineJob
from autohet.engine.jobs import run_job
from autohet.executors import ExecutorSpec
from tests.numerics import assert_fp32_close, assert_within_product_tolerance

SPECS = [ExecutorSpec("cpu0", "cpu", (0,))]


class BlockedJob(EngineJob):
    """Waits until released: it cannot finish before any deadline, whatever the machine's speed."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def run(self, engine):
        self.release.wait(120)  # bounded: a run_job that ignored its deadline returns late, not never
        return {"devices": sorted(engine.devices)}


class SleepingJob(EngineJob):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, engine):
        time.sleep(self.seconds)
        return {"devices": sorted(engine.devices)}


def test_an_in_process_job_past_its_deadline_is_a_run_timeout_naming_the_strategy() -> None:
    release = threading.Event()
    try:
        with pytest.raises(RunTimeout, match="split did not finish within 0 s"):
            run_job(BlockedJob(release), SPECS, on_ray=False, deadline_s=0.2, what="split")
    finally:
        release.set()  # the abandoned thread ends and closes its engine


def test_a_job_in_time_returns_its_result_with_or_without_a_deadline() -> None:
    release = threading.Event()
    release.set()
    assert run_job(BlockedJob(release), SPECS, on_ray=False, deadline_s=60.0)["devices"] == ["cpu0", "host"]
    assert run_job(BlockedJob(release), SPECS, on_ray=False)["devices"] == ["cpu0", "host"]


@pytest.mark.ray
@pytest.mark.slow  # with its Ray start, more than 10 s on the 2-core box
def test_the_engine_actor_is_stopped_past_the_deadline_and_the_next_job_gets_a_fresh_one(ray_local) -> None:
    with pytest.raises(RunTimeout, match="pipeline did not finish within 1 s .its engine was stopped"):
        run_job(SleepingJob(300.0), SPECS, on_ray=True, deadline_s=1.0, what="pipeline")
    assert run_job(SleepingJob(0.0), SPECS, on_ray=True, deadline_s=120.0)["devices"] == ["cpu0", "host"]


@pytest.mark.gpu
@pytest.mark.parametrize(("precision", "graph"), [("fp32", True), ("fp16", True), ("fp16", False)])
def test_served_requests_give_the_engine_paths_outputs(precision: str, graph: bool) -> None:
    """The lean batch-1 path (one copy in, one replay or eager call, one wait) computes what the
    engine's step-by-step program computes."""
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from autohet.core.models import build_model
    from autohet.engine import (
        Engine,
        GpuDevice,
        Step,
        device_module,
        request_latencies,
        served_request_latencies,
        with_transfers,
    )

    images = np.random.default_rng(0).standard_normal((6, 1, 28, 28)).astype(np.float32)
    engine = Engine([GpuDevice("g", 0, precision, channels_last=True)])
    try:
        dev = engine["g"]
        fn = device_module(build_model("lenet"), dev)
        times, outs, holds = served_request_latencies(dev, fn, list(images), graph=graph)
        program = with_transfers([Step("m", "g", ("x",), ("y",), fn)], ("x",), "y", engine.devices)
        _, ref = request_latencies(engine, program, list(images))
    finally:
        engine.close()
    assert holds.startswith("cuda graph") == graph and len(times) == 6 and min(times) > 0
    assert outs.shape == ref.shape == (6, 10) and outs.dtype == np.float32
    assert_within_product_tolerance(outs, ref, precision)  # a graph replay against eager launches


def test_served_requests_on_a_cpu_device_match_the_engine_path() -> None:
    import numpy as np

    from autohet.core.models import build_model
    from autohet.engine import (
        CpuDevice,
        Engine,
        Step,
        device_module,
        request_latencies,
        served_request_latencies,
        with_transfers,
    )

    images = np.random.default_rng(1).standard_normal((5, 1, 28, 28)).astype(np.float32)
    engine = Engine([CpuDevice("c", (0,))])
    try:
        fn = device_module(build_model("lenet"), engine["c"])
        times, outs, how = served_request_latencies(engine["c"], fn, list(images))
        program = with_transfers([Step("m", "c", ("x",), ("y",), fn)], ("x",), "y", engine.devices)
        _, ref = request_latencies(engine, program, list(images))
    finally:
        engine.close()
    assert how == "direct" and len(times) == 5 and min(times) > 0
    assert_fp32_close(outs, ref, build_model("lenet"))


def test_pinned_host_pins_a_bank_in_place_only_where_a_gpu_can_and_undoes_it() -> None:
    import numpy as np
    import torch

    from autohet.engine import pinned_host

    bank = np.zeros((8, 3, 4, 4), dtype=np.float32)
    with pinned_host(bank) as pinned:
        assert pinned == torch.cuda.is_available()
        assert torch.from_numpy(bank[2:5]).is_pinned() == pinned  # views of it are pinned too
    if torch.cuda.is_available():
        assert not torch.from_numpy(bank).is_pinned()
        bank.flags.writeable = False  # how the Ray object store hands workloads out
        with pinned_host(bank) as pinned:
            assert pinned and torch.from_numpy(bank).is_pinned()


@pytest.mark.ray
@pytest.mark.slow  # with its Ray start, more than 10 s on the 2-core box
def test_answer_or_none_gives_a_ready_answer_and_none_for_a_busy_or_dead_actor(ray_local) -> None:
    """Ray: the end of a tune asks its manager with a bound (``answer_or_none``), so a manager stuck in
    an executor's set-up (a compile cannot be interrupted) does not hold the command past its budget."""
    import ray

    from autohet.tuning.tuner import answer_or_none

    @ray.remote(num_cpus=0)
    class Slow:
        def stats(self, seconds: float) -> dict[str, int]:
            import time

            time.sleep(seconds)
            return {"topologies_started": 1}

    actor = Slow.remote()
    assert answer_or_none(actor.stats.remote(0.0), 60.0) == {"topologies_started": 1}
    assert answer_or_none(actor.stats.remote(120.0), 0.5) is None  # busy far longer than the bound
    ray.kill(actor)
    assert answer_or_none(actor.stats.remote(0.0), 60.0) is None  # gone (the memory monitor's kill): no answer


@pytest.mark.gpu
def test_a_pinned_stream_over_a_bank_that_wraps_gives_every_frame_in_order() -> None:
    """Frames that wrap around the bank (and the padded last one) are made pinned on the submitting
    thread; the outputs are those of the model, image by image, in order."""
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from autohet.core.models import build_model
    from autohet.core.workload import Workload
    from autohet.engine import Engine, GpuDevice, Step, device_module, pinned_host, stream_frames, with_transfers

    bank = np.random.default_rng(2).standard_normal((10, 1, 28, 28)).astype(np.float32)
    workload = Workload(bank, 37)  # frames of 4: 2, 5 and 7 wrap, 9 is padded
    model = build_model("lenet")
    engine = Engine([GpuDevice("g", 0, "fp32")])
    try:
        program = with_transfers([Step("m", "g", ("x",), ("y",), device_module(model, engine["g"]))], ("x",), "y",
                                 engine.devices)
        with pinned_host(workload.bank) as pinned:
            _, outs = stream_frames(engine, program, workload.rows, 37, 4, depth=3, pinned=pinned)
    finally:
        engine.close()
    with torch.inference_mode():
        ref = model(torch.from_numpy(workload.rows(0, 37))).numpy()
    assert pinned and outs.shape == (37, 10)
    assert_within_product_tolerance(outs, ref, "fp32")  # cuDNN's kernels against the CPU's
