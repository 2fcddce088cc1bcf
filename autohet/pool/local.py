"""Executors in this process, each on its own long-lived thread: no Ray."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from autohet.core.models import ModelSpec
from autohet.core.workload import PixelScale, Workload
from autohet.executors import Executor, make_executor
from autohet.platform.gc_control import let_go
from autohet.pool.base import Pool
from autohet.pool.dispatch import Dispatcher, LocalDispatcher
from autohet.pool.worker import Worker

if TYPE_CHECKING:
    from autohet.pool.lanes import Lanes

__all__ = ["LocalPool"]


class LocalPool(Pool):
    """Executors in this process, each on its own long-lived thread: no Ray, for tests and
    in-process baselines. Every executor call runs on its thread (never the caller's)."""

    executors: list[Executor]
    workers: list[Worker]

    def start(self, model: ModelSpec, workload: Workload) -> float:
        if getattr(self, "executors", None) and self.started_for == (model, workload.images):
            return 0.0
        self.shutdown()
        self.executors = [make_executor(s, model) for s in self.spec.executors]
        for members in self.spec.partition_groups():  # partitions of one GPU: disjoint SMs of this process
            from autohet.executors.green import sm_partitions

            specs = [self.spec.executors[i] for i in members]
            for i, part in zip(members, sm_partitions(specs[0].gpu or 0, [e.sms for e in specs]), strict=True):
                self.executors[i].stream_override = part.stream
        self.workers = [Worker(s.name) for s in self.spec.executors]
        # GPU executors load (and capture their CUDA graphs) before the others convert their models: a
        # GPU's graph capture beside an ONNX Runtime group's export (torch.export, on another thread of
        # this process) failed. An executor that compiles (inductor) loads alone: dynamo's tracing patches
        # nn.Module.__call__ for the whole process, and two GPUs compiling at once failed (docs/why.md,
        # pool/local.py)
        for gpu_phase in (True, False):
            phase = [(w, ex) for w, ex, s in zip(self.workers, self.executors, self.spec.executors, strict=True)
                     if s.uses_gpu == gpu_phase]
            for w, ex in phase:
                if ex.spec.compiles:
                    w.call(lambda ex=ex: ex.load(workload))
            loads = [w.submit(lambda ex=ex: ex.load(workload)) for w, ex in phase if not ex.spec.compiles]
            for future in loads:
                future.result()
        self.started_for = (model, workload.images)
        return sum(ex.describe().get("compile_s", 0.0) for ex in self.executors)

    def dispatcher(self) -> Dispatcher:
        return LocalDispatcher(self.executors, self.workers)

    def overlaps_windows(self) -> bool:
        return len(getattr(self, "executors", [])) == 1 and self.executors[0].launches_async

    def stream_windows(self, windows: Iterable[list[np.ndarray]], lock: Any) -> Iterator[np.ndarray]:
        """One asynchronous executor's stream: window k+1 staged (into the GPU's other pinned buffer) while
        window k runs, and queued before k's outputs are collected, so the device never waits for the host at
        a window's end; k+2 is staged once k is collected (it reuses k's buffer). ``lock`` is held while a
        window is handed over and queued: other threads' calls run between windows (docs/why.md, pool/local.py)."""
        from concurrent.futures import ThreadPoolExecutor, wait

        ex, worker = self.executors[0], self.workers[0]
        source = iter(windows)
        stats = self.stream_stats

        def next_staged() -> tuple[Any, int] | None:
            asked = time.perf_counter()
            parts = next(source, None)
            if parts is None:
                return None
            got = time.perf_counter()
            staged = ex.stage(parts)
            stats.wait_s += got - asked
            stats.stage_s += time.perf_counter() - got
            return staged, sum(len(p) for p in parts)

        def queue(staged: Any, images: int) -> Any:
            ex.use_staged(staged)
            return ex.launch(0, images)

        launched: deque[Any] = deque()

        def collected() -> np.ndarray:
            unit = worker.call(lambda h=launched.popleft(): ex.collect(h))
            stats.windows += 1
            stats.images += len(unit.outputs)
            stats.device_s += unit.compute_s
            return unit.outputs

        with ThreadPoolExecutor(1, thread_name_prefix="autohet-stage") as stager:
            try:
                ahead = stager.submit(next_staged)
                while True:
                    # the next window is not here yet: a window the device has finished is handed back
                    # meanwhile (a producer may wait for its outputs before sending more); one still
                    # running is left queued, so a source that keeps up keeps the device busy
                    while launched and not ahead.done():
                        if ex.ready(launched[0]):
                            yield collected()
                        else:
                            wait([ahead], timeout=0.001)
                    if (current := ahead.result()) is None:
                        break
                    with lock:
                        launched.append(worker.call(lambda c=current: queue(*c)))
                    if len(launched) == 2:  # window k-1 collected: its buffer is free for window k+1
                        yield collected()
                    ahead = stager.submit(next_staged)
                while launched:
                    yield collected()
            finally:  # a stream ended early (an error, a close): its windows' copies done before their
                for handle in launched:  # memory is let go (a window may be read in place)
                    with contextlib.suppress(Exception):
                        worker.call(lambda h=handle: ex.collect(h))

    def lanes(self, speeds: list[float | None], alive: list[bool]) -> Lanes | None:
        executors = getattr(self, "executors", [])
        if len(executors) < 2 or not all(ex.runs_staged for ex in executors):
            return None
        from autohet.pool.lanes import Lanes

        return Lanes(executors, self.workers, speeds, alive)

    def accept_pixels(self, scale: PixelScale) -> bool:
        if not self.executors or not all(ex.takes_pixels for ex in self.executors):
            return False
        for ex in self.executors:  # read by the executors' units only, set between calls
            ex.pixel_scale = scale
        return True

    def set_workload(self, workload: Workload) -> list[int]:
        for future in [w.submit(lambda ex=ex: ex.set_workload(workload))
                       for w, ex in zip(self.workers, self.executors, strict=True)]:
            future.result()
        return []

    def stage(self, parts: list[np.ndarray]) -> list[Any]:
        """Each executor's staging of the next call, on the calling thread (the executors' own threads
        may be running the current call); executors that stage the default way share one joined copy."""
        joined: Any = None
        out = []
        for ex in self.executors:
            if type(ex).stage is Executor.stage:
                joined = ex.stage(parts) if joined is None else joined
                out.append(joined)
            else:
                out.append(ex.stage(parts))
        return out

    def use_staged(self, staged: Any) -> list[int]:
        for future in [w.submit(lambda ex=ex, s=s: ex.use_staged(s))
                       for w, ex, s in zip(self.workers, self.executors, staged, strict=True)]:
            future.result()
        return []

    def standalone_ips(self, min_seconds: float = 1.0, max_images: int | None = None,
                       indices: list[int] | None = None) -> list[float]:
        chosen = range(len(self.executors)) if indices is None else indices
        return [self.workers[i].call(lambda i=i: self.executors[i].standalone_ips(min_seconds, max_images))
                for i in chosen]

    def _apply_config(self, indices: list[int]) -> list[dict[str, Any]]:
        out = []
        for i in indices:
            ex, spec = self.executors[i], self.spec.executors[i]
            self.workers[i].call(lambda ex=ex, spec=spec: ex.configure(spec.executor_params()))
            out.append(ex.describe())
        return out

    def shutdown(self) -> None:
        for worker in getattr(self, "workers", []):
            worker.close(wait_s=2.0)
        self.workers, self.executors = [], []
        self.started_for = None
        let_go()  # the executors' models, for the next settle to free


