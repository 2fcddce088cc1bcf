"""A 2-node local Ray cluster: executors placed on both nodes, one scheduler across them."""

from __future__ import annotations

import json

import pytest

from autohet.context import RunContext
from autohet.executors import ExecutorSpec
from autohet.models import ModelSpec
from autohet.pool import PoolSpec, RayPool
from autohet.running import run_strategy
from autohet.workload import Workload, WorkloadSpec

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    from autohet.ray_runtime import init_ray, ray_temp_dir

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "temp_dir": ray_temp_dir()})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    init_ray(address=c.address)
    yield c
    ray.shutdown()
    c.shutdown()


def test_scheduler_runs_across_two_nodes(cluster):
    import ray

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(nodes) == 2
    spec = PoolSpec("two-nodes", [ExecutorSpec("a", "cpu", (0,), batch=32, node="0"),
                                  ExecutorSpec("b", "cpu", (1,), batch=32, node="1")])
    workload = Workload.from_spec(WorkloadSpec(2000, (1, 28, 28)))
    pool = RayPool(spec)
    try:
        m = run_strategy("fast_split", {}, pool, RunContext(ModelSpec("lenet"), workload,
                                                            standalone_seconds=0.2))
        placed = sorted(ray.get([a.node_id.remote() for a in pool.actors]))
    finally:
        pool.shutdown()
    assert placed == nodes
    assert m.output_ok
    assert all(e.images > 0 for e in m.executors)


def test_cli_auto_pool_spans_the_cluster(cluster, capsys):
    from autohet.cli import main

    code = main(["run", "--model", "lenet", "--strategy", "fifo", "--images", "1000", "--address",
                 cluster.address, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["output_ok"]
    assert sorted(e["name"] for e in out["executors"]) == ["n0-cpu0", "n1-cpu0"]
