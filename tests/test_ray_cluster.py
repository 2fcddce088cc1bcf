"""A 2-node local Ray cluster (one for the module: its start costs seconds): executors placed on both
nodes, one scheduler across them, a pipeline's stage actors on their nodes, the CLI and the service
spanning both."""

from __future__ import annotations

import json

import pytest

from autohet.context import RunContext
from autohet.core.models import ModelSpec
from autohet.core.workload import Workload, WorkloadSpec
from autohet.executors import ExecutorSpec
from autohet.pool import PoolSpec, RayPool
from autohet.strategy_run import run_strategy

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    from autohet.platform.ray_cluster import init_ray, ray_temp_dir

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


def test_pipeline_stages_run_as_actors_on_their_nodes(cluster):
    import ray

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(nodes) == 2
    spec = PoolSpec("two-nodes", [ExecutorSpec("a", "cpu", (0,), batch=32, node="0"),
                                  ExecutorSpec("b", "cpu", (1,), batch=32, node="1")])
    pool = RayPool(spec)
    ctx = RunContext(ModelSpec("lenet"), Workload.from_spec(WorkloadSpec(1024, (1, 28, 28))), check_images=16)
    try:
        m = run_strategy("pipeline", {"start": "given", "cuts": [1], "stages": [0, 1]}, pool, ctx)
        planned = run_strategy("pipeline", {}, pool, ctx)
    finally:
        pool.shutdown()
    for run in (m, planned):
        assert run.output_ok, run.failures
        assert run.extra["runtime"] == "ray-actors"
        assert run.limit_ips > 0 and run.efficiency == pytest.approx(run.throughput_ips / run.limit_ips)
        assert run.efficiency <= 1.02 and set(run.extra["single_ips"]) == {"a", "b"}
    assert sorted(m.extra["nodes"].values()) == nodes  # one stage actor on each node
    assert [s["device"] for s in m.extra["stages"]] == ["a", "b"]
    assert all(s["frame_ms"] > 0 and s["compute_ms"] > 0 for s in m.extra["stages"])
    assert {"host->a", "a->b", "b->a", "b->host"} <= set(planned.extra["links"])
    assert planned.extra["modelled_bound_ips"] > 0


def test_cli_auto_pool_spans_the_cluster(cluster, capsys):
    from autohet.cli import main

    code = main(["run", "--model", "lenet", "--strategy", "fifo", "--images", "1000", "--address",
                 cluster.address, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["output_ok"]
    assert sorted(e["name"] for e in out["executors"]) == ["n0-cpu0", "n1-cpu0"]


def test_serve_puts_a_replica_on_the_second_node_and_refuses_a_replica_that_cannot_load(cluster, tmp_path):
    """``autohet serve --address``: a data-parallel config whose executors name both nodes serves
    over HTTP with one replica on each; a config whose replica fails to load is one line."""
    import io
    import urllib.request

    import numpy as np
    import ray

    from autohet.config import RunConfig, write_config
    from autohet.context import TOLERANCE
    from autohet.core.errors import UserError
    from autohet.core.models import build_model
    from autohet.service import Service, ServiceOptions
    from tests.test_serve import free_port

    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    worker = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)

    def service(strategy: str, params: dict, executors: list[ExecutorSpec], objective: str) -> Service:
        # the replicas' speeds as a tune exports them, equal: the router shares by them, and speeds measured
        # at warm-up on a loaded 2-core box sent all 40 images to one node (one CI run in several)
        config = RunConfig(ModelSpec("lenet"), PoolSpec("two", executors), strategy, params, images=64,
                           objective=objective, measured={"executor_ips": {e.name: 1000.0 for e in executors}})
        path = write_config(config, tmp_path / f"{strategy}.yaml")
        return Service(ServiceOptions(str(path), port=free_port(), address=cluster.address))

    broken = service("placement", {"start": "given", "assignment": [0, 0, 5], "x": 0},
                     [ExecutorSpec("a", "cpu", (0,), batch=16, node=head)], "latency")
    try:
        with pytest.raises(UserError, match="assignment has device index 5") as info:
            broken.start()
        assert len(str(info.value).splitlines()) == 1
    finally:
        broken.close()
    served = service("fifo", {"c": 16}, [ExecutorSpec("a", "cpu", (0,), batch=16, node=head),
                                          ExecutorSpec("b", "cpu", (1,), batch=16, node=worker)], "throughput")
    try:
        served.start()
        assert {r["name"]: r["node"] for r in served.replicas} == {"exec-a": head, "exec-b": worker}
        x = np.random.default_rng(5).standard_normal((40, 1, 28, 28), dtype=np.float32)
        body = io.BytesIO()
        np.save(body, x)
        request = urllib.request.Request(served.url + "/v1/predict", data=body.getvalue(), headers={
            "Content-Type": "application/x-npy", "Accept": "application/x-npy"})
        with urllib.request.urlopen(request, timeout=60) as response:
            out = np.load(io.BytesIO(response.read()))
        import torch

        with torch.inference_mode():
            ref = build_model(ModelSpec("lenet"))(torch.from_numpy(x)).numpy()
        assert float(np.abs(out - ref).max()) <= TOLERANCE["fp32"] * float(np.abs(ref).max())
        with urllib.request.urlopen(served.url + "/healthz", timeout=60) as response:
            routed = {r["name"]: r["images_routed"] for r in json.loads(response.read())["replicas"]}
        assert sum(routed.values()) == 40 and routed["exec-b"] > 0  # 40 images in chunks of 16: both nodes
        assert served.drain()[1] == 0
    finally:
        served.close()
