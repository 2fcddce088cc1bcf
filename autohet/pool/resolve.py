"""Which pool a command means: a pool file on this machine, or ``auto`` across a Ray cluster."""

from __future__ import annotations

from autohet.pool.spec import PoolSpec, check_local_devices, load_pool

__all__ = ["resolve_pool"]


def resolve_pool(path: str | None, address: str | None) -> PoolSpec:
    """Reads the pool file; on a cluster, ``auto`` spans every node."""
    if address and (path in (None, "auto") or str(path).endswith("auto.yaml")):
        from autohet.platform.ray_cluster import init_ray
        from autohet.pool.cluster import detect_cluster_pool

        init_ray(address)
        return detect_cluster_pool(path)
    spec = load_pool(path)
    if not address:
        check_local_devices(spec)
    return spec
