"""Pool files: explicit executors, auto detection, and the one-line errors for bad files."""

from __future__ import annotations

import pytest

from autohet.core.errors import UserError
from autohet.executors import ExecutorSpec
from autohet.pool import PoolSpec, check_local_devices, detect_executors, load_pool


def write(tmp_path, text):
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    return str(path)


def test_cpu2_pool_has_two_single_core_groups():
    spec = load_pool("actors/cpu2.yaml")
    assert [(e.kind, e.cores, e.threads) for e in spec.executors] == [("cpu", (0,), 1), ("cpu", (1,), 1)]


def test_auto_reserves_a_core_per_gpu_and_groups_the_rest():
    execs = detect_executors(list(range(16)), 1, {"cpu_group_size": 4, "gpu": {"batch": 256}})
    assert execs[0].kind == "gpu" and execs[0].cores == (0,) and execs[0].batch == 256
    assert [e.cores for e in execs[1:]] == [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15)]
    cpu_only = detect_executors([0, 1], 0, {"cpu_group_size": 1})
    assert [e.cores for e in cpu_only] == [(0,), (1,)]


def test_auto_group_size_is_one_core_without_a_gpu_and_four_next_to_one():
    assert [e.cores for e in detect_executors([0, 1, 2], 0, {"cpu_group_size": "auto"})] == [(0,), (1,), (2,)]
    gpu_box = detect_executors(list(range(16)), 1, {})
    assert [e.cores for e in gpu_box] == [(0,), (1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15)]
    with pytest.raises(UserError, match="auto, all or a whole number"):
        detect_executors([0], 0, {"cpu_group_size": "big"})


def test_auto_group_size_all_is_one_group_of_the_cores_the_gpus_leave():
    assert [e.cores for e in detect_executors([0, 1], 0, {"cpu_group_size": "all"})] == [(0, 1)]
    gpu_box = detect_executors(list(range(16)), 1, {"cpu_group_size": "all"})
    assert [(e.kind, e.cores) for e in gpu_box] == [("gpu", (0,)), ("cpu", tuple(range(1, 16)))]


def test_auto_yaml_on_this_machine_matches_its_cores():
    import os

    spec = load_pool("actors/auto.yaml")
    assert sum(len(e.cores) for e in spec.executors) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, fragment", [
    ("executors: [", "not valid YAML"),
    ("version: 7\nexecutors: []", "version 7"),
    ("executors: []", "non-empty list"),
    ("executors:\n  - {name: a, kind: tpu}", "kind: one of cpu, gpu, sim"),
    ("executors:\n  - {name: a, kind: cpu}", "needs cores"),
    ("executors:\n  - {name: a, kind: cpu, cores: [0], batchsize: 3}", "unknown key 'batchsize'"),
    ("executors:\n  - {name: a, kind: cpu, cores: [0], precision: fp8}", "one of fp32"),
    ("executors:\n  - {name: a, kind: cpu, cores: [0], batch: 0}", "out of range"),
    ("executors:\n  - {name: a, kind: cpu, cores: [0]}\n  - {name: a, kind: cpu, cores: [1]}", "unique"),
    ("auto: {cpu_group_size: 1}\nexecutors: []", "not both"),
    ("auto: {group: 2}", "no setting 'group'"),
    ("pools: []", "unknown key 'pools'"),
])
def test_bad_pool_files_give_one_line_errors(tmp_path, text, fragment):
    with pytest.raises(UserError) as info:
        load_pool(write(tmp_path, text))
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_pool_file():
    with pytest.raises(UserError, match="not found"):
        load_pool("actors/nope.yaml")


def test_gpu_pool_on_a_machine_without_gpu_names_the_fix():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    spec = PoolSpec("g", [ExecutorSpec("gpu0", "gpu", (), 0)], "gpu.yaml")
    with pytest.raises(UserError, match="actors/cpu2.yaml"):
        check_local_devices(spec)


def test_executor_params_override_per_kind():
    spec = load_pool("actors/cpu2.yaml").with_executor_params({"cpu": {"batch": 8, "precision": "bf16"}})
    assert {(e.batch, e.precision) for e in spec.executors} == {(8, "bf16")}
    with pytest.raises(UserError, match="out of range"):
        load_pool("actors/cpu2.yaml").with_executor_params({"cpu": {"batch": -1}})


def test_partitions_of_one_gpu_share_a_process_and_forward_calls_by_member():
    from autohet.executors import ExecutorSpec
    from autohet.pool import PoolSpec
    from autohet.pool.actors import MemberHandle, group_options

    spec = PoolSpec("p", [ExecutorSpec("a", "gpu", (0,), 0, sms=66), ExecutorSpec("c", "cpu", (2,)),
                          ExecutorSpec("b", "gpu", (1,), 0, sms=66), ExecutorSpec("w", "gpu", (3,), 1)])
    assert spec.partition_groups() == [[0, 2]]  # gpu 1 is whole: an actor of its own

    class Method:
        def __init__(self, log: list, name: str) -> None:
            self.log, self.name = log, name

        def remote(self, *args):
            self.log.append((self.name, args))
            return "ref"

    class FakeActor:
        def __init__(self) -> None:
            self.log: list = []

        def __getattr__(self, name):
            return Method(self.log, name)

    actor = FakeActor()
    assert MemberHandle(actor, 1).run.remote(0, 64, None) == "ref"
    assert actor.log == [("run", (1, 0, 64, None))]  # the member index goes first
    opts = group_options([spec.executors[0], spec.executors[2]], None, True)
    assert opts["num_gpus"] == 1 and opts["num_cpus"] == 2 and opts["max_concurrency"] >= 4


def test_auto_gpu_partitions_split_each_gpu_into_equal_sm_shares():
    gpu_box = detect_executors(list(range(8)), 1, {"gpu_partitions": 2}, sm_shares=[64])
    gpus = [(e.name, e.sms, e.cores) for e in gpu_box if e.kind == "gpu"]
    assert gpus == [("gpu0p0", 64, (0,)), ("gpu0p1", 64, (1,))]
    with pytest.raises(UserError, match="SM count"):
        detect_executors(list(range(8)), 1, {"gpu_partitions": 2})


def test_the_default_files_are_found_from_another_folder(tmp_path, monkeypatch):
    """``autohet tune`` run from another folder (a bench's work folder, a user's data folder) reads the
    project's own conf, pool and search space files by their relative names; a file of that folder
    comes first, and a name found in neither place still names the fix."""
    from autohet.core.yaml_files import PROJECT_ROOT, project_path
    from autohet.tuning.settings import load_settings
    from autohet.tuning.space import load_search_space

    monkeypatch.chdir(tmp_path)
    assert project_path("actors/cpu2.yaml") == PROJECT_ROOT / "actors/cpu2.yaml"
    assert load_pool("actors/cpu2.yaml").name == "cpu2"
    assert project_path("conf/default.yaml") == PROJECT_ROOT / "conf/default.yaml"
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "default.yaml").write_text("trials: 7\n")
    assert load_settings(None, {}).trials == 7  # the folder's own conf wins
    assert "fifo" in load_search_space("search_spaces").strategies
    (tmp_path / "actors").mkdir()
    (tmp_path / "actors" / "cpu2.yaml").write_text("executors:\n  - {name: mine, kind: cpu, cores: [0]}\n")
    assert load_pool("actors/cpu2.yaml").executors[0].name == "mine"  # the folder's own file wins
    with pytest.raises(UserError, match="not found; use"):
        load_pool("actors/nope.yaml")
    with pytest.raises(UserError, match="set search_spaces in the conf file"):
        load_search_space("no_spaces_here")
