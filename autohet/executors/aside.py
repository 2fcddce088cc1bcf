"""An executor's setting set up in a child process, beside whatever the executor's own process does.

A tune on several GPUs compiles the settings its first points will need on an idle GPU (``autohet.tuning.ahead``).
One process compiles one program at a time (dynamo's compiles take a global lock), and efficientnet_b0's
inductor b256 and b512 compiled cold one after the other on the idle GPU took 25-31 s each: the walk's b512
single waited 39 s (BENCHMARKS.md 42). A child of the idle GPU's actor, on the same GPU (it inherits the actor's
``CUDA_VISIBLE_DEVICES``), sets up a second setting the way the executor would (``make_executor`` and ``load``:
the same graph, so the same entries of the compile cache every executor shares), its compiles on the cores it
is given (its executor's own warm-up runs from that executor's feeding core, as in the actor), while the actor
compiles the first. The child holds nothing afterwards: the executor that needs the setting sets it up from
the cache. It ends when its parent does, and leaves no file behind.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autohet.core.models import ModelSpec
    from autohet.executors.base import ExecutorSpec

__all__ = ["Aside", "start_aside"]

# Run by the child before anything heavy is imported: it ends with the process that started it (whose pid is
# its first argument), then reads its arguments from stdin and sets the setting up (``main``).
_BOOT = """
import os, sys, threading, time
parent = int(sys.argv[1])
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(3)
if os.getppid() != parent:
    os._exit(3)
threading.Thread(target=watch, daemon=True).start()
from autohet.executors.aside import main
main(sys.stdin.buffer.read())
"""


class Aside:
    """A setting being set up in a child process (``start_aside``)."""

    def __init__(self, proc: subprocess.Popen, out: IO[bytes], err: IO[bytes]) -> None:
        self.proc = proc
        self.out = out  # anonymous files: gone with the last process holding them
        self.err = err

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Blocks until the child ends; what it reports (``compile_s``, ``cores``, ``set_up_s``, ``ended_at``).
        A failed set-up raises with the child's last line: the executor that needs the setting then meets
        the failure as its own."""
        code = self.proc.wait(timeout)
        if code != 0:
            self.err.seek(0)
            lines = [line for line in self.err.read().decode(errors="replace").splitlines() if line.strip()]
            raise RuntimeError(f"setting up aside failed (exit {code}): {lines[-1] if lines else 'no output'}")
        self.out.seek(0)
        lines = [line for line in self.out.read().decode(errors="replace").splitlines() if line.strip()]
        return json.loads(lines[-1])  # the report is the child's last line, whatever it printed before

    def end(self) -> None:
        """Ends the child, if it still runs (its executor is ending, or starts another)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_aside(spec: ExecutorSpec, model: ModelSpec, shape: tuple[int, ...], cores: frozenset[int]) -> Aside:
    """Starts a child that sets ``spec`` up for images of ``shape``, compiling on ``cores``; returns at once."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (the Aside holds them)
    proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(os.getpid())], stdin=subprocess.PIPE, stdout=out,
                            stderr=err)
    assert proc.stdin is not None
    try:
        proc.stdin.write(pickle.dumps((spec, model, tuple(shape), sorted(cores))))
        proc.stdin.close()
    except BrokenPipeError:  # the child ended at once: ``wait`` reports why
        pass
    return Aside(proc, out, err)


def main(arguments: bytes) -> None:
    spec, model, shape, cores = pickle.loads(arguments)
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    given = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    import numpy as np

    from autohet.core.workload import Workload
    from autohet.executors import make_executor
    from autohet.executors.compiled import compiling_on

    start = time.perf_counter()
    executor = make_executor(spec, model)
    with compiling_on(frozenset(cores)):
        executor.load(Workload(np.zeros((1, *shape), dtype=np.float32), 1))
    print(json.dumps({"compile_s": float(getattr(executor, "compile_s", 0.0) or 0.0), "cores": given,
                      "set_up_s": time.perf_counter() - start, "ended_at": time.time()}))
    sys.stdout.flush()
