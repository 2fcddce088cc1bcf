"""The CLI: every bad input is one line naming the fix with a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from autohet.cli import main
from autohet.strategies._driver import RAISE_MARGIN


@pytest.fixture
def gpu_pool(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("executors:\n  - {name: gpu0, kind: gpu, gpu: 0, batch: 64}\n")
    return str(path)


@pytest.fixture
def bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("executors: [ {name: a, kind: cpu\n")
    return str(path)


CASES = {
    "unknown model": (["run", "--model", "vgg17", "--strategy", "fifo"], "unknown model 'vgg17'"),
    "unknown strategy": (["run", "--model", "lenet", "--strategy", "rr"], "unknown strategy 'rr'; valid:"),
    "unknown parameter": (["run", "--model", "lenet", "--strategy", "fifo", "--set", "chunk=3"],
                          "no parameter 'chunk'; valid: c"),
    "out of range": (["run", "--model", "lenet", "--strategy", "fast_split", "--set", "r=1.5"],
                     "out of range"),
    "bad type": (["run", "--model", "lenet", "--strategy", "fifo", "--set", "c=many"], "must be int"),
    "no images": (["run", "--model", "lenet", "--strategy", "fifo", "--images", "0"], "at least 1"),
    "missing strategy": (["run", "--model", "lenet"], "needs --model and --strategy"),
    "missing pool": (["run", "--model", "lenet", "--strategy", "fifo", "--pool", "nope.yaml"], "not found"),
    "missing config": (["run", "--config", "runs/none/best.yaml"], "not found"),
    "user model": (["run", "--model", "no_such_pkg:make", "--strategy", "fifo"], "PYTHONPATH"),
    "profile batches": (["profile", "--model", "lenet", "--batches", "a,b"], "integers"),
    "single out of pool": (["run", "--model", "lenet", "--strategy", "single", "--set", "executor=5",
                            "--pool", "actors/cpu2.yaml", "--in-process"], "out of range; the pool has 2"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, capsys):
    argv, fragment = CASES[case]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err
    assert len(err.splitlines()) == 1 and err.startswith("autohet: error:")


def test_malformed_pool_yaml(bad_yaml, capsys):
    assert main(["run", "--model", "lenet", "--strategy", "fifo", "--pool", bad_yaml]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and len(err.strip().splitlines()) == 1


def test_gpu_pool_without_gpu(gpu_pool, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["run", "--model", "lenet", "--strategy", "fifo", "--pool", gpu_pool]) == 2
    assert "has 0 CUDA GPUs; use actors/cpu2.yaml" in capsys.readouterr().err


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--no-such-flag"])
    assert info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_console_script_bad_input_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "autohet.cli", "run", "--model", "lenet", "--strategy",
                           "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "unknown strategy" in proc.stderr


def test_run_in_process_json_has_the_documented_keys(capsys):
    code = main(["run", "--model", "lenet", "--strategy", "hat", "--images", "600", "--pool",
                 "actors/cpu2.yaml", "--in-process", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("model", "strategy", "params", "images", "throughput_ips", "limit_ips", "efficiency",
                "output_ok", "max_abs_diff", "executors"):
        assert key in out
    assert out["output_ok"] is True and out["images"] == 600
    assert {"name", "device", "images", "busy_s", "standalone_ips"} <= set(out["executors"][0])


@pytest.mark.ray
@pytest.mark.slow  # with its Ray start, more than 10 s on the 2-core box
def test_done_when_command_through_ray(tmp_path):
    """The issue's acceptance command (fewer images to keep CI short), through the console script."""
    proc = subprocess.run([sys.executable, "-m", "autohet.cli", "run", "--model", "lenet", "--strategy",
                           "fast_split", "--images", "3000", "--pool", "actors/cpu2.yaml", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["output_ok"] is True and 0 < out["efficiency"] <= RAISE_MARGIN  # CPU groups: wall-timed


def test_profile_reports_every_executor_at_every_batch(capsys):
    code = main(["profile", "--model", "lenet", "--pool", "actors/cpu2.yaml", "--in-process", "--batches", "1,8",
                 "--seconds", "0.05", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and [e["name"] for e in out["executors"]] == ["cpu0", "cpu1"]
    assert all(set(e["ips_by_batch"]) == {"1", "8"} and min(e["ips_by_batch"].values()) > 0 for e in out["executors"])


def test_a_checkpoint_that_is_not_a_state_dict_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a pickle at all")
    assert main(["run", "--model", "lenet", "--strategy", "fifo", "--checkpoint", str(bad), "--pool",
                 "actors/cpu2.yaml", "--in-process"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a PyTorch state dict" in err and "torch.save" in err


def test_run_of_a_config_honours_the_images_given_to_main(tmp_path, capsys):
    from autohet.config import RunConfig, write_config
    from autohet.core.models import ModelSpec
    from autohet.pool import load_pool

    path = write_config(RunConfig(ModelSpec("lenet"), load_pool("actors/cpu2.yaml"), "fifo", {"c": 16},
                                  images=5000), tmp_path / "c.yaml")
    assert main(["run", "--config", str(path), "--images", "64", "--in-process", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 64


def test_a_run_past_its_timeout_ends_in_one_line_naming_a_faster_parameter(tmp_path, capsys):
    """A fixed chunk far too big for a slow executor: the run stops at --timeout, exit 2, one line.
    SIMULATED executors (100 and 10000 img/s): a 2000-image chunk is 20 s on the slow one, 10x the timeout."""
    pool = tmp_path / "slow.yaml"
    pool.write_text("executors:\n  - {name: fast, kind: sim, speed_ips: 10000, needs_gpu: true, batch: 64}\n"
                    "  - {name: slow, kind: sim, speed_ips: 100, batch: 16}\n")
    code = main(["run", "--model", "lenet", "--strategy", "fifo", "--set", "c=2000", "--set", "unit=images",
                 "--images", "4000", "--pool", str(pool), "--in-process", "--timeout", "2",
                 "--standalone-seconds", "0.05"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "did not finish within 2 s" in err and "still busy: slow" in err and "unit=batches" in err


def test_pool_suited_defaults_apply_only_when_none_of_their_keys_is_given():
    from autohet.executors import ExecutorSpec
    from autohet.pool import PoolSpec
    from autohet.strategies import get_strategy

    mixed = PoolSpec("m", [ExecutorSpec("g", "gpu", gpu=0), ExecutorSpec("c", "cpu", (0,))])
    fifo = get_strategy("fifo")
    assert fifo.validate(fifo.defaults_for(mixed, {})) == {"c": 4, "unit": "batches"}
    assert fifo.validate(fifo.defaults_for(mixed, {"c": 4096})) == {"c": 4096, "unit": "images"}  # the seed's unit
    cpu_only = PoolSpec("c", [ExecutorSpec("c0", "cpu", (0,)), ExecutorSpec("c1", "cpu", (1,))])
    assert fifo.validate(fifo.defaults_for(cpu_only, {})) == {"c": 1, "unit": "batches"}  # a batch: 0.05-3 s
    assert fifo.validate(fifo.defaults_for(cpu_only, {"c": 128})) == {"c": 128, "unit": "images"}
    sims = PoolSpec("s", [ExecutorSpec("s0", "sim", speed_ips=100.0), ExecutorSpec("s1", "sim", speed_ips=100.0)])
    assert fifo.validate(fifo.defaults_for(sims, {})) == {"c": 128, "unit": "images"}  # the seed's sizes
    gpus = PoolSpec("g", [ExecutorSpec("g0", "gpu", gpu=0, batch=256), ExecutorSpec("g1", "gpu", gpu=1, batch=256)])
    assert fifo.validate(fifo.defaults_for(gpus, {})) == {"c": 4, "unit": "batches"}  # whole batches, never padded
    assert get_strategy("chunk").validate(get_strategy("chunk").defaults_for(gpus, {})) == {"w": 8 * 512}
    one_gpu = PoolSpec("g", [ExecutorSpec("g0", "gpu", gpu=0, batch=256)])
    assert fifo.validate(fifo.defaults_for(one_gpu, {})) == {"c": 128, "unit": "images"}


@pytest.mark.ray
@pytest.mark.slow  # with its Ray start, more than 10 s on the 2-core box
@pytest.mark.parametrize("sig, code, word", [(15, 143, "terminated"), (2, 130, "interrupted")])
def test_a_signal_ends_the_command_in_one_line_with_ray_shut_down(sig, code, word):
    """The signal is sent once the command says it started its executors (a line on its stderr
    pipe: an event, not a wall-clock guess), while they measure for 60 s: the command ends long before
    the measurement would (Ray's blocking get held a signal until the call returned: 30 s in CI)."""
    import signal as signals

    proc = subprocess.Popen([sys.executable, "-m", "autohet.cli", "profile", "--model", "lenet", "--pool",
                             "actors/cpu2.yaml", "--batches", "1,2,4,8,16,32", "--seconds", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    watchdog = threading.Timer(300, proc.kill)  # bounded: a command that never starts is killed, its pipe closes
    watchdog.start()
    try:
        for line in proc.stderr:
            lines.append(line)
            if "measure" in line or "standalone" in line:
                break
    finally:
        watchdog.cancel()
    assert proc.poll() is None, "the command ended or was killed (300 s) before it started its executors: " + \
        "".join(lines)[-2000:]
    proc.send_signal(signals.Signals(sig))
    sent = time.monotonic()
    out, rest = proc.communicate(timeout=120)
    ended_s = time.monotonic() - sent
    err = "".join(lines) + rest
    assert proc.returncode == code, err[-2000:]
    assert ended_s < 30, f"the command ended {ended_s:.0f} s after the signal: it waited for the measurement"
    assert f"autohet: {word}; Ray shut down" in rest
    assert "Traceback" not in err and "SIGTERM received" not in err and "*** " not in err


def test_an_interrupt_wrapped_by_c_code_still_ends_as_an_interrupt(monkeypatch, capsys):
    """A signal landing while C code calls back into Python surfaces as a SystemError caused by our
    exception; it must end like any interrupt, not as an internal error."""
    from autohet import cli
    from autohet.commands import profile
    from autohet.core.errors import Interrupted

    def run(args):
        try:
            raise Interrupted(15)
        except Interrupted as exc:
            raise SystemError("<built-in method __new__> returned a result with an exception set") from exc

    monkeypatch.setattr(profile, "main", run)
    monkeypatch.setattr(cli, "_stop_ray", lambda: None)
    assert cli.main(["profile", "--model", "lenet"]) == 143
    assert capsys.readouterr().err.strip() == "autohet: terminated; Ray shut down"
