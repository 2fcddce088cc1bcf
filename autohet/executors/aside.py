"""An executor's setting set up in a child process, beside whatever the executor's own process does.

A tune on several GPUs compiles the settings its first points will need on an idle GPU (``autohet.tuning.ahead``).
One process compiles one program at a time (dynamo's compiles take a global lock), and efficientnet_b0's
inductor b256 and b512 compiled cold one after the other on the idle GPU took 25-31 s each: the walk's b512
single waited 39 s (BENCHMARKS.md 42). A child of the idle GPU's actor, on the same GPU (it inherits the actor's
``CUDA_VISIBLE_DEVICES``) and on the cores it is given, sets up a second setting the way the executor would
(``make_executor`` and ``load``: the same graph, so the same entries of the compile cache every executor shares)
while the actor compiles the first. The child holds nothing afterwards: the executor that needs the setting
sets it up from the cache.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from autohet.core.models import ModelSpec
from autohet.executors.base import ExecutorSpec

__all__ = ["Aside", "start_aside"]


class Aside:
    """A setting being set up in a child process (``start_aside``)."""

    def __init__(self, proc: subprocess.Popen, out: Path, err: Path) -> None:
        self.proc = proc
        self.out = out
        self.err = err

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Blocks until the child ends; what it reports (``compile_s``, ``cores``). A failed set-up raises
        with the child's last line: the executor that needs the setting then meets the failure as its own."""
        try:
            code = self.proc.wait(timeout)
            if code != 0:
                lines = [line for line in self.err.read_text(errors="replace").splitlines() if line.strip()]
                raise RuntimeError(f"setting up aside failed (exit {code}): {lines[-1] if lines else 'no output'}")
            return json.loads(self.out.read_text())
        finally:
            if self.proc.poll() is not None:
                self.out.unlink(missing_ok=True)
                self.err.unlink(missing_ok=True)

    def end(self) -> None:
        """Ends the child, if it still runs (its executor is ending)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.unlink(missing_ok=True)
        self.err.unlink(missing_ok=True)


def start_aside(spec: ExecutorSpec, model: ModelSpec, shape: tuple[int, ...], cores: frozenset[int]) -> Aside:
    """Starts a child that sets ``spec`` up for images of ``shape`` on ``cores``; returns at once."""
    fd, arg = tempfile.mkstemp(prefix="autohet-aside-", suffix=".pkl")
    with os.fdopen(fd, "wb") as f:
        pickle.dump((spec, model, tuple(shape), sorted(cores)), f)
    out = Path(arg).with_suffix(".json")
    err = Path(arg).with_suffix(".err")
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "autohet.executors.aside", arg], stdout=stdout, stderr=stderr)
    return Aside(proc, out, err)


def _exit_with(parent: int) -> None:
    """Ends this process when ``parent`` does (its actor ended: nobody waits for the setting)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def main(arg: str) -> None:
    _exit_with(os.getppid())
    path = Path(arg)
    spec, model, shape, cores = pickle.loads(path.read_bytes())
    path.unlink(missing_ok=True)
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    import numpy as np

    from autohet.core.workload import Workload
    from autohet.executors import make_executor
    from autohet.executors.compiled import compiling_on

    executor = make_executor(spec, model)
    with compiling_on(frozenset(cores)):
        executor.load(Workload(np.zeros((1, *shape), dtype=np.float32), 1))
    print(json.dumps({"compile_s": float(getattr(executor, "compile_s", 0.0) or 0.0),
                      "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []}))


if __name__ == "__main__":
    main(sys.argv[1])
