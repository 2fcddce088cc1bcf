"""MetaSchedule tuning of blocks, in a child process so a TVM crash cannot take down the caller.

The parent imports each block to Relax, saves the IRModules as JSON in the tuning directory and hands
the job to a child process (``python -m autohet.backends._tvm_tune --serve``). The child extracts the
tuning tasks of all blocks, merges tasks shared between blocks (resnet's repeated convolutions are
tuned once), and runs ``meta_schedule.tune_tasks`` with the trial budget into a JSON database in
``runs/tvm/<model>/<target-key>/``, which later runs reuse: blocks already tuned are skipped and
compilation applies the database. ``trials`` is the total number of measured candidates over all
tasks of the job, split evenly between tasks (``max_trials_per_task = ceil(trials / tasks)``).
Only convolution, matmul/dense and pooling tasks are tuned; the rest keep default schedules.

A ``TuneSession`` keeps one child for several jobs (one per model, say): its imports (~15-30 s for
``tvm.s_tir.tensor_intrin``) and the builder's worker processes are paid for once. ``budget_s`` is a
soft limit, in seconds from the call: after it the search proposes no new candidates, the batch in
flight finishes and its records go to the database; ``timeout_s`` is the hard one, after which the
parent kills the child (records already written are kept).

On CUDA the parent first settles how TVM compiles kernels (``ensure_cuda``) and passes that, and the
folders of its CUDA libraries (LD_LIBRARY_PATH), to the child; MetaSchedule's builder and runner
workers get them through ``cuda_worker_init``. The runner times each candidate over >= 20 ms.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from autohet.backends._tvm import cuda_child_env, ensure_cuda, fused_for_tuning, to_relax, tune_dir, tvm_target
from autohet.errors import UserError
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
            [sys.executable, "-m", "autohet.backends._tvm_tune", "--serve", json.dumps(self.target), str(self._ready)],
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
        import tvm

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
        mod_paths = []
        for block in todo:
            mod, _ = to_relax(block, block.example_inputs())
            path = work_dir / "mods" / f"{block.signature}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(tvm.ir.save_json(fused_for_tuning(mod, self.target)))
            mod_paths.append(str(path))
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
        if killed:
            _repair_jsonl(records_file)
            _repair_jsonl(work_dir / "database_workload.json")
            if budget_s is None:
                raise UserError(f"tuning ran past {timeout_s:.0f} s and was stopped; lower --trials (log: {log})")
            result = self._read_progress(spec["progress"]) or {}
            result["timed_out"] = True
        elif result is None:
            rc = self._proc.returncode if self._proc is not None else None
            self.kill()
            raise UserError(f"tuning process failed (exit code {rc}); see {log}")
        if "error" in result:
            lines = [ln for ln in str(result["error"]).splitlines() if ln.strip()]
            raise UserError(f"tuning failed: {lines[-1][:300] if lines else '?'} (log: {log})")
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


# ------------------------------------------------------------------------------------------------
# The child process
# ------------------------------------------------------------------------------------------------

_TUNED_OPS = ("conv", "matmul", "dense", "pool")
_POOLS: dict[tuple, Any] = {}


def _keep_builder_workers() -> None:
    """LocalBuilder restarts its worker processes for every batch, and each new worker spends ~16 s
    importing ``tvm.s_tir.tensor_intrin`` on a 2-core machine, which dwarfs the builds. In this
    child process only, the builder's pool is created once and kept."""
    from tvm.s_tir.meta_schedule.builder import local_builder

    real = local_builder.PopenPoolExecutor

    class KeptPool:
        def __init__(self, max_workers: int, timeout: float | None = None, initializer=None) -> None:  # noqa: ANN001
            key = (max_workers, timeout)
            if key not in _POOLS:
                _POOLS[key] = real(max_workers=max_workers, timeout=timeout, initializer=initializer)
            self.pool = _POOLS[key]

        def map_with_error_catching(self, fn, iterator):  # noqa: ANN001, ANN202
            return self.pool.map_with_error_catching(fn, iterator)

        def submit(self, fn, *args):  # noqa: ANN001, ANN202
            return self.pool.submit(fn, *args)

        def shutdown(self) -> None:
            """Kept for the next batch; the process exit ends the workers."""

    local_builder.PopenPoolExecutor = KeptPool


def _deadline_strategy(deadline: list[float | None], population: int | None = None) -> Any:
    """MetaSchedule's evolutionary search, except that it proposes no more candidates once
    ``deadline[0]`` (a monotonic time) has passed: the task scheduler then ends each task cleanly,
    measured candidates still go to the database, and ``tune_tasks`` returns."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy, SearchStrategy

    @derived_object
    class Deadline(PySearchStrategy):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def _initialize_with_tune_context(self, context: Any) -> None:
            _ffi_api.SearchStrategyInitializeWithTuneContext(self.inner, context)

        def pre_tuning(self, *args: Any) -> None:  # the arguments differ between TVM versions
            _ffi_api.SearchStrategyPreTuning(self.inner, *args)

        def post_tuning(self) -> None:
            _ffi_api.SearchStrategyPostTuning(self.inner)

        def generate_measure_candidates(self) -> Any:
            if deadline[0] is not None and time.monotonic() > deadline[0]:
                deadline.append("passed")
                return None
            return _ffi_api.SearchStrategyGenerateMeasureCandidates(self.inner)

        def notify_runner_results(self, *args: Any) -> None:
            _ffi_api.SearchStrategyNotifyRunnerResults(self.inner, *args)

        def clone(self) -> Any:
            return Deadline(_ffi_api.SearchStrategyClone(self.inner))

    options = {} if not population else {"population_size": int(population),
                                          "init_min_unmeasured": min(50, int(population))}
    return Deadline(SearchStrategy.create("evolutionary", **options))


def _watch(progress: Path, start: float) -> Any:
    """A measure callback that counts candidates, keeps the first error and writes progress."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class Watch(PyMeasureCallback):
        def __init__(self) -> None:
            super().__init__()
            self.state = {"trials_done": 0, "valid": 0, "first_error": ""}
            self.ran_tasks: set[int] = set()

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):  # noqa: ANN001
            state = self.state
            for built, ran in zip(builder_results, runner_results, strict=False):
                state["trials_done"] += 1
                error = built.error_msg or ran.error_msg
                secs = [float(getattr(s, "value", s)) for s in (ran.run_secs or [])]
                if error is None and secs and max(secs) < 1e9:
                    state["valid"] += 1
                    self.ran_tasks.add(int(task_id))
                elif not state["first_error"]:
                    state["first_error"] = str(error or "no run time")[:4000]
            state["tune_s"] = round(time.monotonic() - start, 1)
            print(f"[{state['tune_s']:.0f} s] task {task_id}: {state['trials_done']} candidates measured, "
                  f"{state['valid']} ran", flush=True)
            tmp = Path(str(progress) + ".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(progress)

    return Watch()


def _run_job(spec: dict[str, Any], builder: Any, runner: Any) -> dict[str, Any]:
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    start = time.monotonic()
    budget, stop_at = spec.get("budget_s"), spec.get("stop_at")
    target = tvm.target.Target(spec["target"])
    merged: dict[int, object] = {}
    weights: dict[int, float] = {}
    owners: dict[str, set[int]] = {}  # module path -> the hashes of its tuned tasks
    for path in spec["modules"]:
        mod = tvm.ir.load_json(Path(path).read_text())
        owners[path] = set()
        for task in ms.relax_integration.extract_tasks(mod, target):
            if not any(op in task.task_name for op in _TUNED_OPS):
                continue  # reshapes and transposes: default schedules are fine, trials go to real work
            h = tvm_ffi.structural_hash(task.dispatched[0])
            merged.setdefault(h, task)
            weights[h] = weights.get(h, 0.0) + float(task.weight)
            owners[path].add(h)
    tasks = list(merged.values())
    if not tasks:
        return {"tasks": 0, "trials_done": 0, "valid": 0, "timed_out": False, "first_error": "",
                "coverage": {path: [0, 0] for path in owners}}
    deadline: list[Any] = [None if stop_at is None else time.monotonic() + float(stop_at) - time.time()]
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, spec["work_dir"], strategy=_deadline_strategy(deadline, spec.get("population")), seed=spec["seed"])
    task_weights = [weights[h] for h in merged]
    per_task = max(1, math.ceil(spec["trials"] / max(1, len(contexts))))
    per_iter = min(int(spec.get("per_iter") or 64), per_task)
    setup_s = time.monotonic() - start
    watch = _watch(Path(spec["progress"]), start)
    print(f"tuning {len(contexts)} tasks, {spec['trials']} trials total, {per_task} per task"
          + (f", budget {float(budget):.0f} s" if budget is not None else "")
          + f" (set up in {setup_s:.1f} s)", flush=True)
    ms.tune_tasks(
        tasks=contexts, task_weights=task_weights, work_dir=spec["work_dir"],
        max_trials_global=spec["trials"], max_trials_per_task=per_task,
        num_trials_per_iter=per_iter, builder=builder, runner=runner,
        measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), watch],
    )
    timed_out = len(deadline) > 1
    if timed_out:
        print(f"budget of {float(budget):.0f} s reached; the tasks' searches were ended, records kept", flush=True)
    hashes = list(merged)  # task_id order: extracted_tasks_to_tune_contexts keeps the order (none are skipped)
    ran = {hashes[i] for i in watch.ran_tasks if len(contexts) == len(hashes)}
    coverage = {path: [len(hs & ran), len(hs)] for path, hs in owners.items()}
    return {"tasks": len(contexts), **watch.state, "timed_out": timed_out, "setup_s": round(setup_s, 1),
            "tune_s": round(time.monotonic() - start, 1), "coverage": coverage}


def _make_builder_runner(target: dict[str, Any]) -> tuple[Any, Any]:
    """MetaSchedule's local builder and runner. The builder's workers start at once and import
    tensor_intrin while this process does too (one worker on a machine of fewer than 4 cores, where
    builds take ~0.02 s and a second import would only compete); on CUDA both builder and runner
    workers get the parent's kernel compiler and runtime."""
    from tvm.s_tir import meta_schedule as ms

    from autohet.backends._tvm import cuda_worker_init, export_so, warm_worker

    _keep_builder_workers()
    cores = os.cpu_count() or 1
    workers = cores if cores >= 4 else 1
    if target["kind"] != "cuda":
        builder = ms.builder.LocalBuilder(max_workers=workers, timeout_sec=120.0)
        runner = "local"
    else:
        ensure_cuda(target)  # mode from the parent's environment: no probing here
        builder = ms.builder.LocalBuilder(max_workers=workers, timeout_sec=120.0, initializer=cuda_worker_init,
                                          f_export=export_so)
        runner = ms.runner.LocalRunner(
            timeout_sec=30.0, initializer=cuda_worker_init,
            evaluator_config=ms.runner.EvaluatorConfig(number=10, repeat=1, min_repeat_ms=20))
    for pool in _POOLS.values():
        for _ in range(workers):
            pool.submit(warm_worker)
    return builder, runner


def _write_result(path: str, result: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


def _serve(target: dict[str, Any], ready: str) -> None:
    """Reads job spec paths from stdin, one per line, and runs them in turn until stdin closes; touches
    ``ready`` once set up."""
    start = time.monotonic()
    builder, runner = _make_builder_runner(target)
    import tvm.s_tir.tensor_intrin  # noqa: F401 - every job needs it; imported while the workers do too

    print(f"tuning child ready in {time.monotonic() - start:.1f} s", flush=True)
    Path(ready).touch()
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(Path(line.strip()).read_text())
        try:
            result = _run_job(spec, builder, runner)
        except Exception as err:  # noqa: BLE001 - reported to the parent; the session stays usable
            traceback.print_exc()
            sys.stdout.flush()
            result = {"error": f"{type(err).__name__}: {err}"[-3000:]}
        _write_result(spec["result"], result)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve(json.loads(sys.argv[2]), sys.argv[3])
    else:  # one job from a spec file
        job = json.loads(Path(sys.argv[1]).read_text())
        _write_result(job["result"], _run_job(job, *_make_builder_runner(job["target"])))
