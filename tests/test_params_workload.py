from __future__ import annotations

import numpy as np
import pytest

from autohet.core.errors import UserError
from autohet.core.params import (
    BoolParam,
    ChoiceParam,
    FloatListParam,
    FloatParam,
    IntListParam,
    IntParam,
    parse_set_options,
    validate_params,
)
from autohet.core.workload import MAX_DISTINCT_BYTES, Workload, WorkloadSpec


def test_set_options_are_yaml_scalars():
    assert parse_set_options(["w_s=64", "r=0.5", "ratios=[1,2]", "flag=true"]) == {
        "w_s": 64, "r": 0.5, "ratios": [1, 2], "flag": True}
    with pytest.raises(UserError, match="key=value"):
        parse_set_options(["w_s"])


def test_param_coercion_and_ranges():
    declared = {"c": IntParam("c", 8, low=1, high=100), "p": ChoiceParam("p", "a", choices=("a", "b"))}
    assert validate_params("x", declared, {"c": "12"}) == {"c": 12, "p": "a"}
    with pytest.raises(UserError, match="must be int"):
        validate_params("x", declared, {"c": "twelve"})
    with pytest.raises(UserError, match="one of a, b"):
        validate_params("x", declared, {"p": "z"})
    with pytest.raises(UserError, match="out of range"):
        validate_params("x", declared, {"c": 101})


def test_each_param_kind_converts_checks_and_says_whether_it_contains_a_value():
    assert IntParam("n", low=0, high=3).coerce("2", "x") == 2
    with pytest.raises(UserError, match="must be int"):
        IntParam("n").coerce(2.5, "x")
    assert FloatParam("r", low=0.0, high=1.0).contains(0.5) and not FloatParam("r", low=0.0, high=1.0).contains(2.0)
    assert BoolParam("b").coerce("yes", "x") is True
    with pytest.raises(UserError, match="must be bool"):
        BoolParam("b").coerce("maybe", "x")
    assert IntListParam("v", low=0).coerce("[1, 2]", "x") == [1, 2]
    with pytest.raises(UserError, match="out of range"):
        IntListParam("v", low=0).coerce([1, -1], "x")
    # exact: Python float arithmetic on the test's own figures
    assert FloatListParam("w").coerce([1, 2], "x") == [1.0, 2.0]
    assert ChoiceParam("u", choices=(1, 2)).coerce("2", "x") == 2  # YAML/CLI text matches the choice
    assert not IntParam("n").contains(True) and not IntParam("n").contains("3")


def test_synthetic_workload_is_seeded_and_bounded(monkeypatch):
    a = Workload.from_spec(WorkloadSpec(100, (1, 28, 28), seed=3))
    b = Workload.from_spec(WorkloadSpec(100, (1, 28, 28), seed=3))
    assert np.array_equal(a.rows(0, 100), b.rows(0, 100))  # exact: one seed, one generator
    per_image = 3 * 224 * 224 * 4
    assert MAX_DISTINCT_BYTES // per_image < 10_000  # the real cap bounds 10,000 ImageNet images
    # the cap applied, at 8 MB instead of the real 128 (drawing 128 MB of normals takes a second)
    monkeypatch.setattr("autohet.core.workload.MAX_DISTINCT_BYTES", 8 * 1024 * 1024)
    big = Workload.from_spec(WorkloadSpec(10_000, (3, 224, 224)))
    assert big.images == 10_000 and big.bank.nbytes <= 8 * 1024 * 1024
    n = len(big.bank)
    assert n == 8 * 1024 * 1024 // per_image
    # exact: bytes moved, no arithmetic
    assert np.array_equal(big.rows(n - 2, 4)[2:], big.rows(0, 2))  # cycles through the bank


def test_npy_workload(tmp_path):
    data = np.random.default_rng(0).standard_normal((20, 1, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    w = Workload.from_npy(str(tmp_path / "x.npy"), (1, 28, 28))
    assert w.images == 20 and np.array_equal(w.rows(5, 3), data[5:8])  # exact: bytes moved, no arithmetic
    with pytest.raises(UserError, match="reshape"):
        Workload.from_npy(str(tmp_path / "x.npy"), (3, 32, 32))
    with pytest.raises(UserError, match="not found"):
        Workload.from_npy(str(tmp_path / "missing.npy"), (1, 28, 28))


def test_the_check_sample_keeps_its_rows_at_any_length_once_the_images_cycle():
    bank = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
    short = Workload(bank, 8).indices_sample(4)
    assert short.tolist() == [0, 2, 5, 7]  # no cycle: evenly spread, first and last
    for images in (11, 37, 1000, 12345):
        sample = Workload(bank, images).indices_sample(4)
        assert sample[0] == 0 and sample[-1] == images - 1 and len(sample) <= 5
        assert set((sample[:-1] % 10).tolist()) <= {0, 3, 6, 9}  # the same rows, whatever the length
        spots = np.linspace(0, images - 1, 4)
        assert all(min(abs(s - sample)) <= 5 for s in spots)  # each within half a bank of its even spot


def test_references_are_cached_per_image_and_reused_by_runs_of_other_lengths():
    from autohet.context import RunContext
    from autohet.core.models import ModelSpec

    bank = np.random.default_rng(0).standard_normal((50, 1, 28, 28), dtype=np.float32)
    ctx = RunContext(ModelSpec("lenet"), Workload(bank, 400), check_images=16)
    sample = ctx.workload.indices_sample(16)
    first = dict(zip((sample % 50).tolist(), ctx.reference(sample, simulated=False), strict=True))
    assert ctx.reference_stats["computed"] == len(first) == 16 and ctx.reference_stats["reused"] == 0
    longer = ctx.with_images(910)  # the same bank: other positions, the same rows but the last image's
    sample = longer.workload.indices_sample(16)
    again = dict(zip((sample % 50).tolist(), longer.reference(sample, simulated=False), strict=True))
    new = set(again) - set(first)
    assert len(new) == 1 and ctx.reference_stats["computed"] == 17 and ctx.reference_stats["reused"] == len(again) - 1
    # exact: the cache hands back the outputs it computed
    assert all(np.array_equal(again[row], first[row]) for row in set(again) & set(first))


def test_the_reference_key_is_the_same_in_another_process():
    """Python's hash() of bytes differs per process: a tune's trial processes missed every reference the
    tuner had computed (issue 50). The key is a digest of the model and the image."""
    import subprocess
    import sys

    code = ("import numpy as np; from autohet.context import RunContext; from autohet.core.models import ModelSpec; "
            "from autohet.core.workload import Workload; "
            "bank = np.random.default_rng(0).standard_normal((3, 1, 28, 28), dtype=np.float32); "
            "print(RunContext(ModelSpec('lenet'), Workload(bank, 3))._reference_key(2))")
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout.strip()
            for seed in ("1", "2")}
    assert len(keys) == 1 and keys.pop().startswith("lenet:0:None:")
