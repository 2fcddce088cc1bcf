"""The CLI: every bad input is one line naming the fix with a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autohet.cli import main


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
def test_done_when_command_through_ray(tmp_path):
    """The issue's acceptance command (fewer images to keep CI short), through the console script."""
    proc = subprocess.run([sys.executable, "-m", "autohet.cli", "run", "--model", "lenet", "--strategy",
                           "fast_split", "--images", "3000", "--pool", "actors/cpu2.yaml", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["output_ok"] is True and 0 < out["efficiency"] <= 1.5


def test_profile_reports_every_executor_at_every_batch(capsys):
    code = main(["profile", "--model", "lenet", "--pool", "actors/cpu2.yaml", "--in-process", "--batches", "1,8",
                 "--seconds", "0.05", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and [e["name"] for e in out["executors"]] == ["cpu0", "cpu1"]
    assert all(set(e["ips_by_batch"]) == {"1", "8"} and min(e["ips_by_batch"].values()) > 0 for e in out["executors"])
