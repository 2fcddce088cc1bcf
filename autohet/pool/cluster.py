"""``auto`` on a Ray cluster: executors detected on every alive node, placed on that node."""

from __future__ import annotations

from typing import Any

import yaml

from autohet.pool.spec import PoolSpec, detect_executors

__all__ = ["detect_cluster_pool"]


def detect_cluster_pool(path: str | None) -> PoolSpec:
    """One executor per GPU and CPU groups of ``cpu_group_size`` on each node of the joined cluster."""
    import ray

    settings: dict[str, Any] = {}
    if path not in (None, "auto"):
        with open(path) as f:
            settings = (yaml.safe_load(f) or {}).get("auto") or {}
    nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["NodeID"])
    execs = []
    for k, node in enumerate(nodes):
        res = node["Resources"]
        cores = list(range(int(res.get("CPU", 0))))
        prefix = f"n{k}-" if len(nodes) > 1 else ""
        execs += detect_executors(cores, int(res.get("GPU", 0)), settings, node=node["NodeID"], prefix=prefix)
    return PoolSpec("auto-cluster", execs, f"auto on {len(nodes)} Ray nodes", settings)
