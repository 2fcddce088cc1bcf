"""Where a bench's threads spend their time: every thread's Python stack sampled at a fixed interval.

A profiler inside the process, for machines where py-spy cannot attach (no ptrace): each sample counts
the innermost frames of every thread, grouped by thread name (a pool's numbered threads as one), so a
stream's lanes show whether they wait on the device, on a lock, or run Python.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter, defaultdict
from types import FrameType, TracebackType

__all__ = ["StackSampler"]


def _where(frame: FrameType | None, depth: int) -> str:
    out = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        out.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(out)


def _group(name: str) -> str:
    """A thread's group: its name without a pool's trailing number (``autohet-copy_3``: ``autohet-copy``)."""
    return re.sub(r"[_-]\d+$", "", name)


def _allowed(native_id: int | None) -> str:
    """The cores a thread may run on (Linux), as the kernel lists them."""
    try:
        with open(f"/proc/self/task/{native_id}/status") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list"))
    except (OSError, StopIteration):
        return "?"


class StackSampler:
    """``with StackSampler() as s: ...`` then ``s.report()``: per thread group, its most seen stacks
    (innermost ``depth`` frames) and their share of the samples."""

    def __init__(self, interval_s: float = 0.005, depth: int = 4) -> None:
        self.interval_s, self.depth = interval_s, depth
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)
        self.cores: dict[str, set[str]] = defaultdict(set)  # each group's threads' allowed cores
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-stack-sampler")

    def _loop(self) -> None:
        me = threading.get_ident()
        for t in threading.enumerate():
            self.cores[_group(t.name)].add(_allowed(t.native_id))
        while not self._stop.wait(self.interval_s):
            names = {t.ident: _group(t.name) for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    self.counts[names.get(ident, "?")][_where(frame, self.depth)] += 1
            self.samples += 1

    def __enter__(self) -> StackSampler:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self._started

    def report(self, top: int = 4) -> list[str]:
        """Lines: each thread group's samples and its ``top`` stacks with their shares of them."""
        lines = [f"stacks: {self.samples} samples over {self.seconds:.1f} s (every {self.interval_s * 1e3:.0f} ms "
                 "asked; fewer where the interpreter lock was held)"]
        for name, counter in sorted(self.counts.items()):
            total = sum(counter.values())
            lines.append(f"  {name}: {total} samples, cores {' | '.join(sorted(self.cores.get(name, {'?'})))}")
            lines += [f"    {n / total:6.1%}  {stack}" for stack, n in counter.most_common(top)]
        return lines
