"""A group of pinned CPU cores running the model: eager, inductor, OpenVINO or ONNX Runtime.

The thread that runs the model pins itself to the group's cores and sets its own intra-op thread
count (OpenMP keeps one thread team per calling thread), so two executors in one process run on
their own cores and nothing leaks into the caller's thread. Model variants (precision, layout,
backend) are built once per executor and kept: a trial that comes back to one pays nothing.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autohet.core.errors import UserError
from autohet.core.settings import KEEP_VARIANTS_MIN_AVAILABLE, env
from autohet.core.workload import Workload
from autohet.executors.base import Executor, UnitResult
from autohet.executors.compiled import check_backend
from autohet.executors.cpu_backends import CpuProgram, ModelSource, cpu_backend
from autohet.platform.cores import note_process_cores, own_threads
from autohet.platform.gc_control import let_go

__all__ = ["KEEP_VARIANTS_MIN_AVAILABLE", "CpuExecutor", "bind_team", "memory_available_share", "pin_thread"]

_PINNED = threading.local()



def memory_available_share() -> float:
    """The memory available to this process's group as a share of its total: the machine's, or its
    cgroup's limit where that is lower (a container; what Ray's memory monitor watches)."""
    import psutil

    memory = psutil.virtual_memory()
    total, available = memory.total, memory.available
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = int(Path(limit_file).read_text().strip())
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):  # no such cgroup file, or "max": no limit
            continue
        if 0 < limit < total:
            total, available = limit, min(available, max(0, limit - usage))
        break
    return available / max(1, total)


def bind_team(cores: tuple[int, ...]) -> list[int]:
    """Pins the calling thread to ``cores[0]`` and each thread of its OpenMP team to one more core of
    ``cores``; returns the team's thread ids (empty where nothing was bound).

    A team inherits its thread's affinity, the group's whole core set, and its threads move between
    those cores; two on one core would make every parallel region wait for the slower. A CPU stage ran
    at about twice its frame time in some spells (docs/why.md, executors/cpu.py); binding was the
    candidate, but on the machine it was tried on neither setting met a slow spell and the figures did
    not move, so it is off unless ``AUTOHET_BIND_TEAMS=1`` (an A/B switch for that measurement). The
    team is made here (one parallel op) and found as the new threads of this process with the group's
    affinity."""
    if len(cores) < 2 or not hasattr(os, "sched_setaffinity") or env("AUTOHET_BIND_TEAMS") != "1":
        return []
    group = set(cores)
    before = set(os.listdir("/proc/self/task"))
    torch.ones(1 << 22).add_(1.0)  # a parallel region: the team's threads exist after it
    team = list(getattr(_PINNED, "team", []))
    for tid in sorted(int(t) for t in set(os.listdir("/proc/self/task")) - before):
        try:
            if os.sched_getaffinity(tid) == group:
                team.append(tid)
        except OSError:  # ended since
            continue
    os.sched_setaffinity(threading.get_native_id(), {cores[0]})
    bound = []
    for k, tid in enumerate(team):
        try:
            os.sched_setaffinity(tid, {cores[(k + 1) % len(cores)]})
            bound.append(tid)
        except OSError:
            continue
    _PINNED.team = bound
    return bound


def yield_to_feeders() -> None:
    """Lowers the calling thread's priority to nice ``AUTOHET_CPU_NICE`` (default 10; 0: unchanged), and
    so that of the compute threads it makes afterwards (ONNX Runtime's workers, OpenVINO's, torch's
    OpenMP team inherit it). A CPU group's compute then gives way, on the cores it shares, to the host
    work that feeds the other devices: a GPU's staging copies, a stream's readers and collectors. Beside a
    GPU fed a float32 stream, a 15-core group and the staging copies shared every core and the stream ran
    at 0.65-0.78x its run, 0.80x with this (BENCHMARKS.md §32). The main thread is left alone: the
    threads it makes later are those feeders. Raising a thread's nice needs no privilege; lowering it
    again would, so it is done once."""
    if getattr(_PINNED, "yields", False) or threading.current_thread() is threading.main_thread():
        return
    _PINNED.yields = True
    nice = int(env("AUTOHET_CPU_NICE") or 0)
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError:  # not permitted here: the group keeps the priority it has
        return


def pin_thread(cores: tuple[int, ...], owner: str = "", yields: bool = False) -> None:
    """Pins the calling thread to ``cores`` and sets its intra-op threads to their number (bound one
    to a core with ``AUTOHET_BIND_TEAMS=1``, ``bind_team``), once per thread and core set. Executors
    and the engine's CPU devices both pin this way; ``owner`` names the caller in the error. ``yields``:
    a CPU group's compute thread, which gives way to the feeders (``yield_to_feeders``)."""
    if yields:
        yield_to_feeders()
    if getattr(_PINNED, "cores", None) == cores:
        return
    if cores and hasattr(os, "sched_setaffinity"):
        note_process_cores()  # before the process's first pinning: its compiles use them all
        available = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
        missing = sorted(set(cores) - available)
        if missing:
            raise UserError(f"{owner + ': ' if owner else ''}cores {missing} do not exist on this node (it has "
                            f"{os.cpu_count()}); fix the cores of the pool file or use actors/auto.yaml")
        os.sched_setaffinity(threading.get_native_id(), set(cores))
    own_threads(len(cores))
    bind_team(cores)
    _PINNED.cores = cores


@dataclass
class _Launched:
    """A unit started on an asynchronous program: the program's handle and when it was launched."""

    program: CpuProgram
    handle: Any
    launched: float


@dataclass
class _PieceParts:
    """A stream lane's piece left as the caller's parts (no joined copy): each part but the last is
    whole batches, so running them one after another makes the calls one joined array would."""

    parts: list[np.ndarray]


class CpuExecutor(Executor):
    """A pinned core group running its model with a CPU backend (``executors.cpu_backends``): one
    program per variant, built on the group's pinned thread and kept.

    With an asynchronous program (OpenVINO) ``run_ahead`` queues the part the actor announces behind
    the current one before waiting for it, as the GPU executor does: the program's streams start on it
    as the current part's last pieces finish, and keep running while the actor returns this part's
    outputs and takes the next call."""

    _ahead: dict[tuple[int, int], _Launched]
    _free_at = 0.0  # when the last collected unit finished: a unit queued behind it is charged from then

    def load(self, workload: Workload) -> None:
        self.workload = workload
        self._source = ModelSource(self.model_spec)
        self._programs: dict[tuple, CpuProgram] = {}
        self._ahead = {}
        self._activate()

    def _drop_ahead(self) -> None:
        for launched in self._ahead.values():
            launched.program.drop(launched.handle)
        self._ahead = {}

    def _activate(self) -> None:
        """Builds (or finds) the program of the current spec and warms it up."""
        assert self.workload is not None
        self._drop_ahead()
        check_backend("cpu", self.spec.backend, self.spec.precision, self.spec.name)
        pin_thread(self.spec.cores, yields=True)
        backend = cpu_backend(self.spec.backend)
        key = backend.variant_key(self.spec)
        self.compile_s = 0.0
        if key not in self._programs:
            if self._programs and memory_available_share() < KEEP_VARIANTS_MIN_AVAILABLE:
                self._programs.clear()  # the kept variants go before another is built
                self.program = None
                gc.collect()
            self._programs[key] = backend.build(self._source, self.spec, self.workload.shape)
            self.compile_s = self._programs[key].compile_s
        self.program = self._programs[key]
        # warm-up: first-call costs (a converted backend's at the full batch: after a warm-up of 8, vgg16's
        # first batch of 16 through ONNX Runtime cost a 32-image trial a fifth of its figure)
        self.run(0, min(self.spec.batch, self.workload.images, self.spec.batch if backend.warm_full_batch else 8))
        extra = self.program.warm_images(self.spec.max_unit_images)
        if extra > self.spec.batch:  # the piece sizes of a full call (OpenVINO's dynamic batch)
            self.run(0, min(extra, self.workload.images))

    def reconfigure(self) -> None:
        self._activate()

    def release(self) -> None:
        """Every built program dropped (their converted models stay cached on disk); ``configure``
        builds the current one again."""
        self._drop_ahead()
        self._programs.clear()
        self.program = None
        let_go()  # a program frozen by an earlier settle goes at the next one
        gc.collect()

    def configure(self, params: dict[str, Any]) -> bool:
        changed = super().configure(params)
        if self.workload is not None and getattr(self, "program", None) is None:
            # released, or a build failed after the kept variants were dropped: built now, or fails again
            self._activate()
            return True
        return changed

    def set_workload(self, workload: Workload) -> None:
        self._drop_ahead()  # parts announced on the old images
        super().set_workload(workload)

    takes_pixels = True  # uint8 pixels scaled on the group's own thread and cores (``_inputs``)
    runs_staged = True

    def _inputs(self, rows: np.ndarray) -> np.ndarray:
        """The model's float32 inputs: ``rows`` as they are, or uint8 pixels scaled here by ``pixel_scale``
        (one multiply-add on this thread's intra-op team: the group's cores, not the caller's)."""
        if rows.dtype != np.uint8:
            return rows
        if self.pixel_scale is None:
            raise UserError(f"executor {self.spec.name} got uint8 pixels without a pixel scale (mean, std); "
                            "pass float32 model inputs")
        a, b = (torch.from_numpy(f) for f in self.pixel_scale.factors())
        out = torch.empty(rows.shape, dtype=torch.float32)
        torch.mul(torch.from_numpy(np.ascontiguousarray(rows)), a, out=out).add_(b)
        return out.numpy()

    def _start(self, start: int, size: int) -> _Launched:
        assert self.workload is not None
        return self._start_rows(self.workload.rows(start, size))

    def _start_rows(self, rows: np.ndarray) -> _Launched:
        pin_thread(self.spec.cores, yields=True)
        t0 = time.perf_counter()
        return _Launched(self.program, self.program.launch(self._inputs(rows), self.spec.batch), t0)

    def stage_piece(self, parts: list[np.ndarray]) -> Any:
        """A lane's piece: a synchronous program runs the parts where they lie when each but the last is
        whole batches; otherwise (or for an asynchronous program) they are joined as ``stage`` joins them.
        Joining a float32 stream's pieces took 5-6% of the 2-core box's CPU time from two 1-core groups
        (docs/why.md, executors/cpu.py)."""
        batch = self.spec.batch
        if len(parts) > 1 and not self.program.asynchronous and all(len(p) % batch == 0 for p in parts[:-1]):
            return _PieceParts(parts)
        return self.stage(parts)

    def launch_staged(self, staged: Any, start: int, count: int) -> Any:
        """A stream lane's piece (its parts as they lie, or the joined rows ``stage`` made): started on
        an asynchronous program, run now on a synchronous one."""
        if isinstance(staged, _PieceParts):
            results = [self._run_rows(part) for part in staged.parts if len(part)]
            return UnitResult(np.concatenate([r.outputs for r in results]), sum(r.compute_s for r in results))
        rows = np.asarray(staged)[:count]
        if self.program.asynchronous:
            return self._start_rows(rows)
        return self._run_rows(rows)

    def _run_rows(self, rows: np.ndarray) -> UnitResult:
        pin_thread(self.spec.cores, yields=True)
        t0 = time.perf_counter()
        outputs = self.program.run(self._inputs(rows), self.spec.batch)
        return UnitResult(outputs, time.perf_counter() - t0)

    def launch(self, start: int, size: int) -> Any:
        """An asynchronous program's unit started (collected by ``collect``); a synchronous one's run now."""
        return self._start(start, size) if self.program.asynchronous else self.run(start, size)

    def collect(self, handle: Any) -> UnitResult:
        """Waits for a launched unit; ``compute_s`` counts from its launch or, for a unit queued behind
        another, from that one's end (wall time on the group, each second charged to one unit)."""
        if isinstance(handle, UnitResult):  # a synchronous program's unit, already run
            return handle
        outputs = handle.program.collect(handle.handle)
        now = time.perf_counter()
        compute_s = now - max(handle.launched, self._free_at)
        self._free_at = now
        return UnitResult(outputs, compute_s)

    def ready(self, handle: Any) -> bool:
        """A synchronous unit is; an asynchronous one once its pieces are done (pieces still waiting for
        a request start only in ``collect``)."""
        return isinstance(handle, UnitResult) or handle.handle.done.is_set()

    def drain(self) -> None:
        self._drop_ahead()
        if getattr(self, "program", None) is not None:
            self.program.drain()

    def run(self, start: int, size: int) -> UnitResult:
        if self.program.asynchronous:
            self._drop_ahead()  # a part announced by an earlier caller: its pieces would run first
            return self.collect(self._start(start, size))
        assert self.workload is not None
        return self._run_rows(self.workload.rows(start, size))

    def run_ahead(self, start: int, size: int, following: tuple[int, int] | None) -> UnitResult:
        """Runs [start, start+size), already queued where the previous call announced it, and with an
        asynchronous program queues ``following`` behind it before waiting (a synchronous one would run
        it before returning this unit: it only runs this one)."""
        if not self.program.asynchronous:
            self._drop_ahead()
            return super().run_ahead(start, size, following)
        if size >= self.spec.batch:
            self.warm_units.add(self.standalone_unit())
        handle = self._ahead.pop((start, size), None)
        self._drop_ahead()  # an announced part that was not asked for: its pieces not yet started never start
        if handle is None:
            handle = self._start(start, size)
        if following is not None:
            self._ahead[following] = self._start(*following)
        return self.collect(handle)

    def standalone_unit(self) -> int:
        """One batch; a program with a batch per request (OpenVINO's streams) gets calls of half its
        requests' batches, at most a pool part: two calls in flight, as the pool sends them, keep every
        request busy (a batch a call would leave 13 of 15 streams idle)."""
        program = getattr(self, "program", None)
        fill = program.fill_images(self.spec.batch) if program is not None else self.spec.batch
        half = -(-fill // (2 * self.spec.batch)) * self.spec.batch
        return max(self.spec.batch, min(self.spec.max_unit_images, half))

    def describe(self) -> dict[str, Any]:
        program = getattr(self, "program", None)
        return {**super().describe(), **(program.describe() if program is not None else {})}
