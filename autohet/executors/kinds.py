"""Executor kinds by name: what class runs each, which executor parameters apply, what it needs.

One registry, as strategies have. A kind answers what callers used to decide by comparing its
name: whether it is a CPU core group or holds a GPU, the Ray resources its actor claims, the
device it names, and the kind-specific checks of a pool file's executor entry. ``ExecutorSpec``
delegates to it (``spec.kind_type``, ``spec.is_cpu``, ``spec.uses_gpu``, ...). A kind joins
with ``register_executor_kind``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autohet.core.errors import UserError, unknown_name

__all__ = ["EXECUTOR_KINDS", "ExecutorKind", "executor_kind", "register_executor_kind"]


@dataclass(frozen=True)
class ExecutorKind:
    """``target`` is ``module:Class``; ``params`` the executor parameters a trial may vary for it.

    ``simulated``: runs no model and pins nothing (its figures are labelled simulated);
    ``needs_cores``: a CPU core group, its ``cores:`` are its device; ``holds_gpu``: runs on a real
    GPU of its own, ``gpu:`` its index (default 0); ``unit_batches``: batches per call part
    (``ExecutorSpec.max_unit_images``).
    """

    name: str
    target: str
    params: tuple[str, ...]
    simulated: bool = False
    needs_cores: bool = False
    holds_gpu: bool = False
    unit_batches: int = 8

    def load_class(self) -> type:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)

    @property
    def is_cpu(self) -> bool:
        """A CPU core group: the cores it pins are its device."""
        return self.needs_cores and not self.holds_gpu and not self.simulated

    def uses_gpu(self, needs_gpu: bool = False) -> bool:
        """Holds a real GPU, or (``needs_gpu``, a simulated one) stands for one."""
        return self.holds_gpu or needs_gpu

    def pinned_cores(self, cores: Sequence[int]) -> tuple[int, ...]:
        """The cores an executor of this kind occupies: none for a simulated one."""
        return () if self.simulated else tuple(cores)

    def ray_resources(self, cores: Sequence[int], needs_gpu: bool = False,
                      reserve_cpus: bool = True) -> dict[str, int]:
        """Ray ``num_cpus``/``num_gpus`` of its actor: one Ray CPU per pinned core (none where the
        owner keeps the cores itself, ``reserve_cpus=False``), one GPU where it uses a GPU."""
        return {"num_cpus": len(self.pinned_cores(cores)) if reserve_cpus else 0,
                "num_gpus": 1 if self.uses_gpu(needs_gpu) else 0}

    def torch_device(self, gpu: int | None) -> str | None:
        """The torch device it computes on ('cuda:N' or 'cpu'); None for a simulated kind."""
        if self.simulated:
            return None
        return f"cuda:{gpu or 0}" if self.holds_gpu else "cpu"

    def device_label(self, cores: Sequence[int], gpu: int | None, sms: int | None, needs_gpu: bool) -> str:
        """Where an executor runs, as reports show it: 'cuda:0/66sm', 'cpu[0,1]', 'simulated-gpu'."""
        if self.simulated:
            return "simulated-gpu" if needs_gpu else "simulated"
        if self.holds_gpu:
            return f"cuda:{gpu}" + (f"/{sms}sm" if sms else "")
        return "cpu[" + ",".join(map(str, cores)) + "]"

    def parse_gpu(self, entry: Mapping[str, Any], where: str) -> Any:
        """A pool entry's ``gpu:`` for this kind: where it holds a GPU, an index (absent: 0), else
        the value as given (absent: None). ``where`` names the entry in the error."""
        if not self.holds_gpu:
            return entry.get("gpu")
        gpu = entry.get("gpu", 0)
        if not isinstance(gpu, int) or gpu < 0:
            raise UserError(f"{where}: gpu must be a GPU index like 0")
        return gpu

    def check_cores(self, cores: Sequence[int], where: str) -> None:
        """A core group's entry must name its cores."""
        if self.needs_cores and not cores:
            raise UserError(f"{where}: a {self.name} executor needs cores, e.g. cores: [0]")

    def check_speed(self, speed_ips: float, where: str, name: str) -> None:
        """A simulated entry must give its speed."""
        if self.simulated and speed_ips <= 0:
            raise UserError(f"{where}: simulated executor {name} needs speed_ips > 0")

EXECUTOR_KINDS: dict[str, ExecutorKind] = {
    "cpu": ExecutorKind("cpu", "autohet.executors.cpu:CpuExecutor",
                        ("batch", "precision", "channels_last", "backend", "inductor_mode", "streams"),
                        needs_cores=True),
    "gpu": ExecutorKind("gpu", "autohet.executors.gpu:GpuExecutor",
                        ("batch", "precision", "channels_last", "backend", "inductor_mode", "sms"),
                        holds_gpu=True, unit_batches=16),
    "sim": ExecutorKind("sim", "autohet.executors.sim:SimExecutor", ("batch",), simulated=True),
}


def executor_kind(name: str) -> ExecutorKind:
    """The registered kind of that name; an unknown name is a UserError listing the valid ones."""
    if name not in EXECUTOR_KINDS:
        raise unknown_name("executor kind", name, list(EXECUTOR_KINDS))
    return EXECUTOR_KINDS[name]


def register_executor_kind(kind: ExecutorKind) -> None:
    EXECUTOR_KINDS[kind.name] = kind
