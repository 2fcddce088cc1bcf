"""Where a runner's process lives, for the service that hosts runners: the Ray node a pool file's
``node:`` names, this process's node, and page-locking host memory for the runner's GPU. The service
reaches devices and the cluster through these (and ``autohet.load``), never ``executors/`` or ``pool/``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

__all__ = ["current_node_id", "host_registrar", "ray_node_id"]


def ray_node_id(node: str) -> str:
    """The Ray node ID of a pool file's ``node:`` (index, node ID, IP or name); one line where the
    cluster has no such node."""
    from autohet.pool.actors import ray_node_id as node_id

    return node_id(node)


def current_node_id() -> str | None:
    """This process's Ray node (None outside Ray: unit tests)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:
        return None


def host_registrar(gpu: int) -> tuple[Callable[[int, int], bool], Callable[[int], None]]:
    """``register(address, size)`` and ``unregister(address)``: host memory page-locked with CUDA on the
    pool file's ``gpu`` (whatever thread calls them), so that the GPU's stream copies from it directly.
    ``register`` answers False where the memory cannot be page-locked (it is then staged by copy)."""
    import torch

    from autohet.executors.gpu import local_gpu_index

    cudart, device = torch.cuda.cudart(), local_gpu_index(gpu)
    portable = 1  # cudaHostRegisterPortable

    def register(address: int, size: int) -> bool:
        try:
            with torch.cuda.device(device):
                torch.cuda.check_error(cudart.cudaHostRegister(address, size, portable))
        except Exception:
            return False
        return True

    def unregister(address: int) -> None:
        with contextlib.suppress(Exception), torch.cuda.device(device):
            torch.cuda.check_error(cudart.cudaHostUnregister(address))

    return register, unregister
