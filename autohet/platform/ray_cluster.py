"""Starting or joining Ray quietly, with its files under runs/ rather than /tmp/ray and ~/.ray."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from autohet.core.settings import OBJECT_STORE_BYTES, env

__all__ = ["OBJECT_STORE_BYTES", "dump_stacks_later", "get_interruptibly", "handle_signals", "init_ray", "ray_temp_dir",
           "wait_interruptibly"]



def _raise(signum: int, frame: object) -> None:
    from autohet.core.errors import Interrupted

    raise Interrupted(signum)


def handle_signals() -> dict[int, object]:
    """SIGINT and SIGTERM raise Interrupted in the main thread; returns the handlers they replace.
    Called again after ``ray.init``: Ray's core worker installs a failure-signal handler that prints a
    C++ stack trace on SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}


def wait_interruptibly(refs: list[Any], timeout_s: float | None = None, poll_s: float = 0.5) -> list[Any]:
    """Those of ``refs`` not ready within ``timeout_s`` (None: waits for all), back in Python every
    ``poll_s``, so that a SIGINT or SIGTERM ends the command within about a poll: in a plain
    ``ray.get`` the signal's handler runs only once the result is back (docs/why.md,
    platform/ray_cluster.py)."""
    import time

    import ray

    pending = list(dict.fromkeys(refs))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        left = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
        if left <= 0:
            break
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=left)
    return pending


def get_interruptibly(refs: Any) -> Any:
    """``ray.get(refs)`` (one ref or a list) that a SIGINT or SIGTERM ends within about half a second."""
    import ray

    wait_interruptibly(refs if isinstance(refs, list) else [refs])
    return ray.get(refs)


def _ray_root() -> str:
    """runs/ when its socket paths stay short enough for Unix sockets, else the system temp dir."""
    runs = Path("runs").resolve()
    if len(str(runs)) <= 40:
        runs.mkdir(parents=True, exist_ok=True)
        return str(runs)
    return tempfile.gettempdir()


def ray_temp_dir() -> str:
    """The folder Ray keeps its sessions, sockets and logs in (``<root>/ray``)."""
    os.environ.setdefault("RAY_TMPDIR", _ray_root())
    return os.path.join(os.environ["RAY_TMPDIR"], "ray")


def dump_stacks_later() -> None:
    """For a hang: with ``AUTOHET_STACK_DUMP_S=N`` set, every thread's stack goes to stderr every N
    seconds, in the command's process (from its start) and (as Ray's worker setup hook) in every Ray
    worker, whose stderr is its ``worker-*.err`` log under the session's logs. For diagnosis only:
    faulthandler reads other threads' frames without the GIL, and a dump taken while torch.compile
    traces can crash the process (docs/why.md, platform/ray_cluster.py)."""
    seconds = float(env("AUTOHET_STACK_DUMP_S") or 0)
    if seconds > 0:
        import faulthandler

        faulthandler.dump_traceback_later(seconds, repeat=True)


def init_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None,
             resources: dict[str, float] | None = None, metrics_port: int | None = None) -> None:
    """Starts a local Ray (all cores, detected GPUs) or joins ``address``; no-op when already up.
    ``metrics_port``: where a local Ray's metrics agent serves Prometheus text (default: Ray's choice)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")  # ours ends the whole command in one line
    # compiled artefacts shared by every executor process, trial and later run (inherited by Ray's workers)
    cache = os.environ.setdefault("AUTOHET_COMPILE_CACHE", str(Path("runs").resolve() / "compile_cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache, "triton"))
    temp_dir = ray_temp_dir()
    import ray

    # token auth stays on; only its notice is kept off the terminal
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if ray.is_initialized():
        return
    common: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                                  namespace="autohet")
    if env("AUTOHET_STACK_DUMP_S"):
        common["runtime_env"] = {"worker_process_setup_hook": "autohet.platform.ray_cluster.dump_stacks_later"}
        dump_stacks_later()
    if address:
        ray.init(address=address, **common)
    else:
        # a bounded object store: Ray's default (30% of memory in /dev/shm) per local cluster can exhaust
        # /dev/shm on a shared machine; units, outputs and the workload bank need far less
        # address="local": always a new instance. Without it ray.init joins any Ray it finds running on the
        # machine (another user's, or a dying one), then fails on our num_cpus or waits 60 s for a dead GCS
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, resources=resources,
                 _temp_dir=temp_dir, object_store_memory=OBJECT_STORE_BYTES, _metrics_export_port=metrics_port,
                 **common)
    handle_signals()
