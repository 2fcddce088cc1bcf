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

A child started cold spent 12-16 s on top of its compile (BENCHMARKS.md 46: a Python process, torch's and
inductor's imports, beside the other compile), and the first GPU's singles wait for it. So a tune's GPU actors
keep one child on standby (``spawn_aside``, from the end of the calibration): it has made its imports on the
cores it was given and waits for its setting (``Aside.give``).
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

__all__ = ["Aside", "spawn_aside", "start_aside"]

# Run by the child before anything heavy is imported: it ends with the process that started it (whose pid is
# its first argument); on the cores its second argument names (comma-separated; empty: as it is), it makes the
# set-up's imports, then reads its arguments from stdin and sets the setting up (``main``).
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
from autohet.executors.aside import main, warm_up
warm_up(sys.argv[2] if len(sys.argv) > 2 else "")
main(sys.stdin.buffer.read())
"""


class Aside:
    """A child process that sets a setting up: on standby until given one (``spawn_aside``, ``give``), or given
    it at its start (``start_aside``)."""

    def __init__(self, proc: subprocess.Popen, out: IO[bytes], err: IO[bytes]) -> None:
        self.proc = proc
        self.out = out  # anonymous files: gone with the last process holding them
        self.err = err
        self.given = False

    def give(self, spec: ExecutorSpec, model: ModelSpec, shape: tuple[int, ...], cores: frozenset[int]) -> None:
        """Has the child set ``spec`` up for images of ``shape``, compiling on ``cores``; returns at once."""
        assert self.proc.stdin is not None and not self.given, "a child sets one setting up"
        self.given = True
        try:
            self.proc.stdin.write(pickle.dumps((spec, model, tuple(shape), sorted(cores))))
            self.proc.stdin.close()
        except BrokenPipeError:  # the child ended at once: ``wait`` reports why
            pass

    @property
    def waiting(self) -> bool:
        """On standby: alive and given nothing yet."""
        return not self.given and self.proc.poll() is None

    def warmed(self) -> bool:
        """Whether the child has made its imports (``warm_up``'s line on its output). Read without moving the
        offset the child writes at: the file is one the two processes share."""
        return _WARMED.encode() in os.pread(self.out.fileno(), 1 << 16, 0)

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


def spawn_aside(cores: frozenset[int] = frozenset()) -> Aside:
    """A child on standby: it makes the set-up's imports on ``cores`` (``warm_up``), then waits to be given a
    setting (``Aside.give``)."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (the Aside holds them)
    proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(os.getpid()), ",".join(map(str, sorted(cores)))],
                            stdin=subprocess.PIPE, stdout=out, stderr=err)
    return Aside(proc, out, err)


def start_aside(spec: ExecutorSpec, model: ModelSpec, shape: tuple[int, ...], cores: frozenset[int]) -> Aside:
    """Starts a child that sets ``spec`` up for images of ``shape``, compiling on ``cores``; returns at once."""
    aside = spawn_aside()
    aside.give(spec, model, shape, cores)
    return aside


_WARMED = '{"warmed": true}'
_warmed_at: float | None = None  # when ``warm_up`` ended (perf_counter)


def warm_up(cores: str) -> None:
    """What every set-up imports, made before the setting is known: on ``cores`` where given (else the
    parent's), so that a standby child's imports leave the feeding core of the GPU it stands beside alone.
    No CUDA context yet: a GPU trial may be measured on this GPU meanwhile. Says so on a line of its own."""
    global _warmed_at
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, [int(c) for c in cores.split(",")])
    import numpy  # noqa: F401
    import torch

    import autohet.executors  # noqa: F401
    import autohet.executors.compiled  # noqa: F401
    import autohet.executors.gpu  # noqa: F401

    if torch.cuda.is_available():  # inductor's own modules: seconds of a first compile (BENCHMARKS.md 44)
        import torch._inductor.compile_fx  # noqa: F401
    print(_WARMED, flush=True)
    _warmed_at = time.perf_counter()


def main(arguments: bytes) -> None:
    """Sets the setting up and reports on its last line: its compile's seconds, its cores, its set-up's
    seconds, when it ended, and how long it had stood by with its imports made (``standby_s``: 0 where it was
    given its setting before)."""
    standby_s = 0.0 if _warmed_at is None else time.perf_counter() - _warmed_at
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
                      "set_up_s": time.perf_counter() - start, "ended_at": time.time(), "standby_s": standby_s}))
    sys.stdout.flush()
