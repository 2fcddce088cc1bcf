"""MetaSchedule tuning of blocks, the parent side: what the caller runs; the tuning itself happens in a
child process (``_tune_child``) so that a TVM crash cannot take down the caller.

The parent imports each block to Relax, saves the IRModules as JSON in the tuning directory and hands
the job to a child process (``python -m autohet.block_runners.tvm._tune_child --serve``). The child extracts the
tuning tasks of all blocks, merges tasks shared between blocks (resnet's repeated convolutions are
tuned once), and runs ``meta_schedule.tune_tasks`` with the trial budget into a JSON database in
``runs/tvm/<model>/<target-key>/``, which later runs reuse: blocks already tuned are skipped and
compilation applies the database. ``trials`` is the total number of measured candidates over all
tasks of the job, split evenly between tasks (``max_trials_per_task = ceil(trials / tasks)``).
Only convolution, matmul/dense and pooling tasks are tuned; the rest keep default schedules.

A ``TuneSession`` keeps one child for several jobs (one per model, say): its imports (slow for
``tvm.s_tir.tensor_intrin``: docs/why.md, block_runners/tvm) and the builder's worker processes are
paid for once. ``budget_s`` is a soft limit, in seconds from the call: after it the search proposes
no new candidates, the batch in flight finishes and its records go to the database; ``timeout_s`` is
the hard one, after which the parent kills the child (records already written are kept).

On CUDA the parent first settles how TVM compiles kernels (``ensure_cuda``) and passes that, and the
folders of its CUDA libraries (LD_LIBRARY_PATH), to the child; MetaSchedule's builder and runner
workers get them through ``cuda_worker_init``. The runner times each candidate over >= 20 ms.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from autohet.block_runners.tvm._runner import fused_for_tuning, to_relax, tune_dir, tvm_target
from autohet.block_runners.tvm._toolchain import cuda_child_env, ensure_cuda
from autohet.core.errors import UserError
from autohet.partition import Block

__all__ = ["TuneResult", "TuneSession", "tune_blocks"]



@dataclass
class TuneResult:
    """What one tuning job did: blocks tuned and skipped, unique tasks, records now in the database,
    candidates measured by this job (``trials_done``) and how many of them built and ran (``valid``)."""

    work_dir: Path
    tuned: list[str]
    skipped: list[str]
    tasks: int
    records: int
    seconds: float
    log: Path
    trials_done: int = 0
    valid: int = 0
    timed_out: bool = False
    first_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _manifest(work_dir: Path) -> dict[str, dict]:
    path = work_dir / "tuned.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _repair_jsonl(path: Path) -> None:
    """Drops a last line cut short by a kill, so that TVM can load the database again."""
    if not path.is_file():
        return
    lines = path.read_bytes().splitlines(keepends=True)
    good = []
    for line in lines:
        try:
            json.loads(line)
            good.append(line if line.endswith(b"\n") else line + b"\n")
        except ValueError:
            continue
    if len(good) != len(lines) or (lines and not lines[-1].endswith(b"\n")):
        path.write_bytes(b"".join(good))


class TuneSession:
    """One tuning child process for ``device`` serving jobs one after the other; use as a context manager."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.target, self.key = tvm_target(device)
        self._proc: subprocess.Popen | None = None
        self._log: Path | None = None
        self._out: IO[bytes] | None = None
        self._jobs = 0
        self._ready: Path | None = None

    def __enter__(self) -> TuneSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, log: Path) -> None:
        env = dict(os.environ)
        if self.target["kind"] == "cuda":
            ensure_cuda(self.target)  # probes the kernel compiler once; the child and its workers inherit it
            env = cuda_child_env()
        env["PYTHONUNBUFFERED"] = "1"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log
        self._out = open(log, "ab")  # noqa: SIM115 - closed in close()
        self._out.write(f"\n=== tuning session {time.strftime('%Y-%m-%d %H:%M:%S')} {self.key}\n".encode())
        self._out.flush()
        self._ready = log.with_name(f"{log.name}.{os.getpid()}.ready")
        self._ready.unlink(missing_ok=True)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "autohet.block_runners.tvm._tune_child", "--serve", json.dumps(self.target),
             str(self._ready)],
            stdin=subprocess.PIPE, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def start(self, log: Path) -> None:
        """Starts the child now, logging to ``log``: it imports TVM and starts its workers while the caller
        prepares the first job. Otherwise the first ``tune`` starts it (log: that job's tune.log)."""
        if self._proc is None or self._proc.poll() is not None:
            self._start(log)

    def wait_ready(self, timeout_s: float) -> bool:
        """Waits until a started child has finished starting (imports, workers), so that it no longer
        competes for the CPU; True if it is ready (or none was started)."""
        end = time.perf_counter() + timeout_s
        while self._proc is not None and self._proc.poll() is None and self._ready is not None:
            if self._ready.is_file():
                return True
            if time.perf_counter() > end:
                return False
            time.sleep(0.2)
        return True

    def kill(self) -> None:
        """Ends the child and its workers at once (they share its process group)."""
        if self._proc is not None:  # also when the child is gone: its workers may be left in the group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None

    def close(self, timeout_s: float = 20.0) -> None:
        """Lets the child finish and exit (killed after ``timeout_s``)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=max(0.01, timeout_s))
            except (OSError, subprocess.TimeoutExpired):
                pass  # still running or gone: kill() below ends it either way
        self.kill()
        if self._ready is not None:
            self._ready.unlink(missing_ok=True)
        if self._out is not None:
            self._out.close()
            self._out = None

    def tune(self, blocks: list[Block], model: str, trials: int = 64, *, retune: bool = False,
             budget_s: float | None = None, timeout_s: float = 1800.0, seed: int = 0, per_iter: int | None = None,
             population: int | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None) -> TuneResult:
        """Tunes the blocks' operators with ``trials`` measured candidates in total. With ``budget_s``,
        no new candidates are proposed once that many seconds have passed since this call (the batch in
        flight still finishes). Past ``timeout_s`` the child is killed: a UserError without a budget,
        else the result so far (``timed_out``). ``per_iter`` caps the candidates measured per task and
        round (default 64): smaller spreads a short budget over more tasks; ``population`` is the
        evolutionary search's population (default 512; 128 makes a round ~3x cheaper to search, which
        counts when the budget is short). ``extra["blocks"]`` maps
        each tuned block to [its tasks with a candidate that ran in this job, its tasks]."""
        if trials < 1:
            raise UserError(f"--trials must be at least 1, got {trials}")
        work_dir = tune_dir(model, self.key)
        work_dir.mkdir(parents=True, exist_ok=True)
        done = _manifest(work_dir)
        todo = [b for b in blocks if retune or b.signature not in done]
        skipped = [b.name for b in blocks if b not in todo]
        log = self._log or work_dir / "tune.log"
        records_file = work_dir / "database_tuning_record.json"
        if not todo:
            return TuneResult(work_dir, [], skipped, 0, _count_lines(records_file), 0.0, log)
        start = time.perf_counter()
        stop_at = None if budget_s is None else time.time() + budget_s  # wall clock, shared with the child
        mod_paths = self._write_modules(todo, work_dir)
        self._jobs += 1
        result_path = work_dir / f"last_job.{os.getpid()}.{self._jobs}.json"
        result_path.unlink(missing_ok=True)
        spec = {"modules": mod_paths, "target": self.target, "work_dir": str(work_dir), "trials": trials,
                "seed": seed, "result": str(result_path), "progress": str(result_path) + ".progress",
                "budget_s": budget_s, "stop_at": stop_at, "per_iter": per_iter, "population": population}
        spec_path = work_dir / "job.json"
        spec_path.write_text(json.dumps(spec, indent=2))
        if self._proc is None or self._proc.poll() is not None:
            self._start(log)
            log = self._log
        try:
            self._proc.stdin.write((str(spec_path) + "\n").encode())
            self._proc.stdin.flush()
        except OSError:
            pass  # the child died: reported below
        result, killed = self._wait(result_path, spec["progress"], start + timeout_s, progress)
        result = self._outcome(result, killed, work_dir, spec["progress"], budget_s, timeout_s, log)
        for leftover in (result_path, Path(spec["progress"])):
            leftover.unlink(missing_ok=True)
        if not result.get("timed_out"):
            for block in todo:
                done[block.signature] = {"block": block.name, "trials": trials, "tasks": result.get("tasks", 0)}
            (work_dir / "tuned.json").write_text(json.dumps(done, indent=2))
        return TuneResult(work_dir, [b.name for b in todo], skipped, int(result.get("tasks", 0)),
                          _count_lines(records_file), time.perf_counter() - start, log,
                          trials_done=int(result.get("trials_done", 0)), valid=int(result.get("valid", 0)),
                          timed_out=bool(result.get("timed_out")), first_error=str(result.get("first_error", "")),
                          extra={**{k: result[k] for k in ("tune_s", "setup_s") if k in result},
                                 "blocks": {b.name: result.get("coverage", {}).get(path, [0, 0])
                                            for b, path in zip(todo, mod_paths, strict=True)}})

    def _write_modules(self, blocks: list[Block], work_dir: Path) -> list[str]:
        """Each block's Relax module, fused as it will be compiled, saved for the child to tune."""
        import tvm

        paths = []
        for block in blocks:
            mod, _ = to_relax(block, block.example_inputs())
            path = work_dir / "mods" / f"{block.signature}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(tvm.ir.save_json(fused_for_tuning(mod, self.target)))
            paths.append(str(path))
        return paths

    def _outcome(self, result: dict[str, Any] | None, killed: bool, work_dir: Path, progress_path: str,
                 budget_s: float | None, timeout_s: float, log: Path) -> dict[str, Any]:
        """The job's result: a killed child's progress so far (its databases repaired) where a budget was
        set, else a UserError; a UserError for a child that died or reported an error."""
        if killed:
            _repair_jsonl(work_dir / "database_tuning_record.json")
            _repair_jsonl(work_dir / "database_workload.json")
            if budget_s is None:
                raise UserError(f"tuning ran past {timeout_s:.0f} s and was stopped; lower --trials (log: {log})")
            result = self._read_progress(progress_path) or {}
            result["timed_out"] = True
        elif result is None:
            rc = self._proc.returncode if self._proc is not None else None
            self.kill()
            raise UserError(f"tuning process failed (exit code {rc}); see {log}")
        if "error" in result:
            lines = [ln for ln in str(result["error"]).splitlines() if ln.strip()]
            raise UserError(f"tuning failed: {lines[-1][:300] if lines else '?'} (log: {log})")
        return result

    @staticmethod
    def _read_progress(path: str) -> dict[str, Any] | None:
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None

    def _wait(self, result_path: Path, progress_path: str, deadline: float,
              progress: Callable[[dict[str, Any]], None] | None) -> tuple[dict[str, Any] | None, bool]:
        """(the child's result or None if it died, whether it was killed at the deadline)."""
        seen = None
        while True:
            if result_path.is_file():
                try:
                    return json.loads(result_path.read_text()), False
                except ValueError:
                    pass  # being written
            if self._proc is None or self._proc.poll() is not None:
                time.sleep(0.2)
                if result_path.is_file():
                    continue
                return None, False
            if time.perf_counter() > deadline:
                self.kill()
                return None, True
            if progress is not None:
                state = self._read_progress(progress_path)
                if state is not None and state != seen:
                    seen = state
                    progress(state)
            time.sleep(0.5)


def tune_blocks(blocks: list[Block], model: str, device: str = "cpu", trials: int = 64, *,
                retune: bool = False, timeout_s: float = 1800.0, seed: int = 0,
                budget_s: float | None = None) -> TuneResult:
    """Tunes the blocks' operators for ``device`` with ``trials`` measured candidates in total (one job
    in its own child process; see ``TuneSession.tune``)."""
    with TuneSession(device) as session:
        return session.tune(blocks, model, trials, retune=retune, budget_s=budget_s, timeout_s=timeout_s,
                            seed=seed)
