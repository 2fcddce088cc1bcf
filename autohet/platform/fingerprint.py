"""The platform fingerprint recorded with every tune and exported config."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["cpu_model", "fingerprint", "fingerprint_differences", "usable_cores"]


def usable_cores() -> int:
    """Cores this process may run on (its affinity: a taskset or a container's cpuset), not the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo), else what the platform module reports."""
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.is_file() else ""
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    return names[0] if names else (platform.processor() or platform.machine())


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def fingerprint() -> dict[str, Any]:
    """CPU model and cores, GPU names, and the versions that change performance."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return {
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "gpus": gpus,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "ray": _version("ray"),
        "tvm": _version("apache-tvm"),
    }


# Keys whose difference makes a tuned config's figures meaningless elsewhere.
_HARDWARE_KEYS = ("cpu_model", "cpu_cores", "gpus", "machine", "torch")


def fingerprint_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    return [f"{k}: tuned on {recorded.get(k)!r}, now {current.get(k)!r}"
            for k in _HARDWARE_KEYS if k in recorded and recorded.get(k) != current.get(k)]
