"""``autohet run --config --input PATH --out FILE``: a folder of colour and grayscale JPEG/PNG (or an
.npy) through an exported config; outputs written atomically; unreadable files one line, or skipped
and listed; preprocessing as torchvision's ImageNet evaluation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import autohet
from autohet.cli import main
from autohet.config import Preprocess, RunConfig, load_config, write_config
from autohet.core.errors import UserError
from autohet.core.models import ModelSpec
from autohet.pool import load_pool
from autohet.runtime.images import Decoders, decode, list_images, preprocessing_for


@pytest.fixture
def images(tmp_path) -> Path:
    """Colour JPEG and PNG, grayscale PNG and JPEG (one in a sub-folder), and a text file to ignore."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(folder / "a.jpg")
    Image.fromarray(rng.integers(0, 255, (35, 35, 3), dtype=np.uint8)).save(folder / "b.png")
    Image.fromarray(rng.integers(0, 255, (50, 30), dtype=np.uint8)).save(folder / "sub" / "c.png")
    Image.fromarray(rng.integers(0, 255, (29, 64), dtype=np.uint8)).save(folder / "sub" / "d.JPEG")
    (folder / "notes.txt").write_text("not an image, not listed")
    return folder


def config(tmp_path, strategy: str = "fast_split", params: dict | None = None, objective: str = "throughput",
           preprocess: Preprocess | None = None) -> str:
    cfg = RunConfig(ModelSpec("lenet"), load_pool("actors/cpu2.yaml"), strategy, params or {}, images=64,
                    objective=objective, preprocess=preprocess)
    return str(write_config(cfg, tmp_path / f"{strategy}-{objective}.yaml"))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix in (".jsonl", ".npy"))


def test_a_folder_gives_one_jsonl_line_per_image_in_path_order(tmp_path, images, capsys):
    out = tmp_path / "x.jsonl"
    assert main(["run", "--config", config(tmp_path), "--input", str(images), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(r["path"]).relative_to(images).as_posix() for r in lines] == ["a.jpg", "b.png", "sub/c.png",
                                                                               "sub/d.JPEG"]
    for row in lines:
        assert len(row["top5"]) == 5 and len(set(row["top5"])) == 5 and all(0 <= i < 10 for i in row["top5"])
        assert row["scores"] == sorted(row["scores"], reverse=True) and 0 < sum(row["scores"]) <= 1.0 + 1e-5
    assert summary["images"] == 4 and summary["skipped"] == [] and summary["check"]["images"] == 4
    # the decoders take the cores that cpu2 (cores 0 and 1) leaves free, or share them all where none is
    # (the 2-core box); which one depends on the box, so the expectation follows its affinity
    allowed = sorted(os.sched_getaffinity(0))
    free = [c for c in allowed if c not in (0, 1)]
    assert summary["decode"]["cores"] == (free or allowed)
    assert summary["decode"]["shared_with_devices"] is (not free)


def test_a_corrupt_image_is_one_line_exit_2_and_no_output_file(tmp_path, images, capsys):
    (images / "sub" / "broken.jpg").write_bytes((images / "a.jpg").read_bytes()[:200])  # truncated
    out = tmp_path / "x.jsonl"
    assert main(["run", "--config", config(tmp_path), "--input", str(images), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.jpg is not a readable image" in err and "--skip-bad" in err
    assert leftovers(tmp_path) == []


def test_skip_bad_leaves_unreadable_files_out_and_lists_them(tmp_path, images, capsys):
    (images / "fake.png").write_text("this is not a png")
    out = tmp_path / "x.npy"
    assert main(["run", "--config", config(tmp_path), "--input", str(images), "--out", str(out), "--skip-bad",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [Path(s["path"]).name for s in summary["skipped"]] == ["fake.png"]
    assert np.load(out).shape == (4, 10) and leftovers(tmp_path) == ["x.npy"]
    assert main(["run", "--config", config(tmp_path), "--input", str(images), "--out", str(out), "--skip-bad"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 4 outputs" in printed and "skipped" in printed and "fake.png" in printed


def test_the_npy_output_equals_autohet_load_on_the_same_preprocessed_images(tmp_path, images):
    """A latency config serves each image as its own batch-1 request: the outputs cannot depend on how
    the stream was grouped, so they match exactly."""
    path = config(tmp_path, "single", {"executor": 0}, "latency")
    out = tmp_path / "x.npy"
    assert main(["run", "--config", path, "--input", str(images), "--out", str(out)]) == 0
    prep = preprocessing_for((1, 28, 28), None, path)
    x = np.stack([decode(p, prep) for p in list_images(images)])
    with autohet.load(path) as runner:
        expected = runner(x)
    # exact: one executor at batch 1 both times, same kernels and threads
    np.testing.assert_array_equal(np.load(out), expected)
    # the same inputs as an .npy file give the same outputs too
    np.save(tmp_path / "inputs.npy", x)
    jsonl = tmp_path / "y.jsonl"
    assert main(["run", "--config", path, "--input", str(tmp_path / "inputs.npy"), "--out", str(jsonl)]) == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["top5"][0] for r in rows] == [int(i) for i in expected.argmax(axis=1)]


CASES = {
    "bad suffix": (lambda tmp, folder: ["--input", str(folder), "--out", str(tmp / "x.csv")], "must end in .npy"),
    "no out": (lambda tmp, folder: ["--input", str(folder)], "--input needs --out"),
    "missing input": (lambda tmp, folder: ["--input", str(tmp / "nowhere"), "--out", str(tmp / "x.npy")],
                      "not found"),
    "out without input": (lambda tmp, folder: ["--out", str(tmp / "x.npy")], "go with --input"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_batch_arguments_are_one_line_exit_2(tmp_path, images, capsys, case):
    args, fragment = CASES[case]
    assert main(["run", "--config", config(tmp_path), *args(tmp_path, images)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err
    assert leftovers(tmp_path) == []


def test_an_empty_folder_and_a_wrong_npy_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["run", "--config", config(tmp_path), "--input", str(tmp_path / "empty"), "--out",
                 str(tmp_path / "x.npy")]) == 2
    assert "holds no JPEG/PNG images" in capsys.readouterr().err
    np.save(tmp_path / "wrong.npy", np.zeros((2, 3, 28, 28), np.float32))
    assert main(["run", "--config", config(tmp_path), "--input", str(tmp_path / "wrong.npy"), "--out",
                 str(tmp_path / "x.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert "lenet takes (N, 1, 28, 28)" in err and len(err.splitlines()) == 1
    # integer pixels other than uint8 would run unscaled as float32: refused, naming both fixes
    np.save(tmp_path / "ints.npy", np.zeros((2, 1, 28, 28), np.int64))
    assert main(["run", "--config", config(tmp_path), "--input", str(tmp_path / "ints.npy"), "--out",
                 str(tmp_path / "x.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds int64" in err and "numpy.uint8" in err and len(err.splitlines()) == 1
    assert leftovers(tmp_path) == ["ints.npy", "wrong.npy"]  # the inputs only: no output file


def test_default_preprocessing_matches_torchvision_imagenet_evaluation(tmp_path):
    from PIL import Image

    from autohet.core._tv import torchvision

    transforms = torchvision.transforms
    rng = np.random.default_rng(3)
    file = tmp_path / "photo.jpg"
    Image.fromarray(rng.integers(0, 255, (300, 410, 3), dtype=np.uint8)).save(file)
    prep = preprocessing_for((3, 224, 224), None, "test")
    assert prep.resize == 256
    expected = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                                   transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])(
        Image.open(file).convert("RGB")).numpy()
    np.testing.assert_allclose(decode(file, prep), expected, atol=1e-5)
    gray = preprocessing_for((1, 28, 28), None, "test")
    assert gray.resize == 32 and len(gray.mean) == 1
    assert decode(file, gray).shape == (1, 28, 28)


def test_a_preprocess_block_overrides_the_defaults_and_is_checked(tmp_path):
    block = Preprocess(resize=40, mean=(0.5,), std=(0.25,), interpolation="nearest")
    path = config(tmp_path, preprocess=block)
    loaded = load_config(path)
    assert loaded.preprocess == block
    prep = preprocessing_for((1, 28, 28), loaded.preprocess, path)
    assert (prep.resize, prep.mean, prep.std, prep.interpolation) == (40, (0.5,), (0.25,), "nearest")
    with pytest.raises(UserError, match="preprocess.mean has 2 values; the model takes 1 channels"):
        preprocessing_for((1, 28, 28), Preprocess(mean=(0.1, 0.2)), path)
    with pytest.raises(UserError, match="smaller than the model's 28x28 crop"):
        preprocessing_for((1, 28, 28), Preprocess(resize=20), path)
    raw = Path(path).read_text().replace("interpolation: nearest", "interpolation: lanczos")
    Path(path).write_text(raw)
    with pytest.raises(UserError, match="preprocess.interpolation must be one of nearest, bilinear, bicubic"):
        load_config(path)


def test_decoders_take_the_cores_the_config_leaves_free():
    import os

    cores = sorted(os.sched_getaffinity(0))
    busy = Decoders(frozenset(cores[:1]))
    try:
        assert (busy.cores, busy.shared) == ((cores[1:], False) if len(cores) > 1 else (cores, True))
    finally:
        busy.close()
    full = Decoders(frozenset(cores))
    try:
        assert full.cores == cores and full.shared
    finally:
        full.close()
